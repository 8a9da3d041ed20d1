//! Trees shaped by a user to hurt a root run.
//!
//! Deep: a user nests directories deeper than PATH_MAX (4096 bytes of path): a
//! path that long is refused whole by `openat2` (`ENAMETOOLONG`), which the
//! first builds counted as an open error every night (exit status 1 forever,
//! the copies never shared). Files there are hashed, shared and measured
//! like any other, still opened without following a symlink on the way;
//! below 64 KiB of path the crawl stops (`too_deep`), so a tree nested a
//! million levels deep costs neither quadratic time nor memory.
//!
//! Wide: a directory of many thousands of subdirectories is listed a few
//! thousand at a time (`walk::MAX_SUBDIRS`), the rest resumed from its
//! directory offset once those are read: every entry is still found
//! exactly once (1,000,000 empty subdirectories: 129 MB of crawl before,
//! 37 MB now, measured by hand; here the correctness at 10,000).
//!
//! The test reaches the deep files itself one name at a time (`openat`): a
//! path that long cannot be opened whole by the test either.

mod common;

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use common::*;
use dedupscan::corpus::Rng;
use rustix::fs::{Mode, OFlags};

/// 250 levels of 20-byte names: 5,250 bytes of path.
const LEVELS: usize = 250;
const NAME: &str = "nested-a-long-way-dn";

/// What must not change about a file (bytes, size, mode, mtime), read
/// through its descriptor.
fn state(f: &File) -> (Vec<u8>, u64, u32, i64, i64) {
    let m = f.metadata().unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut &*f, &mut bytes).unwrap();
    (bytes, m.len(), m.mode(), m.mtime(), m.mtime_nsec())
}

fn physical(f: &File, len: u64) -> Vec<Option<u64>> {
    let ext = dedupscan::sys::fiemap(f.as_fd(), 0, len).unwrap();
    dedupscan::sys::fiemap::physical_map(&ext, 0, len, 4096)
}

fn open_at(dir: &OwnedFd, name: &str) -> File {
    File::from(rustix::fs::openat(dir, name, OFlags::RDONLY | OFlags::NOFOLLOW, Mode::empty()).unwrap())
}

fn deep_files_are_shared(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let t = vol.path("t");
    std::fs::create_dir(&t).unwrap();
    let payload = Rng::new(5).bytes(512 * 1024);
    std::fs::write(t.join("top.bin"), &payload).unwrap();
    let mut dir = rustix::fs::open(&t, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    let mut mid = None;
    for level in 1..=LEVELS {
        rustix::fs::mkdirat(&dir, NAME, Mode::from_raw_mode(0o755)).unwrap();
        dir = rustix::fs::openat(&dir, NAME, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        if level == 150 {
            // 3,150 bytes down: an ordinary long path, for comparison.
            mid = Some(rustix::fs::openat(&dir, ".", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap());
        }
    }
    let mid = mid.unwrap();
    for (d, name) in [(&mid, "mid.bin"), (&dir, "deep.bin")] {
        let f = rustix::fs::openat(d, name, OFlags::WRONLY | OFlags::CREATE, Mode::from_raw_mode(0o640)).unwrap();
        rustix::io::write(&f, &payload).unwrap();
    }
    // Deeper than the crawl goes (64 KiB of path): left out, counted, no
    // error; its copy stays unshared.
    std::fs::create_dir(t.join("far")).unwrap();
    let mut far = rustix::fs::open(t.join("far"), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    for _ in 0..(64 << 10) / (NAME.len() + 1) + 10 {
        rustix::fs::mkdirat(&far, NAME, Mode::from_raw_mode(0o755)).unwrap();
        far = rustix::fs::openat(&far, NAME, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    }
    let f = rustix::fs::openat(&far, "far.bin", OFlags::WRONLY | OFlags::CREATE, Mode::from_raw_mode(0o640)).unwrap();
    rustix::io::write(&f, &payload).unwrap();
    let files = || [File::open(t.join("top.bin")).unwrap(), open_at(&mid, "mid.bin"), open_at(&dir, "deep.bin")];
    let before: Vec<_> = files().iter().map(state).collect();

    let out = dedupscan().arg(&t).json().db(vol.db()).expect(0).run();
    let r = out.json;
    assert_eq!(r["errors"].as_u64(), Some(0), "{r:#}");
    assert_eq!(r["files_hashed"].as_u64(), Some(3), "{r:#}");
    assert_eq!(r["skipped_dirs"]["too_deep"].as_u64(), Some(1), "{r:#}");
    // The directory left out is named, shortened to one line of both its
    // ends: the administrator learns where data was not looked at.
    let said: Vec<&str> = out.stderr.lines().filter(|l| l.contains("its path is longer than 64 KiB")).collect();
    assert_eq!(said.len(), 1, "{}", out.stderr);
    let start = format!("dedupscan: warning: {}/far/{NAME}/{NAME}/", t.display());
    assert!(said[0].starts_with(&start) && said[0].contains(" characters …]"), "{}", said[0]);
    assert!(said[0].contains(&format!("/{NAME}/{NAME}: left out with everything below it")), "{}", said[0]);
    assert!(said[0].len() < 400, "{}", said[0]);
    assert_eq!(num(&r, "deduped_bytes"), 2 * payload.len() as u64, "{r:#}");
    let after: Vec<_> = files().iter().map(state).collect();
    assert_eq!(before, after, "a file changed");
    let [top, m, deep] = files();
    let len = payload.len() as u64;
    assert!(physical(&top, len).iter().all(Option::is_some));
    assert_eq!(physical(&top, len), physical(&m, len), "the 3 KiB-deep copy is not shared");
    assert_eq!(physical(&top, len), physical(&deep, len), "the copy below PATH_MAX is not shared");
    assert_eq!(
        physical(&top, len).iter().zip(physical(&open_at(&far, "far.bin"), len)).filter(|(a, b)| *a == b).count(),
        0
    );

    // `report` measures them too: nothing left unknown or unshared.
    let rep = dedupscan().args(["report", "--json"]).arg(&t).db(vol.db()).expect(0).run().json;
    assert_eq!(rep["unknown_bytes"].as_u64(), Some(0), "{rep:#}");
    assert_eq!(rep["unshared_bytes"].as_u64(), Some(0), "{rep:#}");
    assert_eq!(rep["shared_bytes"].as_u64(), Some(2 * len), "{rep:#}");
}

#[test]
fn xfs_files_deeper_than_path_max_are_shared() {
    deep_files_are_shared(Fs::Xfs);
}

#[test]
fn btrfs_files_deeper_than_path_max_are_shared() {
    deep_files_are_shared(Fs::Btrfs);
}

fn wide_directories_are_listed_whole_once(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let t = vol.path("t");
    std::fs::create_dir(&t).unwrap();
    let payloads: Vec<Vec<u8>> = (0..50).map(|i| Rng::new(100 + i).bytes(8192)).collect();
    // 10,000 subdirectories (over twice MAX_SUBDIRS), a file in each:
    // copies of 50 contents.
    let n = 10_000;
    for i in 0..n {
        let d = t.join(format!("d{i:05}"));
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("f"), &payloads[i % payloads.len()]).unwrap();
    }
    let before = Snapshot::take(&t);
    let r = run_json(&vol, &[t.to_str().unwrap()]);
    before.assert_same(&Snapshot::take(&t));
    assert_eq!(r["errors"].as_u64(), Some(0), "{r:#}");
    assert_eq!(r["files_scanned"].as_u64(), Some(n as u64), "{r:#}");
    assert_eq!(r["files_hashed"].as_u64(), Some(n as u64), "{r:#}");
    assert!(r["skipped_dirs"].as_object().unwrap().is_empty(), "{r:#}");
    assert_eq!(num(&r, "deduped_bytes"), (n - payloads.len()) as u64 * 8192, "{r:#}");
    // The last directories listed (after the listing resumed twice) are
    // shared like the first.
    let last = t.join(format!("d{:05}/f", n - 1));
    let first = t.join(format!("d{:05}/f", (n - 1) % payloads.len()));
    assert!(same_physical(&first, 0, &last, 0, 8192));
}

#[test]
fn xfs_wide_directories_are_listed_whole_once() {
    wide_directories_are_listed_whole_once(Fs::Xfs);
}

#[test]
fn btrfs_wide_directories_are_listed_whole_once() {
    wide_directories_are_listed_whole_once(Fs::Btrfs);
}
