//! Never touch what must not be touched: the nodedup policy and hostile
//! input on real btrfs and XFS volumes, unsupported filesystems, and least
//! privilege (no write opens, non-root users).

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::Command;

use common::*;
use dedupscan::corpus::Rng;

/// A tree with ordinary duplicates plus one copy of the same data behind
/// every protection and every kind of hostile entry. Returns (ordinary
/// duplicate paths, protected paths).
fn hostile_tree(vol: &Volume) -> (Vec<PathBuf>, Vec<PathBuf>, std::os::unix::net::UnixListener) {
    let t = vol.path("t");
    let payload = Rng::new(77).bytes(256 * 1024);
    let mk = |rel: &str| -> PathBuf {
        let p = t.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &payload).unwrap();
        p
    };
    let ordinary = vec![mk("plain/a"), mk("plain/b")];
    // A name that is not UTF-8, holding the same data: must be shared.
    let weird = t.join(OsStr::from_bytes(b"plain/caf\xe9-\xff.bin"));
    std::fs::write(&weird, &payload).unwrap();
    // A name that would forge a journal line and colour a terminal if
    // printed raw: shared, and shown escaped.
    let forging = t.join(OsStr::from_bytes(b"plain/evil\n<3>forged \x1b[31mred\r"));
    std::fs::write(&forging, &payload).unwrap();
    let mut ordinary = ordinary;
    ordinary.extend([weird, forging]);
    // Hard link to an ordinary file: one inode, counted once.
    std::fs::hard_link(t.join("plain/a"), t.join("plain/a-link")).unwrap();

    let mut protected = Vec::new();
    let p = mk("xattr-file/f");
    set_nodedup(&p);
    protected.push(p);
    let p = mk("xattr-dir/sub/f");
    set_nodedup(&t.join("xattr-dir"));
    protected.push(p);
    let p = mk("marker/deep/f");
    std::fs::write(t.join("marker/.nodedup"), b"").unwrap();
    protected.push(p);
    protected.push(mk("excluded/f.iso"));
    let p = mk("flags/immutable");
    sh(Command::new("chattr").arg("+i").arg(&p));
    protected.push(p);
    let p = mk("flags/append");
    sh(Command::new("chattr").arg("+a").arg(&p));
    protected.push(p);
    if vol.fs == Fs::Btrfs {
        // NOCOW must be set while the file is empty.
        let p = t.join("flags/nocow");
        std::fs::File::create(&p).unwrap();
        sh(Command::new("chattr").arg("+C").arg(&p));
        std::fs::write(&p, &payload).unwrap();
        protected.push(p);
        // A read-only snapshot of a subvolume holding the data.
        sh(Command::new("btrfs").args(["-q", "subvolume", "create"]).arg(t.join("sv")));
        // Not an ordinary file: the snapshot keeps its extent (checked in
        // hostile_run).
        std::fs::write(t.join("sv/f"), &payload).unwrap();
        sh(Command::new("btrfs").args(["-q", "subvolume", "snapshot", "-r"]).arg(t.join("sv")).arg(t.join("snap")));
    }
    // Things that are not regular files: never opened, never followed.
    std::fs::create_dir_all(t.join("odd")).unwrap();
    nix::unistd::mkfifo(&t.join("odd/fifo"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let sock = std::os::unix::net::UnixListener::bind(t.join("odd/socket")).unwrap();
    nix::sys::stat::mknod(
        &t.join("odd/null"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .unwrap();
    std::os::unix::fs::symlink("loop-b", t.join("odd/loop-a")).unwrap();
    std::os::unix::fs::symlink("loop-a", t.join("odd/loop-b")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", t.join("odd/outside")).unwrap();
    std::os::unix::fs::symlink("/", t.join("odd/root-dir")).unwrap();
    std::fs::write(t.join("odd/empty"), b"").unwrap();
    // Another filesystem mounted inside the tree: not crossed.
    std::fs::create_dir_all(t.join("mnt-inside")).unwrap();
    sh(Command::new("mount").args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"]).arg(t.join("mnt-inside")));
    std::fs::write(t.join("mnt-inside/f"), &payload).unwrap();
    (ordinary, protected, sock)
}

fn cleanup_tree(vol: &Volume) {
    let t = vol.path("t");
    let _ = Command::new("umount").arg(t.join("mnt-inside")).status();
    for f in ["flags/immutable", "flags/append"] {
        let _ = Command::new("chattr").args(["-i", "-a"]).arg(t.join(f)).status();
    }
}

fn hostile_run(fs: Fs) {
    let Some(vol) = Volume::new(fs, 512) else { return };
    let (ordinary, protected, sock) = hostile_tree(&vol);
    let t = vol.path("t");
    let before = Snapshot::take(&t);
    let exclude_file = vol.mnt.join("excludes.txt");
    std::fs::write(&exclude_file, "# isos are left alone\n**/*.iso\n").unwrap();
    // Where every protected file's blocks are: a run must not move them.
    let phys = |p: &std::path::Path| physical_blocks(p, 0, std::fs::metadata(p).unwrap().len());
    let phys_before: Vec<_> = protected.iter().map(|p| phys(p)).collect();
    let r = run_json(&vol, &[t.to_str().unwrap(), "--exclude-from", exclude_file.to_str().unwrap()]);
    let after = Snapshot::take(&t);
    cleanup_tree(&vol);
    drop(sock);
    before.assert_same(&after);

    let skipped = r["skipped"].as_object().unwrap();
    let mut want = vec![
        "fifo",
        "socket",
        "device",
        "symlink",
        "hardlink",
        "empty",
        "nodedup",
        "excluded",
        "immutable",
        "append_only",
        "mount_point",
    ];
    if fs == Fs::Btrfs {
        want.extend(["nocow", "readonly_snapshot"]);
    }
    // Files are counted in `skipped`, directories (with everything below)
    // in `skipped_dirs`.
    let dirs = r["skipped_dirs"].as_object().unwrap();
    for reason in want {
        assert!(skipped.contains_key(reason) || dirs.contains_key(reason), "no skip reason {reason} in {r:#}");
    }
    assert_eq!(skipped["nodedup"].as_u64(), Some(1), "xattr on file");
    assert_eq!(dirs["nodedup"].as_u64(), Some(2), "xattr on dir, marker file");
    for (p, was) in protected.iter().zip(&phys_before) {
        assert_eq!(&phys(p), was, "protected file {} was moved", p.display());
        // The read-only snapshot shares its extent with its subvolume from
        // the start (that copy may well be the source: its extent stays
        // referenced anyway); nothing else protected is shared.
        if !p.ends_with("snap/f") {
            assert_eq!(shared_bytes(p), 0, "protected file {} was shared", p.display());
        }
    }
    let len = 256 * 1024;
    if fs == Fs::Btrfs {
        // A file whose extent a read-only snapshot (not scanned) also holds:
        // sharing into it would free nothing, so it is either the source of
        // its copies (its extent stays referenced anyway: the planner may
        // well pick it) or left alone and counted as pending.
        assert!(same_physical(&t.join("sv/f"), 0, &t.join("snap/f"), 0, len), "the snapshot's extent was touched");
        let pinned = r["pending"]["referenced_outside_run"]["bytes"].as_u64() >= Some(len);
        assert!(pinned || same_physical(&t.join("sv/f"), 0, &ordinary[0], 0, len), "{r:#}");
    }
    for p in &ordinary[1..] {
        assert!(same_physical(&ordinary[0], 0, p, 0, len), "{} not shared with {}", p.display(), ordinary[0].display());
    }
    assert_eq!(r["errors"].as_u64(), Some(0), "{r:#}");
    // The non-UTF-8 name is shown escaped, losslessly, where names are
    // shown: `report --list` lists every duplicate range, so the file holding
    // the payload under that name is in it (the check fails on a listing
    // without the name, not only on a lossy one).
    let listing = dedupscan().args(["report", "--list"]).db(vol.db()).expect(0).run().stdout;
    assert!(listing.contains(r"caf\xe9-\xff.bin"), "the non-UTF-8 name is not listed, escaped:\n{listing}");
    assert!(!listing.contains('\u{fffd}'), "a name was shown lossily:\n{listing}");
    assert!(listing.contains(r"evil\x0a<3>forged \x1b[31mred\x0d"), "control bytes not escaped:\n{listing}");
    assert!(!listing.contains("\n<3>") && !listing.contains('\x1b') && !listing.contains('\r'), "{listing}");
}

#[test]
fn xfs_hostile_tree_shares_only_what_it_may() {
    hostile_run(Fs::Xfs);
}

#[test]
fn btrfs_hostile_tree_shares_only_what_it_may() {
    hostile_run(Fs::Btrfs);
}

/// Trace every open of a dry run and of a real run: no file of the volume
/// is opened for writing. The one write-open allowed is an unnamed
/// `O_TMPFILE` (a new inode no other file can see), used on btrfs to
/// rewrite bookends and on both to turn written zeros into holes, by the
/// run only: a dry run makes none (its zero pass made one).
fn no_write_opens(fs: Fs) {
    let Some(vol) = Volume::new(fs, 512) else { return };
    let data = vol.path("data");
    dedupscan::corpus::build(&data, 2, 1).unwrap();
    // Written zeros between data, for the zero pass.
    std::fs::write(data.join("zeros.bin"), [Rng::new(3).bytes(256 << 10), vec![0; 1 << 20]].concat()).unwrap();
    let trace = vol.db().with_extension("trace");
    // -y: opens are relative to directory descriptors; show the paths.
    let strace = ["strace", "-f", "-qq", "-y", "-e", "trace=open,openat,openat2,creat,truncate", "-o", s(&trace)];
    let volume_lines = |text: &str| text.lines().filter(|l| l.contains(&*vol.mnt.display().to_string())).count();
    let dry = dedupscan().under(strace).arg(&data).args(["--dry-run", "--progress=never"]).json().db(vol.db());
    let dry = dry.expect(0).run().json;
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(volume_lines(&text) > 100, "the trace saw only {} opens on the volume", volume_lines(&text));
    let writes = ["O_TMPFILE", "O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND", "truncate(", "creat("];
    let on_volume = |l: &&str| l.contains(&*vol.mnt.display().to_string());
    let written: Vec<&str> = text.lines().filter(on_volume).filter(|l| writes.iter().any(|w| l.contains(w))).collect();
    assert!(written.is_empty(), "a dry run opened for writing: {written:?}");
    assert_eq!(num(&dry, "zeros_to_holes_bytes"), 1 << 20, "{dry:#}");
    let r = dedupscan().under(strace).arg(&data).json().arg("--progress=never").db(vol.db()).expect(0).run().json;
    let text = std::fs::read_to_string(&trace).unwrap();
    let vol_prefix = vol.mnt.display().to_string();
    let (mut volume_opens, mut tmpfiles) = (0, 0);
    for line in text.lines().filter(|l| l.contains(&vol_prefix)) {
        volume_opens += 1;
        if line.contains("O_TMPFILE") {
            tmpfiles += 1;
            continue;
        }
        for bad in ["O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND", "truncate(", "creat("] {
            assert!(!line.contains(bad), "opened for writing: {line}");
        }
    }
    assert!(volume_opens > 100, "the trace saw only {volume_opens} opens on the volume: is strace working?");
    if fs == Fs::Btrfs {
        assert!(tmpfiles > 0 && num(&r, "rewritten_bytes") > 0, "the btrfs run rewrote nothing: {r:#}");
    }
    // And it did share.
    assert!(shared_bytes(&data.join("whole/b/file0.bin")) > 0);
}

#[test]
fn xfs_volume_files_are_never_opened_for_writing() {
    no_write_opens(Fs::Xfs);
}

#[test]
fn btrfs_volume_files_are_never_opened_for_writing() {
    no_write_opens(Fs::Btrfs);
}

#[test]
fn a_non_root_user_can_dedupe_their_own_files() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let home = vol.path("home");
    std::fs::create_dir(&home).unwrap();
    let payload = Rng::new(6).bytes(512 * 1024);
    std::fs::write(home.join("a"), &payload).unwrap();
    std::fs::write(home.join("b"), &payload).unwrap();
    sh(Command::new("chown").args(["-R", "65534:65534"]).arg(&home));
    // Things this user may not read: a root-only directory and file.
    std::fs::create_dir(home.join("locked")).unwrap();
    std::fs::write(home.join("locked/inside"), &payload).unwrap();
    std::fs::set_permissions(home.join("locked"), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::fs::write(home.join("secret"), &payload).unwrap();
    std::fs::set_permissions(home.join("secret"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let db = home.join("state/db.sqlite");
    // The binary must be reachable for the user: copy it next to the data.
    let bin = vol.path("dedupscan");
    std::fs::copy(common::bin(), &bin).unwrap();
    // Finished, with the unreadable paths counted and named: exit code 1.
    let out = dedupscan()
        .program(&bin)
        .under(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
        .arg(home.join("."))
        .db(&db)
        .json()
        .args(["--exclude", "**/state/**"])
        .expect(1)
        .run();
    let (r, err) = (out.json, out.stderr);
    validate_report(&r);
    assert_eq!(r["error_kinds"]["unreadable"].as_u64(), Some(2), "{r:#}");
    assert!(err.contains("/locked") && err.contains("/secret") && err.contains("ermission denied"), "{err}");
    assert_eq!(num(&r, "deduped_bytes"), 512 * 1024, "{r:#}");
    assert!(same_physical(&home.join("a"), 0, &home.join("b"), 0, 512 * 1024));
    let m = std::fs::metadata(&db).unwrap();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777, 0o600);
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&m), 65534);
}

/// Turns a swap file off again, even when the test panics.
struct SwapOn(PathBuf);

impl Drop for SwapOn {
    fn drop(&mut self) {
        let _ = Command::new("swapoff").arg(&self.0).status();
    }
}

#[test]
fn active_swap_files_are_left_alone() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let swap = vol.path("swapfile");
    std::fs::write(&swap, vec![0u8; 16 << 20]).unwrap();
    std::fs::set_permissions(&swap, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    sh(Command::new("mkswap").arg("-q").arg(&swap));
    if !Command::new("swapon").arg(&swap).status().is_ok_and(|s| s.success()) {
        return skip("swapon is not permitted here");
    }
    let _guard = SwapOn(swap.clone());
    // A copy with the same bytes (mkswap's header included): a perfect match.
    // (std::fs::copy would try a reflink, which the kernel refuses for swap.)
    std::fs::write(vol.path("copy"), std::fs::read(&swap).unwrap()).unwrap();
    let r = run_json(&vol, &[swap.to_str().unwrap(), vol.path("copy").to_str().unwrap()]);
    assert_eq!(r["skipped"]["swapfile"].as_u64(), Some(1), "{r:#}");
    assert_eq!(num(&r, "deduped_bytes"), 0);
    assert_eq!(shared_bytes(&swap), 0);
}

/// Once the starting paths are held open, no name below them is looked up
/// from `/` again (open, stat or xattr by full path): a user could plant a
/// symlink on the way between two lookups. Traced over a first run, and a
/// second one after a rename and new hard links, where change detection
/// asks whether a moved file's recorded name still leads to its inode.
fn no_lookups_from_root(fs: Fs) {
    let Some(vol) = Volume::new(fs, 512) else { return };
    let data = vol.path("data");
    dedupscan::corpus::build(&data, 3, 1).unwrap();
    let trace = vol.db().with_extension("trace");
    let strace = ["strace", "-f", "-qq", "-y", "-e", "trace=%file,%stat,%desc", "-o", s(&trace)];
    let below = format!("\"{}/", data.display());
    let lookups_from_root = |what: &str| {
        let text = std::fs::read_to_string(&trace).unwrap();
        assert!(text.lines().count() > 100, "{what}: the trace is almost empty: is strace working?");
        let bad: Vec<&str> = text.lines().filter(|l| l.contains(&below)).collect();
        assert!(
            bad.is_empty(),
            "{what}: {} lookups by full path, e.g.:\n{}",
            bad.len(),
            bad[..bad.len().min(5)].join("\n")
        );
    };
    dedupscan().under(strace).arg(&data).arg("--progress=never").db(vol.db()).expect(0).run();
    lookups_from_root("first run");
    std::fs::rename(data.join("whole/b"), data.join("whole/moved")).unwrap();
    std::fs::create_dir(data.join("links")).unwrap();
    for f in ["file0.bin", "file1.bin"] {
        std::fs::hard_link(data.join("whole/c").join(f), data.join("links").join(f)).unwrap();
    }
    let r = dedupscan().under(strace).arg(&data).json().arg("--progress=never").db(vol.db()).expect(0).run().json;
    assert!(num(&r, "files_renamed") >= 3, "the rename was not seen as one: {r:#}");
    lookups_from_root("run after a rename");
    // A preview reads every planned range itself, to compare.
    std::fs::write(data.join("links/new.bin"), std::fs::read(data.join("whole/a/file2.bin")).unwrap()).unwrap();
    let r = dedupscan().under(strace).arg(&data).json().args(["--progress=never", "--dry-run", "--rehash"]);
    let r = r.db(vol.db()).expect(0).run().json;
    assert!(num(&r, "duplicate_bytes") > 0, "the preview verified nothing: {r:#}");
    lookups_from_root("preview");
}

#[test]
fn xfs_no_name_below_the_tree_is_looked_up_from_root() {
    no_lookups_from_root(Fs::Xfs);
}

#[test]
fn btrfs_no_name_below_the_tree_is_looked_up_from_root() {
    no_lookups_from_root(Fs::Btrfs);
}
