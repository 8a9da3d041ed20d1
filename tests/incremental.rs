//! The database's life: incremental runs, rename, delete, mtime rollback,
//! locking, interruption and resume, migration, corrupt and foreign
//! databases.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

use common::*;
use dedupscan::corpus::Rng;

/// 20,000 files of 500 B to 3.5 KB in 100 directories `d000`…`d099`
/// under `data`, file `i` in directory `i % 100`.
fn twenty_thousand_files(data: &std::path::Path, rng: &mut Rng) {
    for i in 0..20_000 {
        let dir = data.join(format!("d{:03}", i % 100));
        if i < 100 {
            std::fs::create_dir_all(&dir).unwrap();
        }
        let len = 500 + rng.below(3000) as usize;
        std::fs::write(dir.join(format!("f{i:05}")), rng.bytes(len)).unwrap();
    }
}

#[test]
fn twenty_thousand_files_rehash_only_what_changed() {
    let Some(vol) = Volume::new(Fs::Xfs, 512) else { return };
    let data = vol.path("tree");
    let mut rng = Rng::new(3);
    twenty_thousand_files(&data, &mut rng);
    let first = run_json(&vol, &["scan", s(&data)]);
    assert_eq!(num(&first, "files_hashed"), 20_000);
    let again = run_json(&vol, &["scan", s(&data), "--incremental"]);
    assert_eq!(num(&again, "bytes_hashed"), 0);
    assert_eq!(num(&again, "files_unchanged"), 20_000);

    // Rewrite one file in place (same size), append to another, rewrite a
    // third and set its mtime back into the past: ctime still moves.
    let f = |i: usize| data.join(format!("d{:03}/f{i:05}", i % 100));
    let (a, b, c) = (f(10), f(2_000), f(15_000));
    let a_len = std::fs::metadata(&a).unwrap().len() as usize;
    std::fs::write(&a, rng.bytes(a_len)).unwrap();
    std::fs::OpenOptions::new().append(true).open(&b).unwrap().write_all(&rng.bytes(777)).unwrap();
    let old_mtime = std::fs::metadata(&c).unwrap().modified().unwrap();
    let c_new = rng.bytes(1234);
    std::fs::write(&c, &c_new).unwrap();
    std::fs::File::options().write(true).open(&c).unwrap().set_modified(old_mtime).unwrap();
    // A rename hashes nothing; a deletion is pruned.
    std::fs::rename(f(500), data.join("d000/renamed")).unwrap();
    std::fs::remove_file(f(501)).unwrap();

    let third = run_json(&vol, &["scan", s(&data), "--incremental"]);
    let expect: u64 = [&a, &b, &c].iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    assert_eq!(num(&third, "files_hashed"), 3, "{third:#}");
    assert_eq!(num(&third, "bytes_hashed"), expect);
    assert_eq!(num(&third, "files_renamed"), 1);
    assert_eq!(num(&third, "files_removed"), 1);
    // Unchanged at their recorded path: all but the removed, the three
    // rewritten and the moved one (counted in files_renamed).
    assert_eq!(num(&third, "files_unchanged"), 20_000 - 1 - 3 - 1);

    // The report from the database agrees.
    assert_eq!(db_report(&vol)["files"].as_u64(), Some(19_999));

    // Most of the tree removed: the database gives the space of its rows
    // back (SQLite alone would keep the file at its largest for good).
    for d in 10..100 {
        std::fs::remove_dir_all(data.join(format!("d{d:03}"))).unwrap();
    }
    let db_bytes = || std::fs::metadata(vol.db()).unwrap().len();
    let before = db_bytes();
    let fourth = run_json(&vol, &["scan", s(&data), "--incremental"]);
    assert_eq!(num(&fourth, "files_removed"), 18_000, "{fourth:#}");
    assert!(db_bytes() * 3 < before, "database {} bytes, was {before}", db_bytes());
    integrity_ok(&vol.db());
    assert_eq!(db_report(&vol)["files"].as_u64(), Some(1_999));
}

/// The rewrite that gives back the space of removed rows needs room for a
/// temporary copy; without it (here: SQLite's temporary directory full)
/// the run warns, finishes, and leaves the database as it was.
#[test]
fn a_database_that_cannot_be_rewritten_is_left_as_it_was() {
    let Some(vol) = Volume::new(Fs::Xfs, 512) else { return };
    let data = vol.path("tree");
    twenty_thousand_files(&data, &mut Rng::new(5));
    run_json(&vol, &["scan", s(&data)]);
    // What stays (0.7 MB) is more than the database's page cache (512
    // KiB): the copy spills to a temporary file.
    for d in 60..100 {
        std::fs::remove_dir_all(data.join(format!("d{d:03}"))).unwrap();
    }
    let full = Tmpfs::new("size=64k");
    let filler = std::fs::File::create(full.path().join("filler")).unwrap();
    let _ = (&filler).write_all(&vec![0; 128 << 10]);
    let before = std::fs::metadata(vol.db()).unwrap().len();
    let out = dedupscan()
        .args(["scan", s(&data), "-v"])
        .env("SQLITE_TMPDIR", full.path())
        .json()
        .db(vol.db())
        .expect(0)
        .run();
    assert!(out.stderr.contains("could not be given back"), "{}", out.stderr);
    assert_eq!(num(&out.json, "files_removed"), 8_000);
    assert_eq!(std::fs::metadata(vol.db()).unwrap().len(), before);
    integrity_ok(&vol.db());
    assert_eq!(db_report(&vol)["files"].as_u64(), Some(12_000));
    drop(full);
    run_json(&vol, &["scan", s(&data)]);
    let after = std::fs::metadata(vol.db()).unwrap().len();
    assert!(after * 4 < before * 3, "not given back once there is room: {after} bytes, was {before}");
}

#[test]
fn a_second_run_on_a_locked_database_exits_at_once_with_code_4() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let data = vol.path("d");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("x"), b"hello").unwrap();
    let db = vol.db();
    let mut lock_path = db.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock = std::fs::File::create(&lock_path).unwrap();
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();
    let t = std::time::Instant::now();
    let err = dedupscan().arg(&data).db(&db).expect(4).run().stderr;
    assert!(err.contains("locked by another dedupscan run"), "{err}");
    assert!(t.elapsed().as_secs() < 5, "waited for the lock instead of exiting");
}

#[test]
fn sigterm_mid_scan_commits_and_the_next_run_carries_on() {
    let Some(vol) = Volume::new(Fs::Xfs, 1024) else { return };
    let data = vol.path("big");
    std::fs::create_dir(&data).unwrap();
    let mut rng = Rng::new(9);
    let n = 500;
    for i in 0..n {
        std::fs::write(data.join(format!("f{i:03}")), rng.bytes(1 << 20)).unwrap();
    }
    vol.remount(); // cold cache: reading takes time
    let db = vol.db();
    let mut child = dedupscan()
        .args(["scan", s(&data), "--threads", "1", "-v", "--progress", "never", "--json", "--db", s(&db)])
        .spawn();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while err.read_line(&mut line).unwrap() > 0 && !line.contains("1/3 scan: started") {
        line.clear();
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(5), "stopped cleanly, with the exit status of a stopped run");
    let first: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    validate_report(&first);
    assert!(first["interrupted"].as_bool().unwrap(), "{first:#}");
    let done = num(&first, "files_hashed");
    assert!(done < n, "the scan finished before the signal: make the test data larger");
    integrity_ok(&db);
    // The next incremental run hashes exactly the rest.
    let second = run_json(&vol, &["scan", s(&data), "--incremental"]);
    assert!(!second["interrupted"].as_bool().unwrap());
    assert_eq!(num(&second, "files_hashed"), n - done, "{second:#}");
    assert_eq!(num(&second, "files_unchanged"), done);
}

#[test]
fn max_runtime_stops_cleanly() {
    let Some(vol) = Volume::new(Fs::Xfs, 1024) else { return };
    let data = vol.path("big");
    std::fs::create_dir(&data).unwrap();
    let mut rng = Rng::new(10);
    for i in 0..400 {
        std::fs::write(data.join(format!("f{i:03}")), rng.bytes(1 << 20)).unwrap();
    }
    vol.remount();
    let db = vol.db();
    // A stopped run exits 5.
    let r = dedupscan()
        .args(["scan", s(&data), "--threads", "1", "--max-runtime", "1ms", "--json", "--db", s(&db)])
        .expect(5)
        .run()
        .json;
    validate_report(&r);
    assert!(r["interrupted"].as_bool().unwrap(), "{r:#}");
    assert!(num(&r, "files_hashed") < 400);
    let r2 = run_json(&vol, &["scan", s(&data), "--incremental"]);
    assert_eq!(num(&r2, "files_hashed") + num(&r, "files_hashed"), 400);
}

#[test]
fn version_1_database_is_migrated_and_used() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let data = vol.path("d");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("a"), vec![7u8; 40_000]).unwrap();
    std::fs::write(data.join("b"), vec![7u8; 40_000]).unwrap();
    // A database as the previous release left it (schema version 1).
    let db = vol.db();
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch(dedupscan::db::migrate::MIGRATIONS[0]).unwrap();
        c.pragma_update(None, "user_version", 1).unwrap();
    }
    let r = run_json(&vol, &[s(&data)]);
    assert_eq!(num(&r, "files_hashed"), 2);
    assert!(num(&r, "deduped_bytes") > 0);
    let v: i64 = rusqlite::Connection::open(&db).unwrap().query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(v, dedupscan::db::migrate::CURRENT);
}

/// Schema v11 widened block maps (4 → 6 bytes a block): a v10 database's
/// maps cannot be read. `report` refuses it (read-only, it must not
/// upgrade) and says what to do; the next run upgrades it, says every file
/// is hashed again, and does so, even with `--incremental` on unchanged
/// files (the old build read them as 6-byte words: garbage groups).
#[test]
fn version_10_database_is_rehashed_after_the_upgrade_and_report_waits() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let data = vol.path("d");
    std::fs::create_dir(&data).unwrap();
    let x = Rng::new(10).bytes(40_960);
    std::fs::write(data.join("a"), &x).unwrap();
    std::fs::write(data.join("b"), &x).unwrap();
    let db = vol.db();
    let r = run_json(&vol, &["scan", s(&data)]);
    assert_eq!(num(&r, "files_hashed"), 2);
    rusqlite::Connection::open(&db).unwrap().pragma_update(None, "user_version", 10).unwrap();
    let out = dedupscan().args(["report"]).db(&db).expect(3).run();
    assert!(out.stderr.contains("schema version 10") && out.stderr.contains("run `dedupscan`"), "{}", out.stderr);
    let version = || -> i64 {
        rusqlite::Connection::open(&db).unwrap().query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap()
    };
    assert_eq!(version(), 10, "report upgraded the database");
    let out = dedupscan().arg(&data).arg("--incremental").json().db(&db).expect(0).run();
    assert!(
        out.stderr.contains("upgraded from schema version 10") && out.stderr.contains("hashed again"),
        "{}",
        out.stderr
    );
    let r = out.json;
    assert_eq!((num(&r, "files_hashed"), num(&r, "files_unchanged")), (2, 0), "{r:#}");
    assert_eq!(num(&r, "deduped_bytes"), 40_960, "{r:#}");
    assert_eq!(version(), dedupscan::db::migrate::CURRENT);
}

#[test]
fn corrupt_database_is_refused_and_left_untouched() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let data = vol.path("d");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("a"), b"x").unwrap();
    let db = vol.db();
    let garbage: Vec<u8> = Rng::new(4).bytes(65536);
    std::fs::write(&db, &garbage).unwrap();
    let err = dedupscan().arg(&data).db(&db).expect(3).run().stderr;
    assert!(err.contains("not readable as a dedupscan database") && err.contains(s(&db)), "{err}");
    assert!(err.contains("rebuild"), "the message must say what to do: {err}");
    assert_eq!(std::fs::read(&db).unwrap(), garbage, "the corrupt database was modified");
}

#[test]
fn database_of_another_filesystem_is_refused() {
    let (Some(x), Some(b)) = (Volume::new(Fs::Xfs, 320), Volume::new(Fs::Btrfs, 256)) else { return };
    for v in [&x, &b] {
        std::fs::write(v.path("f"), b"data").unwrap();
    }
    let db = x.db();
    dedupscan().arg(&x.mnt).db(&db).expect(0).run();
    let err = dedupscan().arg(&b.mnt).db(&db).expect(3).run().stderr;
    assert!(err.contains("describes filesystem"), "{err}");
    // Paths on two filesystems in one run are a usage error.
    dedupscan().arg(&x.mnt).arg(&b.mnt).expect(2).run();
}

#[test]
fn a_file_marked_nodedup_after_it_was_hashed_is_left_alone_and_forgotten() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let payload = Rng::new(31).bytes(300_000);
    for f in ["a", "b", "c"] {
        std::fs::write(d.join(f), &payload).unwrap();
    }
    run_json(&vol, &["scan", s(&d)]);
    // Mark b in place, and move c under a new name and mark it too.
    set_nodedup(&d.join("b"));
    std::fs::rename(d.join("c"), d.join("c2")).unwrap();
    set_nodedup(&d.join("c2"));
    let r = run_json(&vol, &[s(&d), "--incremental"]);
    assert_eq!(r["skipped"]["nodedup"].as_u64(), Some(2), "{r:#}");
    assert_eq!(num(&r, "deduped_bytes"), 0, "{r:#}");
    assert_eq!(shared_bytes(&d.join("b")) + shared_bytes(&d.join("c2")), 0);
    let sum = db_report(&vol);
    assert_eq!(sum["files"].as_u64(), Some(1), "protected files are forgotten: {sum:#}");
}

/// A cautious first run with a high `--min-range`, then the default: the
/// files did not change, but the ranges the first run found too short are
/// planned and shared now (an incremental plan used to take the files as
/// matched already). A third run with the same settings plans nothing.
#[test]
fn a_lower_min_range_plans_the_unchanged_files_again() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(37);
    let (mut a, mut b) = (rng.bytes(1 << 20), rng.bytes(1 << 20));
    // 32 KiB in common, at 256 KiB in a and 512 KiB in b.
    let common = rng.bytes(32 << 10);
    a[256 << 10..288 << 10].copy_from_slice(&common);
    b[512 << 10..544 << 10].copy_from_slice(&common);
    let (pa, pb) = (d.join("a"), d.join("b"));
    std::fs::write(&pa, &a).unwrap();
    std::fs::write(&pb, &b).unwrap();
    let before = Snapshot::take(&d);

    let r = run_json(&vol, &[s(&d), "--min-range", "64K"]);
    assert_eq!((num(&r, "ranges_planned"), num(&r, "deduped_bytes")), (0, 0), "{r:#}");
    let r = run_json(&vol, &[s(&d), "--incremental"]);
    assert_eq!((num(&r, "files_unchanged"), num(&r, "ranges_planned")), (2, 1), "{r:#}");
    assert!(same_physical(&pa, 256 << 10, &pb, 512 << 10, 32 << 10), "not shared: {r:#}");
    before.assert_same(&Snapshot::take(&d));
    let r = run_json(&vol, &[s(&d), "--incremental"]);
    assert_eq!(num(&r, "ranges_planned"), 0, "planned again with the same settings: {r:#}");
}

/// A run over part of the tree matches its new files against that part
/// only. Nightly runs over the whole tree, a run by hand over `a` in
/// between that finds a new file there: the copy of it in `b` is shared by
/// the next nightly run (it was taken as matched by the run over `a`, and
/// never shared). And the run over `a` builds on the nightly one: an
/// unchanged tree plans nothing.
#[test]
fn a_run_over_part_of_the_tree_does_not_hide_copies_elsewhere() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let (top, a, b) = (vol.path("srv"), vol.path("srv/a"), vol.path("srv/b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let mut rng = Rng::new(41);
    std::fs::write(a.join("old"), rng.bytes(200_000)).unwrap();
    let data = rng.bytes(300_000);
    std::fs::write(b.join("copy"), &data).unwrap();
    let r = run_json(&vol, &[s(&top)]);
    assert_eq!(num(&r, "ranges_planned"), 0, "{r:#}");
    let r = run_json(&vol, &[s(&a), "--incremental"]);
    assert_eq!((num(&r, "files_hashed"), num(&r, "ranges_planned")), (0, 0), "nothing new under a: {r:#}");

    std::fs::write(a.join("new"), &data).unwrap();
    let r = run_json(&vol, &[s(&a), "--incremental"]);
    assert_eq!((num(&r, "files_hashed"), num(&r, "ranges_planned")), (1, 0), "its copy is not under a: {r:#}");
    let before = Snapshot::take(&top);
    let r = run_json(&vol, &[s(&top), "--incremental"]);
    assert_eq!((num(&r, "files_hashed"), num(&r, "ranges_planned")), (0, 1), "{r:#}");
    assert!(same_physical(&a.join("new"), 0, &b.join("copy"), 0, 300_000), "not shared: {r:#}");
    before.assert_same(&Snapshot::take(&top));
    let r = run_json(&vol, &[s(&top), "--incremental"]);
    assert_eq!(num(&r, "ranges_planned"), 0, "{r:#}");
}

/// A file written through a shared memory mapping to a page already dirty
/// changes no time: its size, mtime and ctime say "unchanged", its
/// recorded fingerprints say "the old contents". Here `f` is hashed as X,
/// then becomes Y that way; `h` holds X, `g` holds Y. The run that plans
/// `f` with `h` finds them different (the kernel's compare, or a dry run's
/// own) and has the next run read both again, which then shares `f` with
/// `g`. Before, `f` kept its stale fingerprints until it changed again:
/// `g` was never shared with it. One-block files, which the scan reads
/// without mapping them (a FIEMAP with its sync flag would have written the
/// page back, and the next write through the mapping would then have moved
/// the times).
fn stale_fingerprints_are_read_again(fs: Fs, dry_run: bool) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(43);
    let (x, y) = (rng.bytes(4096), rng.bytes(4096));
    std::fs::write(d.join("h"), &x).unwrap();
    std::fs::write(d.join("g"), &y).unwrap();
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(d.join("f")).unwrap();
    f.set_len(4096).unwrap();
    // SAFETY: a fresh shared mapping of the 4096 bytes `f` now has, unmapped below.
    let map = unsafe {
        libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0)
    };
    assert_ne!(map, libc::MAP_FAILED);
    // SAFETY: `map` is 4096 writable bytes.
    let page = unsafe { std::slice::from_raw_parts_mut(map as *mut u8, 4096) };
    page.copy_from_slice(&x);
    let r = run_json(&vol, &["scan", s(&d)]);
    assert_eq!(num(&r, "files_hashed"), 3, "{r:#}");
    let times = |m: std::fs::Metadata| (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec());
    let was = times(f.metadata().unwrap());
    page.copy_from_slice(&y);
    // SAFETY: unmapping the mapping made above; `page` is not used again.
    assert_eq!(unsafe { libc::munmap(map, 4096) }, 0);
    assert_eq!(times(f.metadata().unwrap()), was, "the kernel moved the times: this test no longer sets up its case");
    drop(f);
    let before = Snapshot::take(&d);

    let mut args = vec![s(&d), "--incremental"];
    if dry_run {
        args.push("--dry-run");
    }
    let r = run_json(&vol, &args);
    assert_eq!((num(&r, "files_unchanged"), num(&r, "ranges_planned")), (3, 1), "{r:#}");
    assert_eq!((r["dedupe_status"]["differs"].as_u64(), num(&r, "files_stale")), (Some(1), 2), "{r:#}");
    let r = run_json(&vol, &[s(&d), "--incremental"]);
    assert_eq!((num(&r, "files_hashed"), num(&r, "ranges_planned")), (2, 1), "f and h not read again: {r:#}");
    assert_eq!((num(&r, "files_stale"), num(&r, "deduped_bytes")), (0, 4096), "{r:#}");
    assert!(same_physical(&d.join("f"), 0, &d.join("g"), 0, 4096), "f not shared with g: {r:#}");
    before.assert_same(&Snapshot::take(&d));
    let r = run_json(&vol, &[s(&d), "--incremental"]);
    assert_eq!((num(&r, "files_hashed"), num(&r, "ranges_planned")), (0, 0), "{r:#}");
}

#[test]
fn xfs_a_file_changed_through_a_mapping_is_read_again_after_its_share_failed() {
    stale_fingerprints_are_read_again(Fs::Xfs, false);
}

#[test]
fn btrfs_a_file_changed_through_a_mapping_is_read_again_after_a_dry_run() {
    stale_fingerprints_are_read_again(Fs::Btrfs, true);
}
