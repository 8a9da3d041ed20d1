//! Schema migrations: numbered SQL files in `schema/`, applied in order,
//! tracked with `PRAGMA user_version`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rusqlite::{params, Connection, Transaction};

use crate::sys::fs::{open_dir, unproven_key, SubvolIds};

use super::DbError;

/// Every migration, in order: `MIGRATIONS[i]` takes the schema from version
/// `i` to `i + 1`. Never edit a released entry; add a new file.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../../schema/0001_initial.sql"),
    include_str!("../../schema/0002_hashed_run.sql"),
    include_str!("../../schema/0003_compact_fingerprints.sql"),
    include_str!("../../schema/0004_small_database.sql"),
    include_str!("../../schema/0005_fs_state.sql"),
    include_str!("../../schema/0006_no_anchors.sql"),
    include_str!("../../schema/0007_files_by_inode.sql"),
    include_str!("../../schema/0008_pinned.sql"),
    include_str!("../../schema/0009_kept_out.sql"),
    include_str!("../../schema/0010_runs_without_lists.sql"),
    include_str!("../../schema/0011_wider_fingerprints.sql"),
    include_str!("../../schema/0012_shared_runs.sql"),
    include_str!("../../schema/0013_too_large.sql"),
    include_str!("../../schema/0014_zeros_held.sql"),
    include_str!("../../schema/0015_pending_by_reason.sql"),
    include_str!("../../schema/0016_sources.sql"),
];

/// The schema version this build writes.
pub const CURRENT: i64 = MIGRATIONS.len() as i64;

/// Bring `conn` up to [`CURRENT`], each step in its own transaction.
/// A database from a newer dedupscan is refused, never rewritten. Returns
/// the version found (0: a new database).
pub fn migrate(conn: &mut Connection) -> Result<i64, DbError> {
    migrate_to(conn, CURRENT)
}

/// The last migration that drops every file's block map (v11: 48-bit
/// fingerprints), so a run on a database found older hashes every file.
pub const MAPS_DROPPED_AT: i64 = 11;

/// [`migrate`], stopping at version `target` (tests of one step).
pub(super) fn migrate_to(conn: &mut Connection, target: i64) -> Result<i64, DbError> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > CURRENT {
        return Err(DbError::TooNew { found: version, supported: CURRENT });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().take(target as usize).skip(version as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        if i + 1 == 5 {
            rekey_dirs(&tx)?;
        }
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(version)
}

/// Version 5: `dirs.dev` turns from `st_dev` into the volume key (btrfs
/// subvolume id; see [`crate::sys::fs::volume_key`]), without rehashing.
/// This runs when a run opens the database, so the volume is mounted: each
/// stored `st_dev` is proved by opening one of its directories (a few are
/// tried) and finding that `st_dev` on it now; the directory then names the
/// key. A `st_dev` that cannot be proved (unmounted, moved, or handed to
/// another subvolume since) is marked unproven: its files are hashed again
/// by the next run rather than taken for files they may not be.
fn rekey_dirs(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    let devs: Vec<i64> =
        tx.prepare("SELECT DISTINCT dev FROM dirs")?.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?;
    let mut keys = SubvolIds::new();
    tx.execute_batch("CREATE TEMP TABLE rekey (old INTEGER PRIMARY KEY, new INTEGER NOT NULL)")?;
    for dev in devs {
        let paths: Vec<Vec<u8>> = tx
            .prepare("SELECT path FROM dirs WHERE dev = ?1 LIMIT 8")?
            .query_map([dev], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let proved = paths.iter().find_map(|p| {
            let dir = open_dir(Path::new(OsStr::from_bytes(p))).ok()?;
            let k = keys.id_for(dev as u64, &dir);
            (k != unproven_key(dev as u64)).then_some(k)
        });
        let new = proved.unwrap_or(unproven_key(dev as u64));
        tx.execute("INSERT INTO rekey (old, new) VALUES (?1, ?2)", params![dev, new as i64])?;
    }
    // One statement, so a new key equal to another row's old st_dev is
    // never converted twice.
    tx.execute_batch("UPDATE dirs SET dev = (SELECT new FROM rekey WHERE old = dirs.dev); DROP TABLE rekey;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_database_reaches_current_version_and_rerun_is_a_noop() {
        let mut c = Connection::open_in_memory().unwrap();
        migrate(&mut c).unwrap();
        migrate(&mut c).unwrap();
        let v: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert_eq!(v, CURRENT);
    }

    #[test]
    fn version_1_database_is_migrated_in_place() {
        let mut c = at_version(1);
        c.execute(
            "INSERT INTO files (dev, ino, path, size, mtime_ns, ctime_ns, digest, blocks) VALUES (1, 2, x'2f61', 3, 4, 5, x'00', x'00')",
            [],
        )
        .unwrap();
        c.execute("INSERT INTO runs (started_at, command, dry_run) VALUES (1, 'run', 0)", []).unwrap();
        migrate(&mut c).unwrap();
        let cols: Vec<String> = c
            .prepare("SELECT name FROM pragma_table_info('files')")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(cols.contains(&"hashed_run".to_owned()), "v2 added hashed_run: {cols:?}");
        // v3 and v4 drop fingerprints in the old format (rehashed once), keep history.
        let files: i64 = c.query_row("SELECT count(*) FROM files", [], |r| r.get(0)).unwrap();
        let runs: i64 = c.query_row("SELECT count(*) FROM runs", [], |r| r.get(0)).unwrap();
        assert_eq!((files, runs), (0, 1));
    }

    /// A database as a build of schema `version` left it (its migrations
    /// applied, nothing more).
    fn at_version(version: i64) -> Connection {
        let mut c = Connection::open_in_memory().unwrap();
        migrate_to(&mut c, version).unwrap();
        c
    }

    #[test]
    fn version_4_dirs_are_rekeyed_without_losing_files() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let dev = std::fs::metadata(d.path()).unwrap().dev() as i64;
        let mut c = at_version(4);
        let here = d.path().as_os_str().as_bytes();
        c.execute("INSERT INTO dirs (id, dev, path) VALUES (1, ?1, ?2)", params![dev, here]).unwrap();
        c.execute("INSERT INTO dirs (id, dev, path) VALUES (2, ?1, x'2f6e6f2f73756368')", params![dev + 1]).unwrap();
        c.execute(
            "INSERT INTO files (dir, name, ino, size, mtime, ctime, hashed_run, blocks) VALUES (1, x'61', 7, 1, 0, 0, 1, x'00')",
            [],
        )
        .unwrap();
        migrate_to(&mut c, 10).unwrap();
        let key =
            |id: i64| c.query_row("SELECT dev FROM dirs WHERE id = ?1", [id], |r| r.get::<_, i64>(0)).unwrap() as u64;
        let want = crate::sys::volume_key(std::os::fd::AsFd::as_fd(&open_dir(d.path()).unwrap())).unwrap();
        assert_eq!(key(1), want, "proved by its directory");
        assert_eq!(key(2), unproven_key(dev as u64 + 1), "cannot be proved: marked, rehashed next run");
        let files: i64 = c.query_row("SELECT count(*) FROM files", [], |r| r.get(0)).unwrap();
        assert_eq!(files, 1, "nothing dropped");
    }

    #[test]
    fn version_5_anchors_are_dropped_and_nothing_else() {
        let mut c = at_version(5);
        c.execute(
            "INSERT INTO files (dir, name, ino, size, mtime, ctime, hashed_run, blocks) VALUES (1, x'61', 7, 1, 0, 0, 1, x'00')",
            [],
        )
        .unwrap();
        c.execute("INSERT INTO anchors (fp, file_id, blk) VALUES (16, 1, 0)", []).unwrap();
        migrate_to(&mut c, 10).unwrap();
        let tables: i64 =
            c.query_row("SELECT count(*) FROM sqlite_schema WHERE name = 'anchors'", [], |r| r.get(0)).unwrap();
        let files: i64 = c.query_row("SELECT count(*) FROM files", [], |r| r.get(0)).unwrap();
        assert_eq!((tables, files), (0, 1));
    }

    #[test]
    fn version_9_reports_lose_their_list_and_nothing_else() {
        let mut c = at_version(9);
        let listed = r#"{"ranges_planned":2,"freed_bytes":4096,"ranges":[{"source":"/a","bytes":4096}]}"#;
        for report in [Some(listed), Some(r#"{"ranges_planned":0}"#), Some("not json"), None] {
            c.execute("INSERT INTO runs (started_at, command, dry_run, report) VALUES (1, 'run', 0, ?1)", [report])
                .unwrap();
        }
        migrate(&mut c).unwrap();
        let reports: Vec<Option<String>> = (c.prepare("SELECT report FROM runs ORDER BY id").unwrap())
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let want = [r#"{"ranges_planned":2,"freed_bytes":4096}"#, r#"{"ranges_planned":0}"#, "not json"];
        assert_eq!(reports, want.iter().map(|s| Some(s.to_string())).chain([None]).collect::<Vec<_>>());
    }

    #[test]
    fn version_10_maps_are_dropped_and_the_history_kept() {
        let mut c = at_version(10);
        c.execute_batch(
            "INSERT INTO dirs (id, dev, path) VALUES (1, 5, x'2f61');
             INSERT INTO files (id, dir, name, ino, size, mtime, ctime, hashed_run, blocks)
                 VALUES (1, 1, x'62', 7, 4096, 1, 1, 1, x'01000000');
             INSERT INTO pinned VALUES (1, 'compressed', 4096, 1, 1);
             INSERT INTO kept_out VALUES (1, 1);
             INSERT INTO runs (started_at, command, dry_run, report) VALUES (1, 'run', 0, '{}');
             INSERT INTO meta VALUES ('block_size', '4096'), ('last_complete_share_run', '1');",
        )
        .unwrap();
        migrate(&mut c).unwrap();
        let count = |t: &str| -> i64 { c.query_row(&format!("SELECT count(*) FROM {t}"), [], |r| r.get(0)).unwrap() };
        let gone = ["files", "dirs", "pinned", "kept_out"].map(count);
        assert_eq!((gone, count("runs"), count("meta WHERE key = 'block_size'")), ([0; 4], 1, 1));
        assert_eq!(count("meta WHERE key = 'last_complete_share_run'"), 0);
    }

    #[test]
    fn version_14_pending_rows_are_kept_and_a_file_may_then_have_two() {
        let mut c = at_version(14);
        c.execute_batch("INSERT INTO pending VALUES (1, 'referenced_outside_run', 65536, 3), (2, 'keep_free', 5, 3);")
            .unwrap();
        migrate(&mut c).unwrap();
        c.execute("INSERT INTO pending VALUES (1, 'zeros_referenced_outside_run', 15728640, 4)", []).unwrap();
        let rows: Vec<(i64, String, i64, i64)> = (c.prepare("SELECT * FROM pending ORDER BY file_id, reason").unwrap())
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let row = |id, why: &str, b, run| (id, why.to_owned(), b, run);
        let want = [
            row(1, "referenced_outside_run", 65536, 3),
            row(1, "zeros_referenced_outside_run", 15728640, 4),
            row(2, "keep_free", 5, 3),
        ];
        assert_eq!(rows, want);
        let twice = c.execute("INSERT INTO pending VALUES (2, 'keep_free', 9, 4)", []);
        assert!(twice.is_err(), "one row per file and reason");
    }

    /// A holder recorded by version 14 has no state: its file is tried
    /// again once. The step also runs again on its own result (a current
    /// database marked older, as `tests/incremental.rs` does).
    #[test]
    fn version_14_holders_are_kept_without_a_state_and_the_step_runs_twice() {
        let mut c = at_version(14);
        c.execute("INSERT INTO zeros_held VALUES (1, 258, 257, 3)", []).unwrap();
        migrate(&mut c).unwrap();
        c.execute("INSERT INTO pending VALUES (1, 'zeros_referenced_outside_run', 8, 3)", []).unwrap();
        c.pragma_update(None, "user_version", 14).unwrap();
        migrate(&mut c).unwrap();
        let held: (i64, i64, i64, i64, Option<i64>, Option<i64>) = c
            .query_row("SELECT * FROM zeros_held", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
            })
            .unwrap();
        assert_eq!(held, (1, 258, 257, 3, None, None));
        // A second holder of the same file gets a row of its own.
        c.execute("INSERT INTO zeros_held VALUES (1, 259, 300, 4, 7, 8)", []).unwrap();
        let pending: i64 = c.query_row("SELECT count(*) FROM pending", [], |r| r.get(0)).unwrap();
        assert_eq!(pending, 1);
    }

    #[test]
    fn newer_database_is_refused() {
        let mut c = Connection::open_in_memory().unwrap();
        c.pragma_update(None, "user_version", CURRENT + 1).unwrap();
        assert!(matches!(migrate(&mut c), Err(DbError::TooNew { .. })));
    }
}
