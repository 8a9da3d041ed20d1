//! A filesystem mounted on a name in the tree whose server never answers
//! must not hold the run.
//!
//! An unprivileged user can mount FUSE on a directory or a regular file
//! they own (`fusermount3`; with `allow_other`, which `user_allow_other`
//! in `/etc/fuse.conf` permits, root's calls reach the server too). A stat
//! of the name follows the mount and asks the server; one that never
//! answers held the crawl's `fstatat` forever, so the nightly run hung with
//! its lock held until `SIGKILL`. Here the test mounts such a server
//! itself (`mount(2)` on a `/dev/fuse` descriptor nobody reads: every
//! request, from `FUSE_INIT` on, waits), on a new file, on a file an
//! earlier run recorded and on a directory, and gives each run 60 s.

mod common;

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use common::*;
use dedupscan::corpus::Rng;

/// A FUSE mount at `at` served by nobody; detached and its connection
/// aborted when dropped.
struct Hung {
    at: PathBuf,
    _dev: OwnedFd,
}

impl Hung {
    fn mount(at: &Path) -> Hung {
        let dev: OwnedFd = std::fs::File::options().read(true).write(true).open("/dev/fuse").unwrap().into();
        let root = if at.is_dir() { "40000" } else { "100000" };
        let opts = format!("fd={},rootmode={root},user_id=0,group_id=0,allow_other", dev.as_raw_fd());
        let (src, ty) = (CString::new("hung").unwrap(), CString::new("fuse.hung").unwrap());
        let (target, data) = (CString::new(at.as_os_str().as_bytes()).unwrap(), CString::new(opts).unwrap());
        // SAFETY: plain C strings that outlive the call.
        let rc = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), ty.as_ptr(), 0, data.as_ptr().cast()) };
        assert_eq!(rc, 0, "mount fuse on {}: {}", at.display(), std::io::Error::last_os_error());
        Hung { at: at.to_owned(), _dev: dev }
    }
}

impl Drop for Hung {
    fn drop(&mut self) {
        let target = CString::new(self.at.as_os_str().as_bytes()).unwrap();
        // SAFETY: a C string that outlives the call. Detached: the server
        // never answers, and the descriptor's close aborts what waits.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

fn hung_mounts_are_left_out(fs: Fs) {
    if !Path::new("/dev/fuse").exists() {
        skip("no /dev/fuse");
        return;
    }
    let Some(vol) = Volume::new(fs, 300) else { return };
    let t = vol.path("t");
    std::fs::create_dir(&t).unwrap();
    let data = Rng::new(5).bytes(256 << 10);
    for name in ["a", "b", "known"] {
        std::fs::write(t.join(name), &data).unwrap();
    }
    std::fs::write(t.join("new"), b"").unwrap();
    std::fs::create_dir(t.join("dir")).unwrap();
    let before = Snapshot::take(&t);
    // "known" is recorded by a first run (a scan: nothing shared yet).
    run_json(&vol, &["scan", s(&t)]);

    let mounts: Vec<Hung> = ["known", "new", "dir"].iter().map(|n| Hung::mount(&t.join(n))).collect();
    let timeout = ["timeout", "-s", "KILL", "60"];
    for args in [&["--incremental"][..], &["--dry-run"][..], &[][..]] {
        let out = dedupscan().under(timeout).arg(&t).args(args).json().db(vol.db()).run();
        assert_eq!(out.code, 0, "{args:?}: exit {} (137: held by the hung mount)\n{}", out.code, out.stderr);
        validate_report(&out.json);
        assert_eq!(out.json["skipped_dirs"]["mount_point"], 1, "{args:?}: {:#}", out.json);
        assert_eq!(out.json["skipped"]["mount_point"], 2, "{args:?}: the two files: {:#}", out.json);
    }
    let out = dedupscan().under(timeout).arg("report").json().db(vol.db()).run();
    assert_eq!(out.code, 0, "report: exit {}\n{}", out.code, out.stderr);
    drop(mounts);

    // A `.nodedup` marker above the starting path (looked at by path) with
    // such a mount on it: it is there, so the starting path is protected.
    let above = vol.path("above");
    std::fs::create_dir_all(above.join("sub")).unwrap();
    std::fs::write(above.join(".nodedup"), b"").unwrap();
    let marker = Hung::mount(&above.join(".nodedup"));
    let out = dedupscan().under(timeout).arg(above.join("sub")).json().db(vol.db()).run();
    assert_eq!(out.code, 0, "marker above: exit {}\n{}", out.code, out.stderr);
    assert_eq!(out.json["skipped_dirs"]["nodedup"], 1, "{:#}", out.json);
    drop(marker);

    before.assert_same(&Snapshot::take(&t));
    assert!(same_physical(&t.join("a"), 0, &t.join("b"), 0, 256 << 10), "the rest is shared");
}

#[test]
fn xfs_a_hung_mount_in_the_tree_does_not_hold_the_run() {
    hung_mounts_are_left_out(Fs::Xfs);
}

#[test]
fn btrfs_a_hung_mount_in_the_tree_does_not_hold_the_run() {
    hung_mounts_are_left_out(Fs::Btrfs);
}
