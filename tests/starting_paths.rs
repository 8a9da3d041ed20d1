//! Starting paths that overlap: a directory and one inside it, the same
//! directory twice, a file inside a directory also given. Each file is
//! crawled, counted and planned once, as if each path had been given once
//! (crawled twice, a file was recorded twice and planned against itself,
//! and the kernel refused: "Invalid argument", exit 1). The same holds
//! for a starting path that reaches the same directory through a bind
//! mount (compared by where it lies in the filesystem, not by its path).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use dedupscan::corpus::Rng;

fn overlapping(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let t = vol.path("t9");
    std::fs::create_dir_all(t.join("sub")).unwrap();
    let data = Rng::new(9).bytes(1 << 20);
    let files = [t.join("sub/a"), t.join("sub/b"), t.join("c")];
    for f in &files {
        std::fs::write(f, &data).unwrap();
    }
    let before = Snapshot::take(&t);
    let (again, sub) = (format!("{}/", s(&t)), t.join("sub"));
    let args = [s(&t), s(&sub), &again, s(&files[0])];
    let out = dedupscan().args(args).json().db(vol.db()).expect(0).run();
    let r = &out.json;
    validate_report(r);
    before.assert_same(&Snapshot::take(&t));
    assert_eq!(num(r, "files_scanned"), 3, "{r:#}");
    assert_eq!(num(r, "files_hashed"), 3, "{r:#}");
    assert_eq!(num(r, "errors"), 0, "{r:#}");
    assert_eq!(r["paths"].as_array().map(Vec::len), Some(1), "{r:#}");
    assert_eq!(num(r, "deduped_bytes"), 2 << 20, "{r:#}");
    for f in &files[1..] {
        assert!(same_physical(&files[0], 0, f, 0, 1 << 20), "{} not shared", f.display());
    }
    // Each dropped path is named once.
    for p in [s(&sub), s(&files[0])] {
        assert!(out.stderr.contains(&format!("{p}: inside")), "no warning for {p}:\n{}", out.stderr);
    }
    assert!(out.stderr.contains("given twice"), "{}", out.stderr);
}

#[test]
fn xfs_overlapping_starting_paths_are_scanned_once() {
    overlapping(Fs::Xfs);
}

#[test]
fn btrfs_overlapping_starting_paths_are_scanned_once() {
    overlapping(Fs::Btrfs);
}

/// A bind mount, unmounted on drop (also when the test panics).
struct Bind(PathBuf);

impl Bind {
    fn new(from: &Path, at: &Path) -> Bind {
        std::fs::create_dir(at).unwrap();
        sh(Command::new("mount").arg("--bind").arg(from).arg(at));
        Bind(at.to_owned())
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// `t9/sub` bound elsewhere is given first, then `t9`, then `t9` bound
/// elsewhere: crawled once, as `t9`. Before, all three were crawled: six
/// rows for three files, files planned against their other paths, nothing
/// shared, exit 0.
fn bind_mounted(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let t = vol.path("t9");
    std::fs::create_dir_all(t.join("sub")).unwrap();
    let data = Rng::new(9).bytes(1 << 20);
    let files = [t.join("sub/a"), t.join("sub/b"), t.join("c")];
    for f in &files {
        std::fs::write(f, &data).unwrap();
    }
    let before = Snapshot::take(&t);
    let binds = tempfile::Builder::new().prefix("dedupscan-bind-").tempdir_in("/var/tmp").unwrap();
    let (sub_at, t_at) = (binds.path().join("sub"), binds.path().join("t"));
    let _sub = Bind::new(&t.join("sub"), &sub_at);
    let _t = Bind::new(&t, &t_at);
    let out = dedupscan().args([&sub_at, &t, &t_at]).json().db(vol.db()).expect(0).run();
    let r = &out.json;
    validate_report(r);
    before.assert_same(&Snapshot::take(&t));
    assert_eq!(num(r, "files_scanned"), 3, "{r:#}");
    assert_eq!(num(r, "errors"), 0, "{r:#}");
    assert_eq!(r["paths"].as_array().map(Vec::len), Some(1), "{r:#}");
    assert_eq!(num(r, "deduped_bytes"), 2 << 20, "{r:#}");
    for f in &files[1..] {
        assert!(same_physical(&files[0], 0, f, 0, 1 << 20), "{} not shared", f.display());
    }
    for p in [&sub_at, &t_at] {
        assert!(out.stderr.contains(&format!("{}: the same directory as", s(p))), "{p:?}:\n{}", out.stderr);
    }
}

#[test]
fn xfs_a_bind_mount_of_a_starting_path_is_scanned_once() {
    bind_mounted(Fs::Xfs);
}

#[test]
fn btrfs_a_bind_mount_of_a_starting_path_is_scanned_once() {
    bind_mounted(Fs::Btrfs);
}
