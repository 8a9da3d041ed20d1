//! Starting paths that overlap: a directory and one inside it, the same
//! directory twice, a file inside a directory also given. Each file is
//! crawled, counted and planned once, as if each path had been given once
//! (crawled twice, a file was recorded twice and planned against itself,
//! and the kernel refused: "Invalid argument", exit 1). The same holds
//! for a starting path that reaches the same directory through a bind
//! mount (compared by where it lies in the filesystem, not by its path).
//! A bind mount of a directory below a `.nodedup` marker is skipped like
//! the directory itself. A starting path that leads through a symlink
//! another user could have planted (`/home/alice/vms`, which alice can
//! replace with a link to `/root` before the nightly run) is refused, not
//! followed; the administrator's own symlinks still are.

mod common;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use dedupscan::corpus::Rng;

/// `t9/sub/a`, `t9/sub/b` and `t9/c`, three copies of 1 MiB: `t9` and
/// the files.
fn three_copies(vol: &Volume) -> (PathBuf, [PathBuf; 3]) {
    let t = vol.path("t9");
    std::fs::create_dir_all(t.join("sub")).unwrap();
    let data = Rng::new(9).bytes(1 << 20);
    let files = [t.join("sub/a"), t.join("sub/b"), t.join("c")];
    for f in &files {
        std::fs::write(f, &data).unwrap();
    }
    (t, files)
}

fn overlapping(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let (t, files) = three_copies(&vol);
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
    let (t, files) = three_copies(&vol);
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

/// A directory bound elsewhere, below a `.nodedup` marker: the starting
/// path is the bind mount, whose own path passes no marker. The marker is
/// looked at where the volume's own mount shows the directories above the
/// bound one (`sys::mounts::hidden_ancestors`). Before, the copies below it
/// were shared.
fn bound_below_a_marker(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let private = vol.path("private");
    let data = private.join("deep/data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(private.join(".nodedup"), b"").unwrap();
    let bytes = Rng::new(11).bytes(1 << 20);
    let files = [data.join("a"), data.join("b")];
    for f in &files {
        std::fs::write(f, &bytes).unwrap();
    }
    let before = Snapshot::take(&private);
    let binds = tempfile::Builder::new().prefix("dedupscan-bind-").tempdir_in("/var/tmp").unwrap();
    let at = binds.path().join("data");
    let _bind = Bind::new(&data, &at);
    let out = dedupscan().arg(&at).json().db(vol.db()).expect(0).run();
    let r = &out.json;
    validate_report(r);
    before.assert_same(&Snapshot::take(&private));
    assert!(!same_physical(&files[0], 0, &files[1], 0, 1 << 20), "the copies below .nodedup were shared: {r:#}");
    assert_eq!(r["skipped_dirs"]["nodedup"], 1, "{r:#}");
    assert_eq!(num(r, "files_scanned"), 0, "{r:#}");
    let warn = format!("{}: skipped, a directory above it is marked nodedup", s(&at));
    assert!(out.stderr.contains(&warn), "want {warn:?} in:\n{}", out.stderr);
}

#[test]
fn xfs_a_bind_mount_below_a_nodedup_marker_is_skipped() {
    bound_below_a_marker(Fs::Xfs);
}

#[test]
fn btrfs_a_bind_mount_below_a_nodedup_marker_is_skipped() {
    bound_below_a_marker(Fs::Btrfs);
}

/// Run `args` as the unprivileged user 65534.
fn as_nobody(args: &[&str]) {
    let user = ["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"];
    sh(Command::new("setpriv").args(user).args(args));
}

/// Root's `secret` (0700) holds two copies of 1 MiB; the user 65534 owns
/// `home/u` and makes `home/u/vms` a symlink to it, and `home/u/proj` one to
/// the volume's top, so `home/u/proj/secret` leads there too. Given as
/// starting paths (the administrator configured the user's `vms`), each is
/// refused with exit 2 naming the link's owner: nothing is read, recorded
/// or shared. Before, the path was made canonical by following the links,
/// and the run shared root's copies (exit 0). A symlink root made in a
/// directory only root writes is followed, as before.
fn redirected(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let secret = vol.path("secret");
    std::fs::create_dir(&secret).unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let bytes = Rng::new(12).bytes(1 << 20);
    let files = [secret.join("a"), secret.join("b")];
    for f in &files {
        std::fs::write(f, &bytes).unwrap();
    }
    let before = Snapshot::take(&secret);
    let home = vol.path("home/u");
    std::fs::create_dir_all(&home).unwrap();
    sh(Command::new("chown").arg("65534:65534").arg(&home));
    as_nobody(&["ln", "-s", s(&secret), s(&home.join("vms"))]);
    as_nobody(&["ln", "-s", s(&vol.path("")), s(&home.join("proj"))]);
    for start in [home.join("vms"), home.join("proj/secret")] {
        let out = dedupscan().arg(&start).db(vol.db()).expect(2).run();
        let want = format!("{}: refused: ", s(&start));
        assert!(out.stderr.contains(&want), "want {want:?} in:\n{}", out.stderr);
        assert!(out.stderr.contains("symbolic link owned by uid 65534"), "{}", out.stderr);
        assert!(!vol.db().exists(), "a database was created");
        assert!(!same_physical(&files[0], 0, &files[1], 0, 1 << 20), "root's copies were shared through {start:?}");
    }
    before.assert_same(&Snapshot::take(&secret));
    let link = vol.path("link");
    symlink(&secret, &link).unwrap();
    let out = dedupscan().arg(&link).json().db(vol.db()).expect(0).run();
    validate_report(&out.json);
    assert_eq!(num(&out.json, "deduped_bytes"), 1 << 20, "{:#}", out.json);
    assert!(same_physical(&files[0], 0, &files[1], 0, 1 << 20), "root's own link was not followed");
    before.assert_same(&Snapshot::take(&secret));
}

#[test]
fn xfs_a_starting_path_another_user_could_redirect_is_refused() {
    redirected(Fs::Xfs);
}

#[test]
fn btrfs_a_starting_path_another_user_could_redirect_is_refused() {
    redirected(Fs::Btrfs);
}
