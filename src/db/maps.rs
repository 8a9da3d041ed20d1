//! The rows planning reads: block maps, streamed one file at a time.
//!
//! Only queries live here; every grouping decision is the planner's
//! (`plan::group`, `plan::from_db`). A map shared by twins (see
//! `schema/0004_small_database.sql`) is resolved here, so callers see one
//! encoded [`BlockMap`] per file and never the storage trick.

use rusqlite::OptionalExtension;

use super::{stored_map, Db};
use crate::blockmap::BlockMap;
use crate::file::FileId;

/// A file's block map with what the planner orders copies by.
#[derive(Debug, Clone)]
pub struct MapRow {
    /// The file's row id.
    pub id: FileId,
    /// Inode number (the planner's last tie-break; stable across runs).
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Its block map (the twin's, when it stores none of its own).
    pub map: BlockMap,
}

/// How the planner ranks one whole-file copy, and where its map is
/// stored: without reading the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyKey {
    /// The file's row id.
    pub id: FileId,
    /// Inode number (copies of one content are ranked by it, then by id).
    pub ino: u64,
    /// The row that holds the map: the file's own id, or its twin's.
    /// Equal holders, equal maps.
    pub holder: i64,
}

/// One read transaction held across several queries, so they all see the
/// same database and SQLite takes its shared lock once instead of twice per
/// statement (two `fcntl` calls per looked-up file). Dropping it ends the
/// transaction; nothing is written through it.
pub struct Snapshot<'a> {
    _tx: rusqlite::Transaction<'a>,
}

impl Db {
    /// Start a [`Snapshot`] (a read transaction) on this database.
    pub fn snapshot(&self) -> rusqlite::Result<Snapshot<'_>> {
        Ok(Snapshot { _tx: self.conn.unchecked_transaction()? })
    }

    /// Call `f(id, size, encoded map)` for every file with data whose id
    /// `keep` accepts, in storage order (callers must not depend on it).
    /// The map is borrowed from the row (or read from its twin): nothing is
    /// kept between rows, so memory stays that of one map.
    pub fn for_each_map(
        &self,
        keep: impl Fn(FileId) -> bool,
        mut f: impl FnMut(FileId, u64, &[u8]),
    ) -> rusqlite::Result<()> {
        let mut st = self.conn.prepare_cached("SELECT id, size, blocks FROM files WHERE size > 0")?;
        let mut rows = st.query([])?;
        while let Some(r) = rows.next()? {
            let id: FileId = r.get(0)?;
            if !keep(id) {
                continue;
            }
            let map = stored_map(&self.conn, r.get_ref(2)?)?;
            f(id, r.get::<_, i64>(1)? as u64, &map);
        }
        Ok(())
    }

    /// How many files have data (and so a block map).
    pub fn count_maps(&self) -> rusqlite::Result<u64> {
        self.conn.query_row("SELECT count(*) FROM files WHERE size > 0", [], |r| r.get::<_, i64>(0)).map(|n| n as u64)
    }

    /// [`CopyKey`]s of the given files; ids not known are left out. The
    /// maps themselves are not read (`typeof` does not load a blob), so a
    /// group of ten thousand copies of a 1 GiB file costs ten thousand
    /// small rows, not ten GB of maps.
    pub fn copy_keys(&self, ids: &[FileId]) -> rusqlite::Result<Vec<CopyKey>> {
        let mut st = self.conn.prepare_cached(
            "SELECT ino, CASE WHEN typeof(blocks) = 'integer' THEN blocks ELSE id END FROM files WHERE id = ?1",
        )?;
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            let row = st
                .query_row([id], |r| Ok(CopyKey { id, ino: r.get::<_, i64>(0)? as u64, holder: r.get(1)? }))
                .optional()?;
            out.extend(row);
        }
        Ok(out)
    }

    /// The encoded block map of file `id` (its twin's if it has one).
    pub fn encoded_map(&self, id: FileId) -> rusqlite::Result<Option<Vec<u8>>> {
        super::file_map(&self.conn, id)
    }

    /// The block maps of the given files (sparse: holes are never
    /// expanded); ids not known are left out.
    pub fn map_rows(&self, ids: impl IntoIterator<Item = FileId>) -> rusqlite::Result<Vec<MapRow>> {
        let mut st = self.conn.prepare_cached("SELECT size, blocks, ino FROM files WHERE id = ?1")?;
        let mut out = Vec::new();
        for id in ids {
            let row = st
                .query_row([id], |r| {
                    Ok(MapRow {
                        id,
                        ino: r.get::<_, i64>(2)? as u64,
                        size: r.get::<_, i64>(0)? as u64,
                        map: BlockMap::from_bytes(stored_map(&self.conn, r.get_ref(1)?)?.into_owned()),
                    })
                })
                .optional()?;
            out.extend(row);
        }
        Ok(out)
    }
}
