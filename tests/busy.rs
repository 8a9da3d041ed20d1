//! A volume other processes write to while the run measures what it
//! freed (`sys::watch`): `freed_bytes` is free space after minus before,
//! so their writes are in it. The report says whether another process
//! changed the filesystem meanwhile (`freed_includes_others`), and `false`
//! when only the run itself wrote: its database on the volume, the copies
//! of the bookend pass, the zero pass's unnamed file. A subvolume mounted
//! without its top level cannot be watched: `null`, not `false`. And a
//! large file written while the run reads it is left at the first change
//! seen, not read to its end.

mod common;

use std::path::Path;
use std::process::{Child, Command};

use common::*;
use dedupscan::corpus::Rng;

const KIB: usize = 1024;

/// Pairs, a near-copy whose last quarter the bookend pass rewrites (one
/// extent each: written at once), and a file with 1 MiB of written zeros.
fn corpus(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 0..8 {
        let data = Rng::new(40 + i).bytes(256 * KIB);
        std::fs::write(dir.join(format!("p{i}a")), &data).unwrap();
        std::fs::write(dir.join(format!("p{i}b")), &data).unwrap();
    }
    let head = Rng::new(50).bytes(768 * KIB);
    std::fs::write(dir.join("x"), [&head[..], &Rng::new(51).bytes(256 * KIB)].concat()).unwrap();
    std::fs::write(dir.join("y"), [&head[..], &Rng::new(52).bytes(256 * KIB)].concat()).unwrap();
    std::fs::write(dir.join("z"), [Rng::new(53).bytes(64 * KIB), vec![0; 1024 * KIB]].concat()).unwrap();
    // This volume only: a global sync(2) commits every test's volume.
    sh(Command::new("sync").arg("-f").arg(dir));
}

/// Another process writing to a file in `dir` without pause until killed:
/// one shell appending a byte at a time (a builtin: no other process), so
/// however short the run, it writes while the run measures.
fn writer(dir: &Path) -> Child {
    std::fs::create_dir_all(dir).unwrap();
    let script = "while :; do printf x >> \"$1\"/f; done";
    Command::new("sh").arg("-c").arg(script).arg("sh").arg(dir).spawn().unwrap()
}

/// `f()` while a [`writer`] writes in `dir`.
fn while_another_writes<T>(dir: &Path, f: impl FnOnce() -> T) -> T {
    let mut w = writer(dir);
    let out = f();
    w.kill().unwrap();
    w.wait().unwrap();
    out
}

fn run(tree: &Path, db: &Path) -> serde_json::Value {
    let r = dedupscan().arg(tree).db(db).json().expect(0).run().json;
    validate_report(&r);
    r
}

fn measured_alone_or_with_others(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    corpus(&vol.path("quiet"));
    let before = Snapshot::take(&vol.path("quiet"));
    // The database on the volume too: its writes are this run's own.
    let r = run(&vol.path("quiet"), &vol.path("state.sqlite"));
    assert!(num(&r, "zeros_to_holes_bytes") >= 1 << 20, "{r:#}");
    if fs == Fs::Btrfs {
        assert!(num(&r, "rewritten_bytes") >= 256 * KIB as u64, "the bookend pass wrote: {r:#}");
    }
    assert_eq!(r["freed_includes_others"], false, "only the run wrote: {r:#}");
    before.assert_same(&Snapshot::take(&vol.path("quiet")));

    corpus(&vol.path("busy"));
    let r = while_another_writes(&vol.path("other"), || run(&vol.path("busy"), &vol.db()));
    assert_eq!(r["freed_includes_others"], true, "another process wrote: {r:#}");
    assert!(num(&r, "deduped_bytes") >= 8 * 256 * KIB as u64, "{r:#}");

    // The text report says it on the freed row.
    corpus(&vol.path("busy2"));
    let out =
        while_another_writes(&vol.path("other2"), || dedupscan().arg(vol.path("busy2")).db(vol.db()).expect(0).run());
    let row = out.stdout.lines().find(|l| l.trim_start().starts_with("freed ")).expect("a freed row");
    assert!(row.contains("with changes by other processes"), "{row:?}");
    // And `report`, over the runs of that database.
    let out = dedupscan().arg("report").db(vol.db()).expect(0).run();
    assert!(out.stdout.contains("over 2 runs, 2 of them with changes by other processes"), "{}", out.stdout);
    // And the history chart's bars.
    let html = vol.mnt.parent().unwrap().join("report.html");
    dedupscan().args(["report", "--html"]).arg(&html).db(vol.db()).expect(0).run();
    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(page.matches("with changes by other processes, ").count(), 2, "{page}");
}

/// A large file another process writes to while the run reads it (a
/// running VM's image, a growing log) cannot be recorded: the run looks at
/// its size and times every 64 MiB it reads and stops at the first change,
/// instead of reading it to its end for nothing, every night. Proven with
/// the page cache: the file's pages are dropped before the run and counted
/// after it (`mincore`); the build before read all 512 MiB.
fn a_file_written_while_read_is_left_early(fs: Fs) {
    let Some(vol) = Volume::new(fs, 1200) else { return };
    let d = vol.path("d");
    std::fs::create_dir_all(&d).unwrap();
    let big = d.join("f");
    let mut f = std::fs::File::create(&big).unwrap();
    for i in 0..32 {
        std::io::Write::write_all(&mut f, &Rng::new(60 + i).bytes(16 << 20)).unwrap();
    }
    drop(f);
    drop_pages(&big);
    let r = while_another_writes(&d, || run(&d, &vol.db()));
    assert_eq!(r["skipped"]["changed_during_scan"], 1, "{r:#}");
    // The writer's own appends are a few pages at the end.
    let read = resident(&big) << 12;
    assert!(read < 160 << 20, "{} MiB of the 512 MiB file read: {r:#}", read >> 20);
}

#[test]
fn xfs_a_file_written_while_read_is_left_early() {
    a_file_written_while_read_is_left_early(Fs::Xfs);
}

#[test]
fn btrfs_a_file_written_while_read_is_left_early() {
    a_file_written_while_read_is_left_early(Fs::Btrfs);
}

#[test]
fn xfs_freed_is_measured_alone_or_with_others() {
    measured_alone_or_with_others(Fs::Xfs);
}

#[test]
fn btrfs_freed_is_measured_alone_or_with_others() {
    measured_alone_or_with_others(Fs::Btrfs);
}

/// A btrfs subvolume mounted on its own: fanotify cannot report file
/// handles through it (`EXDEV`), so the run watches through the top level
/// while that is mounted somewhere, and says it did not watch once it is
/// not.
#[test]
fn btrfs_subvolume_mounted_on_its_own() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    btrfs(&["subvolume", "create"], &vol.path("sv"));
    let mnt = vol.mnt.parent().unwrap().join("sv-mnt");
    std::fs::create_dir(&mnt).unwrap();
    let source = Command::new("findmnt").args(["-nvo", "SOURCE"]).arg(&vol.mnt).output().unwrap().stdout;
    let dev = String::from_utf8(source).unwrap().trim().to_owned();
    sh(Command::new("mount").args(["-o", "subvol=sv", &dev]).arg(&mnt));
    let _guard = Unmount(mnt.clone());

    corpus(&mnt.join("t"));
    let r = while_another_writes(&mnt.join("other"), || run(&mnt.join("t"), &vol.db()));
    assert_eq!(r["freed_includes_others"], true, "watched through the top level: {r:#}");

    sh(Command::new("umount").arg(&vol.mnt));
    corpus(&mnt.join("t2"));
    let r = run(&mnt.join("t2"), &vol.db());
    sh(Command::new("mount").arg(&dev).arg(&vol.mnt));
    assert!(r["freed_includes_others"].is_null(), "nothing to watch through: {r:#}");
    assert!(num(&r, "deduped_bytes") >= 8 * 256 * KIB as u64, "{r:#}");
}

/// A subvolume deleted just before the run (a nightly snapshot rotation):
/// btrfs's cleaner gives its space back on its own schedule, maybe while
/// the run measures, with no call any process makes then. The run finds
/// the deletion still pending and says its figure may hold that space.
#[test]
fn btrfs_a_subvolume_deleted_before_the_run() {
    let Some(vol) = Volume::new(Fs::Btrfs, 320) else { return };
    // The cleaner wakes with the transaction thread: not within this test.
    vol.remount_with("commit=300");
    corpus(&vol.path("t"));
    btrfs(&["subvolume", "create"], &vol.path("old"));
    std::fs::write(vol.path("old/data"), Rng::new(60).bytes(8 << 20)).unwrap();
    btrfs(&["filesystem", "sync"], &vol.mnt);
    // A process still holding a file of the deleted subvolume keeps its
    // cleanup pending through any commit; without it the run's own syncfs
    // woke the cleaner, which could finish 8 MiB before the run looked.
    let holder = std::fs::File::open(vol.path("old/data")).unwrap();
    btrfs(&["subvolume", "delete"], &vol.path("old"));
    let pending = Command::new("btrfs").args(["subvolume", "list", "-d"]).arg(&vol.mnt).output().unwrap().stdout;
    assert!(!pending.is_empty(), "the deletion is still to be cleaned up");
    let r = run(&vol.path("t"), &vol.db());
    drop(holder);
    assert_eq!(r["freed_includes_others"], true, "{r:#}");
    assert!(num(&r, "deduped_bytes") >= 8 * 256 * KIB as u64, "{r:#}");
}
