//! The rows planning reads: block maps, streamed one file at a time.
//!
//! Only queries live here; every grouping decision is the planner's
//! (`plan::group`, `plan::from_db`). A map shared by twins (see
//! `schema/0004_small_database.sql`) is resolved here, so callers see one
//! encoded [`BlockMap`] per file and never the storage trick.

use rusqlite::OptionalExtension;

use super::{stored_map, Db};
use crate::blockmap::{BlockMap, Fp};
use crate::file::{FileId, FileKey};
use crate::hash::SharedRun;

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

    /// Call `f(id, file key, owner salt, runs)` for every file with recorded shared runs
    /// (see [`crate::hash::FileHash::shared_runs`]) whose id `keep`
    /// accepts. A version-11 database opened read-only by `report` has no
    /// such table: no runs.
    pub fn for_each_shared_runs(
        &self,
        keep: impl Fn(FileId) -> bool,
        mut f: impl FnMut(FileId, FileKey, Fp, &[SharedRun]),
    ) -> rusqlite::Result<()> {
        let exists: bool = self.conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'shared_runs')",
            [],
            |r| r.get(0),
        )?;
        if !exists {
            return Ok(());
        }
        let mut st = self.conn.prepare_cached(
            "SELECT s.file_id, d.dev, f.ino, s.salt, s.runs FROM shared_runs s JOIN files f ON f.id = s.file_id JOIN dirs d ON d.id = f.dir",
        )?;
        let mut rows = st.query([])?;
        let mut runs = Vec::new();
        while let Some(r) = rows.next()? {
            let id: FileId = r.get(0)?;
            if !keep(id) {
                continue;
            }
            runs.clear();
            runs.extend(decode_runs(r.get_ref(4)?.as_blob()?));
            let key = FileKey { volume: r.get::<_, i64>(1)? as u64, ino: r.get::<_, i64>(2)? as u64 };
            f(id, key, r.get::<_, i64>(3)? as Fp, &runs);
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

/// The stored form of shared runs: per run, LEB128 varints of the gap
/// since the previous run's end (runs are in file order, disjoint), the
/// physical block and the length. A run of a file on a volume under 128 TiB
/// takes 7–9 bytes where three u64 took 24 (FULL rerun after a dedupe:
/// the database grew 3.1 MB with u64s).
pub(super) fn encode_runs(runs: &[SharedRun]) -> Vec<u8> {
    let mut out = Vec::with_capacity(runs.len() * 9);
    let mut end = 0u64;
    for &(block, phys, n) in runs {
        for mut v in [block.saturating_sub(end), phys, n] {
            while v >= 0x80 {
                out.push(v as u8 | 0x80);
                v >>= 7;
            }
            out.push(v as u8);
        }
        end = block.saturating_add(n);
    }
    out
}

/// Runs from their stored form; decoding stops at anything malformed (a
/// truncated or overlong varint, a run past 2⁶⁴), keeping the runs before.
fn decode_runs(mut blob: &[u8]) -> impl Iterator<Item = SharedRun> + '_ {
    let mut varint = move || {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = blob.split_first()?;
            blob = rest;
            v |= u64::from(b & 0x7f).checked_shl(shift).filter(|x| x >> shift == u64::from(b & 0x7f))?;
            if b < 0x80 {
                return Some(v);
            }
        }
        None
    };
    let mut end = 0u64;
    std::iter::from_fn(move || {
        let (gap, phys, n) = (varint()?, varint()?, varint()?);
        let block = end.checked_add(gap)?;
        end = block.checked_add(n)?;
        Some((block, phys, n))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_runs_round_trip_and_malformed_ones_stop_decoding() {
        let runs = vec![(0, 5, 1), (1, 1 << 40, 300), (10_000, u64::MAX - 7, 7), (u64::MAX - 1, 3, 1)];
        let blob = encode_runs(&runs);
        assert_eq!(decode_runs(&blob).collect::<Vec<_>>(), runs);
        // Small runs are small: gap 0, physical block 2^20, 16 blocks.
        assert_eq!(encode_runs(&[(0, 1 << 20, 16)]).len(), 5);
        assert_eq!(decode_runs(&[]).count(), 0);
        // Truncated: the runs before the cut, nothing invented.
        assert_eq!(decode_runs(&blob[..blob.len() - 1]).collect::<Vec<_>>(), runs[..3]);
        // An overlong varint (eleven continuation bytes) decodes nothing.
        assert_eq!(decode_runs(&[0xff; 11]).count(), 0);
        // A run that would end past 2^64 ends decoding.
        let past = encode_runs(&[(u64::MAX - 1, 3, 1)]);
        let mut twice = past.clone();
        twice.extend(&past);
        assert_eq!(decode_runs(&twice).count(), 1);
    }
}
