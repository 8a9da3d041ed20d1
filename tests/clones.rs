//! A user's reflinked clones cannot exhaust the run's memory (issue 14).
//!
//! `cp --reflink=always` costs its owner no disk space, so any user of a
//! scanned tree can make thousands of copies of one large file in seconds.
//! Every copy is a member of one whole-file group. Before, the planner took
//! every copy's block map into its union-find (about 16 bytes a block a
//! copy: 400 clones of a 1 GiB file made the full run and `report` take
//! 1.65 GB, 10,000 would take 40 GB), and the scan held the maps of up to
//! 768 files on their way to the database, whatever their size (192 MB for
//! those 400). Now the planner sees three copies and the others follow with
//! the same ranges (`plan::copies`), and the maps in flight are bounded in
//! bytes (`hash::MapBytes`).
//!
//! Each run is the real binary under `prlimit --as`, its peak RSS read from
//! `wait4` ([`bounded`]). `DEDUPSCAN_TEST_BIN` runs another build (the old
//! one fails every run here on its peak RSS).

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use common::bounded::*;
use common::*;

const MIB: u64 = 1 << 20;

/// Clones the user makes of one file.
const CLONES: usize = 400;

/// Peak RSS each run may reach: flat in the number of clones (the runs
/// measured 30–60 MB; the old build 100–420 MB here).
const MAX_RSS: u64 = 80_000_000;

/// Size, mode, mtime and inode of every file: what the run must not change,
/// without reading 100 GiB of clones (their contents are proven by their
/// extents, see below).
fn metadata(dir: &Path) -> BTreeMap<String, (u64, u32, i64, i64)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            (e.file_name().to_string_lossy().into_owned(), (m.size(), m.mode(), m.mtime(), m.mtime_nsec()))
        })
        .collect()
}

fn bounded_ok(vol: &Volume, args: &[&str], what: &str) -> serde_json::Value {
    let b = bounded(vol, args);
    eprintln!("{what}: exit {}, peak RSS {:.1} MB", b.code, b.max_rss as f64 / 1e6);
    assert_eq!(b.code, 0, "{what}: exit {}: {}", b.code, b.stderr);
    assert!(b.max_rss < MAX_RSS, "{what}: peak RSS {:.1} MB with {CLONES} clones", b.max_rss as f64 / 1e6);
    b.json
}

fn clones_cost_no_memory(fs: Fs) {
    let Some(vol) = Volume::new(fs, 700) else { return };
    let d = vol.path("home/mallory");
    std::fs::create_dir_all(&d).unwrap();
    let size = 256 * MIB;
    std::fs::write(d.join("orig"), dedupscan::corpus::Rng::new(41).bytes(size as usize)).unwrap();
    sh(Command::new("chown").args(["-R", "65534:65534"]).arg(&d));
    // The user's own clones, made as the user.
    let script = format!("for i in $(seq {CLONES}); do cp --reflink=always orig c$i || exit 1; done");
    sh(Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", &script])
        .current_dir(&d));
    let orig_sha = sha256_hex(&d.join("orig"));
    let before = metadata(&d);
    vol.remount();

    let scan = bounded_ok(&vol, &["scan", s(&d)], "scan");
    assert_eq!(num(&scan, "files_hashed"), CLONES as u64 + 1, "{scan:#}");
    assert!(num(&scan, "bytes_hashed") <= size + 8 * MIB, "the clones' extents are read once: {scan:#}");
    validate_report(&scan);

    let run = bounded_ok(&vol, &[s(&d)], "run");
    // Every clone is planned (as a follower), none is left out, and each
    // is found to share the original's extents already (but for a block
    // or so a clone that 32-bit fingerprints match elsewhere in the file:
    // planned, never shared; one clone less would be 256 MiB less).
    assert!(num(&run, "ranges_planned") >= CLONES as u64, "{run:#}");
    assert!(num(&run, "already_shared_bytes") >= CLONES as u64 * (size - 64 * 1024), "{run:#}");
    validate_report(&run);

    let report = bounded_ok(&vol, &["report"], "report");
    validate_db_report(&report);

    // Nothing changed: metadata of every file, the original's bytes, and
    // every clone still the original's extents, block for block.
    assert_eq!(metadata(&d), before);
    assert_eq!(sha256_hex(&d.join("orig")), orig_sha);
    for i in 1..=CLONES {
        assert!(same_physical(&d.join("orig"), 0, &d.join(format!("c{i}")), 0, size), "c{i} no longer the original's");
    }
}

#[test]
fn btrfs_a_users_reflinked_clones_cost_the_run_no_memory() {
    clones_cost_no_memory(Fs::Btrfs);
}

#[test]
fn xfs_a_users_reflinked_clones_cost_the_run_no_memory() {
    clones_cost_no_memory(Fs::Xfs);
}

/// A file, three `cp --reflink` clones of it (four holders of one extent)
/// and a disk image with the file inside, written in one pass: the image
/// (blocks of its own) is the source, and the file's extent is freed only
/// once all four are shared into. A whole-file group of more than three
/// copies is planned with two and the rest follow in a plan of their own;
/// the first copy stayed in the batch's plan, so on btrfs each plan found
/// the other's copies holding the extent outside it and left all four
/// pending `referenced_outside_run`: nothing freed.
fn clones_of_a_file_inside_an_image_are_freed(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let d = vol.path("data");
    std::fs::create_dir_all(d.join("tree")).unwrap();
    std::fs::create_dir_all(d.join("img")).unwrap();
    let mut rng = dedupscan::corpus::Rng::new(54);
    let f = rng.bytes(MIB as usize);
    std::fs::write(d.join("tree/f"), &f).unwrap();
    let image = [rng.bytes(4 * MIB as usize), f, rng.bytes(4 * MIB as usize)].concat();
    std::fs::write(d.join("img/i.img"), &image).unwrap();
    for k in 1..=3 {
        reflink(&d.join("tree/f"), &d.join(format!("tree/f{k}")));
    }
    sh(&mut Command::new("sync"));
    let before = Snapshot::take(&d);
    let free = free_bytes(&d);
    let run = run_json(&vol, &[s(&d)]);
    let freed = free_bytes(&d) as i64 - free as i64;
    before.assert_same(&Snapshot::take(&d));
    assert_eq!(num(&run, "errors"), 0, "{run:#}");
    assert!(run["pending"].as_object().unwrap().is_empty(), "nothing left pending: {run:#}");
    let clones: Vec<_> = ["f", "f1", "f2", "f3"].iter().map(|n| d.join("tree").join(n)).collect();
    assert_in_image(&d.join("img/i.img"), 4 * MIB, &clones, MIB, &run);
    assert!(freed >= MIB as i64 * 7 / 8, "freed {freed} of {MIB} (statfs): {run:#}");
}

#[test]
fn btrfs_clones_of_a_file_inside_an_image_are_freed() {
    clones_of_a_file_inside_an_image_are_freed(Fs::Btrfs);
}

#[test]
fn xfs_clones_of_a_file_inside_an_image_are_freed() {
    clones_of_a_file_inside_an_image_are_freed(Fs::Xfs);
}
