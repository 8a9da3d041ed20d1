//! The `too_large` table (`schema/0013_too_large.sql`): files a run read
//! and refused because their block map is past the bound, so that later
//! runs refuse them unread while they are unchanged (`hash::refused`).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use rusqlite::{params, Connection};

use super::{path_bytes, Db};
use crate::file::{FileFacts, FileKey};
use crate::hash::refused::TooLarge;

impl Db {
    /// Every recorded refusal (a handful at most: one per file of
    /// hundreds of GiB of data). None in a database from before v13,
    /// which `report` reads as it is.
    pub fn too_large(&self) -> rusqlite::Result<Vec<TooLarge>> {
        let Ok(mut st) = self.conn.prepare("SELECT dev, ino, size, mtime, ctime, path, run FROM too_large") else {
            return Ok(Vec::new());
        };
        let rows = st.query_map([], |r| {
            Ok(TooLarge {
                key: FileKey { volume: r.get::<_, i64>(0)? as u64, ino: r.get::<_, i64>(1)? as u64 },
                size: r.get::<_, i64>(2)? as u64,
                mtime: r.get(3)?,
                ctime: r.get(4)?,
                path: PathBuf::from(OsStr::from_bytes(r.get_ref(5)?.as_blob()?)),
                run: r.get(6)?,
            })
        })?;
        rows.collect()
    }

    /// Drop the refusals of `keys` (files changed or gone: see
    /// `hash::refused::Refused::stale`).
    pub fn drop_too_large(&self, keys: &[FileKey]) -> rusqlite::Result<()> {
        let tx = self.conn.unchecked_transaction()?;
        for k in keys {
            tx.prepare_cached("DELETE FROM too_large WHERE dev = ?1 AND ino = ?2")?
                .execute(params![k.volume as i64, k.ino as i64])?;
        }
        tx.commit()
    }
}

/// Record that run `run` read `file` and refused it (the writer's
/// `WriteOp::TooLarge`), replacing an older refusal of the same inode.
pub(super) fn record(conn: &Connection, file: &FileFacts, run: i64) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO too_large (dev, ino, size, mtime, ctime, path, run) VALUES (?1,?2,?3,?4,?5,?6,?7)",
    )?
    .execute(params![
        file.key.volume as i64,
        file.key.ino as i64,
        file.size as i64,
        file.mtime,
        file.ctime,
        path_bytes(&file.path),
        run
    ])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_recorded_replaced_and_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db"), "u").unwrap();
        let key = FileKey { volume: 7, ino: 42 };
        let file = FileFacts { path: "/v/image".into(), key, size: 1 << 40, mtime: -3, ctime: 4 };
        record(&db.conn, &file, 1).unwrap();
        record(&db.conn, &FileFacts { size: 2 << 40, ..file.clone() }, 2).unwrap();
        let rows = db.too_large().unwrap();
        assert_eq!(rows.len(), 1, "one row per inode");
        let r = &rows[0];
        assert_eq!((r.key, r.size, r.mtime, r.ctime, r.run), (key, 2 << 40, -3, 4, 2));
        assert_eq!(r.path, file.path);
        db.drop_too_large(&[key]).unwrap();
        assert!(db.too_large().unwrap().is_empty());
    }
}
