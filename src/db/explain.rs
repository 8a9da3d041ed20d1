//! Database errors as the operator reads them: which database, and what
//! to do about it. Here rather than in `progress` (which prints them) so
//! that the base modules need not know the database's error type.

use crate::display::display_path;
use crate::progress::error_text;

use super::DbError;

/// A database error with what to do about it: the path of the database
/// and, by SQLite's error code, the advice that fits (a damaged file is
/// moved aside and rebuilt; a full disk or a permission problem is fixed
/// where it is). Errors that already say it (`DbError`) pass unchanged.
pub fn explain_db_error(path: &std::path::Path, e: anyhow::Error) -> anyhow::Error {
    use rusqlite::ErrorCode as C;
    // Those that say it already; a bare SQLite error inside one does not.
    if e.downcast_ref::<DbError>().is_some_and(|d| !matches!(d, DbError::Sqlite(_))) {
        return e;
    }
    let sqlite = |c: &(dyn std::error::Error + 'static)| -> Option<Option<C>> {
        let s = c.downcast_ref::<rusqlite::Error>().or(match c.downcast_ref::<DbError>() {
            Some(DbError::Sqlite(s)) => Some(s),
            _ => None,
        })?;
        Some(s.sqlite_error_code())
    };
    let Some(code) = e.chain().find_map(sqlite) else {
        return e;
    };
    let p = display_path(path);
    let advice = match code {
        Some(C::DatabaseCorrupt) | Some(C::NotADatabase) => format!(
            "the database is damaged; move it aside (e.g. `mv {p} {p}.broken`) and run again to rebuild it from a full scan"
        ),
        Some(C::DiskFull) => format!("the disk holding {p} is full; free space there or point --db elsewhere"),
        Some(C::ReadOnly) | Some(C::PermissionDenied) | Some(C::CannotOpen) => {
            format!("check that {p} and its directory are writable by this user (run as root)")
        }
        Some(C::DatabaseBusy) | Some(C::DatabaseLocked) => {
            "another process holds the database; try again when it has finished".to_owned()
        }
        _ => format!("if it persists, move {p} aside and run again to rebuild it from a full scan"),
    };
    let text = error_text(&e);
    anyhow::anyhow!("database {p}: {text}; {advice}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_errors_say_where_and_what_to_do() {
        let db = std::path::Path::new("/var/lib/dedupscan/x.sqlite");
        let sqlite = |code| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
        let e = explain_db_error(db, DbError::Sqlite(sqlite(rusqlite::ffi::SQLITE_CORRUPT)).into());
        let t = error_text(&e);
        assert!(t.starts_with("database /var/lib/dedupscan/x.sqlite: ") && t.contains("move it aside"), "{t}");
        let t = error_text(&explain_db_error(db, anyhow::Error::new(sqlite(rusqlite::ffi::SQLITE_FULL))));
        assert!(t.contains("is full"), "{t}");
        // Errors that already say what to do pass unchanged.
        let locked = DbError::Locked { path: db.to_owned() };
        let e = explain_db_error(db, locked.into());
        assert!(matches!(e.downcast_ref::<DbError>(), Some(DbError::Locked { .. })));
        // Other errors too.
        assert_eq!(error_text(&explain_db_error(db, anyhow::anyhow!("x"))), "x");
    }
}
