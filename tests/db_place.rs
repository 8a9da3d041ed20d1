//! Where the database may live, on real volumes: a database another user
//! could redirect or read is refused before anything is opened there
//! (`src/db/place.rs`), and a database inside the scanned tree is never
//! hashed, from the first run on.

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::{chown, lchown, symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use common::*;
use dedupscan::corpus::Rng;

/// The unprivileged user playing the attacker.
const NOBODY: u32 = 65534;

/// The names in directory `d`.
fn names(d: &Path) -> BTreeSet<String> {
    std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A run with `--db db` on `tree` is refused with exit code 3, a message
/// naming `db` and containing `why`, and leaves `dirs` as they were.
fn assert_refused(tree: &Path, db: &Path, why: &str, dirs: &[&Path]) {
    let before: Vec<_> = dirs.iter().map(|d| names(d)).collect();
    // `report` says "no database" where there is none.
    let report = db.symlink_metadata().is_ok().then(|| vec!["report".as_ref()]);
    for args in std::iter::once(vec![tree.as_os_str()]).chain(report) {
        let err = dedupscan().args(args).db(db).expect(3).run().stderr;
        assert!(err.contains("refusing database") && err.contains(s(db)) && err.contains(why), "want {why:?}: {err}");
    }
    for (d, was) in dirs.iter().zip(before) {
        assert_eq!(names(d), was, "files created in {}", d.display());
    }
}

/// The repro of the report: root's `--db` in a directory an unprivileged
/// user owns, where that user planted a symlink to their own file, or
/// dangling symlinks at the database or its lock; then the same symlinks
/// in a private directory (only root could put them there, but they must
/// not be followed either); a world-writable sticky directory; a database
/// file of another user; and `report` on a database whose directory became
/// writable by others.
fn others_cannot_redirect_or_read_the_database(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let r = vol.path("t7");
    std::fs::create_dir_all(r.join("rootonly")).unwrap();
    chmod(&r.join("rootonly"), 0o700);
    std::fs::write(r.join("rootonly/secret-name.txt"), b"s").unwrap();
    let data = Rng::new(7).bytes(1 << 20);
    std::fs::write(r.join("a"), &data).unwrap();
    std::fs::write(r.join("b"), &data).unwrap();
    chown(&r, Some(NOBODY), Some(NOBODY)).unwrap();
    let atk = tempfile::Builder::new().prefix("dedupscan-atk-").tempdir_in("/var/tmp").unwrap();
    let atk = atk.path();
    chown(atk, Some(NOBODY), None).unwrap();
    let leak = atk.join("leak");
    std::fs::write(&leak, b"").unwrap();
    chown(&leak, Some(NOBODY), None).unwrap();
    let plant = |target: &Path, at: &Path| {
        symlink(target, at).unwrap();
        lchown(at, Some(NOBODY), Some(NOBODY)).unwrap();
    };

    // In the attacker's directory: a symlink to their file.
    let db = r.join("dd.sqlite");
    plant(&leak, &db);
    assert_refused(&r, &db, "owned by uid 65534", &[&r, atk]);
    // Dangling symlinks at the database and at its lock.
    std::fs::remove_file(&db).unwrap();
    plant(&atk.join("made-db"), &db);
    plant(&atk.join("made-lock"), &r.join("dd.sqlite.lock"));
    assert_refused(&r, &db, "owned by uid 65534", &[&r, atk]);

    // The same names in a private directory: not followed either.
    let safe = vol.path("safe");
    std::fs::create_dir(&safe).unwrap();
    chmod(&safe, 0o700);
    let db = safe.join("dd.sqlite");
    symlink(&leak, &db).unwrap();
    assert_refused(&r, &db, "symbolic link", &[&safe, atk]);
    std::fs::remove_file(&db).unwrap();
    symlink(atk.join("made-lock"), safe.join("dd.sqlite.lock")).unwrap();
    assert_refused(&r, &db, "symbolic link", &[&safe, atk]);
    std::fs::remove_file(safe.join("dd.sqlite.lock")).unwrap();
    // A database file another user made.
    std::fs::write(&db, b"").unwrap();
    chown(&db, Some(NOBODY), None).unwrap();
    assert_refused(&r, &db, "owned by uid 65534", &[&safe, atk]);
    std::fs::remove_file(&db).unwrap();
    assert_eq!(std::fs::read(&leak).unwrap(), b"", "root wrote into the attacker's file");

    // A world-writable directory, sticky or not.
    let shared = vol.path("shared");
    std::fs::create_dir(&shared).unwrap();
    for mode in [0o1777, 0o777, 0o770] {
        chmod(&shared, mode);
        assert_refused(&r, &shared.join("dd.sqlite"), "writable by others", &[&shared]);
    }

    // A normal run works, and its database is refused once its directory
    // is opened to others (`report` reads every path too).
    let out = dedupscan().arg(&r).db(&db).json().expect(0).run().json;
    assert_eq!(num(&out, "deduped_bytes"), 1 << 20, "{out:#}");
    dedupscan().arg("report").db(&db).expect(0).run();
    chmod(&safe, 0o777);
    assert_refused(&r, &db, "writable by others", &[&safe]);
    chmod(&safe, 0o700);
    dedupscan().arg("report").db(&db).expect(0).run();
}

#[test]
fn xfs_others_cannot_redirect_or_read_the_database() {
    others_cannot_redirect_or_read_the_database(Fs::Xfs);
}

#[test]
fn btrfs_others_cannot_redirect_or_read_the_database() {
    others_cannot_redirect_or_read_the_database(Fs::Btrfs);
}

/// The file names of the `files` table of the database `db`.
fn recorded_names(db: &Path) -> Vec<String> {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut st = c.prepare("SELECT name FROM files").unwrap();
    let rows = st.query_map([], |r| r.get::<_, Vec<u8>>(0)).unwrap();
    rows.map(|n| String::from_utf8_lossy(&n.unwrap()).into_owned()).collect()
}

/// `--db` inside the scanned tree, at its top and in a subdirectory the
/// run creates (so listed after the database exists): the first run hashes
/// none of the database's files (itself, `-wal`, `-shm`, `.lock`: all four
/// exist while the crawl runs) and counts them `own_database`; so does the
/// next.
fn database_inside_the_tree_is_never_hashed(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    for (tree, rel) in [("t20", "dd.sqlite"), ("t21", "state/sub/dd.sqlite")] {
        let t = vol.path(tree);
        std::fs::create_dir_all(t.join("c")).unwrap();
        let data = Rng::new(20).bytes(256 << 10);
        for f in ["a", "b", "c/d"] {
            std::fs::write(t.join(f), &data).unwrap();
        }
        std::fs::write(t.join("u"), Rng::new(21).bytes(256 << 10)).unwrap();
        let db: PathBuf = t.join(rel);
        for run in ["first", "second"] {
            let r = dedupscan().arg(&t).db(&db).json().expect(0).run().json;
            validate_report(&r);
            let want = if run == "first" { 4 } else { 0 };
            assert_eq!(num(&r, "files_hashed"), want, "{rel}, {run} run: {r:#}");
            assert_eq!(r["skipped"]["own_database"].as_u64(), Some(4), "{rel}, {run} run: {r:#}");
            assert_eq!(r["skipped"]["empty"], serde_json::Value::Null, "the lock is counted as the database's");
            let recorded = recorded_names(&db);
            assert_eq!(recorded.len(), 4, "{rel}, {run} run: {recorded:?}");
            assert!(!recorded.iter().any(|n| n.starts_with("dd.sqlite")), "{rel}, {run} run: {recorded:?}");
        }
    }
}

#[test]
fn xfs_database_inside_the_tree_is_never_hashed() {
    database_inside_the_tree_is_never_hashed(Fs::Xfs);
}

#[test]
fn btrfs_database_inside_the_tree_is_never_hashed() {
    database_inside_the_tree_is_never_hashed(Fs::Btrfs);
}

/// A symlink another user planted on the way to `--db`: in a sticky
/// world-writable directory (`/tmp`, with `fs.protected_symlinks` off) or
/// in their own directory, pointing at a root-owned directory of their
/// choosing (`/etc/cron.d`, say). Resolved blindly, the path ended in that
/// directory, which passed every check; root then created the database
/// there, and the directories still missing below it. Refused, and nothing
/// is created; a symlink root owns in the sticky directory is followed.
fn a_symlink_another_user_planted_on_the_way_is_not_followed(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let t = vol.path("t22");
    std::fs::create_dir(&t).unwrap();
    let data = Rng::new(22).bytes(256 << 10);
    std::fs::write(t.join("a"), &data).unwrap();
    std::fs::write(t.join("b"), &data).unwrap();
    let top = tempfile::Builder::new().prefix("dedupscan-atk-").tempdir_in("/var/tmp").unwrap();
    let (sticky, own, target) = (top.path().join("tmp"), top.path().join("home"), top.path().join("rootonly"));
    for d in [&sticky, &own, &target] {
        std::fs::create_dir(d).unwrap();
    }
    chmod(&sticky, 0o1777);
    chmod(&target, 0o700);
    chown(&own, Some(NOBODY), Some(NOBODY)).unwrap();
    for at in [sticky.join("dbdir"), own.join("state")] {
        symlink(&target, &at).unwrap();
        lchown(&at, Some(NOBODY), Some(NOBODY)).unwrap();
        for db in [at.join("dd.sqlite"), at.join("new/dd.sqlite")] {
            assert_refused(&t, &db, "symbolic link owned by uid 65534", &[&target]);
        }
    }
    let mine = sticky.join("rootlink");
    symlink(&target, &mine).unwrap();
    let r = dedupscan().arg(&t).db(mine.join("dd.sqlite")).json().expect(0).run().json;
    assert_eq!(num(&r, "deduped_bytes"), 256 << 10, "{r:#}");
    assert!(target.join("dd.sqlite").exists());
}

#[test]
fn xfs_a_symlink_another_user_planted_on_the_way_is_not_followed() {
    a_symlink_another_user_planted_on_the_way_is_not_followed(Fs::Xfs);
}

#[test]
fn btrfs_a_symlink_another_user_planted_on_the_way_is_not_followed() {
    a_symlink_another_user_planted_on_the_way_is_not_followed(Fs::Btrfs);
}
