//! Schema migrations: numbered SQL files in `schema/`, applied in order,
//! tracked with `PRAGMA user_version`.

use rusqlite::Connection;

use super::DbError;

/// Every migration, in order: `MIGRATIONS[i]` takes the schema from version
/// `i` to `i + 1`. Never edit a released entry; add a new file.
pub const MIGRATIONS: &[&str] =
    &[include_str!("../../schema/0001_initial.sql"), include_str!("../../schema/0002_hashed_run.sql")];

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
        migrate(&mut c).unwrap();
        let (n, run): (i64, i64) =
            c.query_row("SELECT count(*), max(hashed_run) FROM files", [], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
        assert_eq!((n, run), (1, 0), "rows survive the migration with the default");
    }

    #[test]
    fn newer_database_is_refused() {
        let mut c = Connection::open_in_memory().unwrap();
        c.pragma_update(None, "user_version", CURRENT + 1).unwrap();
        assert!(matches!(migrate(&mut c), Err(DbError::TooNew { .. })));
    }
}
