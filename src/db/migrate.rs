//! Schema migrations: numbered SQL files in `schema/`, applied in order,
//! tracked with `PRAGMA user_version`.

use rusqlite::Connection;

use super::DbError;

/// Every migration, in order: `MIGRATIONS[i]` takes the schema from version
/// `i` to `i + 1`. Never edit a released entry; add a new file.
pub const MIGRATIONS: &[&str] = &[include_str!("../../schema/0001_initial.sql")];

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
    fn newer_database_is_refused() {
        let mut c = Connection::open_in_memory().unwrap();
        c.pragma_update(None, "user_version", CURRENT + 1).unwrap();
        assert!(matches!(migrate(&mut c), Err(DbError::TooNew { .. })));
    }
}
