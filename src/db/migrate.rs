//! Schema migrations: numbered SQL files in `schema/`, applied in order,
//! tracked with `PRAGMA user_version`.

use rusqlite::Connection;

use super::DbError;

/// Every migration, in order: `MIGRATIONS[i]` takes the schema from version
/// `i` to `i + 1`. Never edit a released entry; add a new file.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../../schema/0001_initial.sql"),
    include_str!("../../schema/0002_hashed_run.sql"),
    include_str!("../../schema/0003_compact_fingerprints.sql"),
    include_str!("../../schema/0004_small_database.sql"),
];

/// The schema version this build writes.
pub const CURRENT: i64 = MIGRATIONS.len() as i64;

/// Bring `conn` up to [`CURRENT`], each step in its own transaction.
/// A database from a newer dedupscan is refused, never rewritten.
pub fn migrate(conn: &mut Connection) -> Result<(), DbError> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > CURRENT {
        return Err(DbError::TooNew { found: version, supported: CURRENT });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
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
        let mut c = Connection::open_in_memory().unwrap();
        c.execute_batch(MIGRATIONS[0]).unwrap();
        c.pragma_update(None, "user_version", 1).unwrap();
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

    #[test]
    fn newer_database_is_refused() {
        let mut c = Connection::open_in_memory().unwrap();
        c.pragma_update(None, "user_version", CURRENT + 1).unwrap();
        assert!(matches!(migrate(&mut c), Err(DbError::TooNew { .. })));
    }
}
