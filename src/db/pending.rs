//! The `pending` table: destinations a run left for a later one, and the
//! files whose written zeros wait for room (`pipeline::pending` decides
//! what goes in).

use std::collections::HashSet;

use rusqlite::params;

use super::Db;
use crate::file::FileId;
use crate::sys::btrfs_names::Stamp;

/// A file outside the run holding a file's zeros: subvolume id and inode,
/// and its state when found (`None`: it could not be read).
pub type Holder = ((u64, u64), Option<Stamp>);

/// A row the zero pass leaves: file, reason, bytes of zeros, and the
/// holders outside the run that keep them (the newest of each extent;
/// none for the other reasons).
pub type ZerosRow<'a> = (FileId, &'a str, u64, &'a [Holder]);

impl Db {
    /// Destinations left for a later run (out of space, or extents pinned
    /// by a file outside the run), with why and how many planned bytes (see
    /// [`crate::dedupe::Pending`]); by file, then reason. A file may have
    /// two rows: its sharing's and its zeros' (schema 15).
    pub fn pending(&self) -> rusqlite::Result<Vec<(FileId, String, u64)>> {
        // Not the rows of files removed since (a run that plans nothing
        // does not get to drop them).
        let mut st = self.conn.prepare(
            "SELECT file_id, reason, bytes FROM pending WHERE file_id IN (SELECT id FROM files) \
             ORDER BY file_id, reason",
        )?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? as u64)))?;
        rows.collect()
    }

    /// Record what a run's sharing left pending: rows of the destinations
    /// it went through (`handled`) are replaced by `now`, but not those of
    /// the zero pass's reasons (`zeros`: that pass replaces them when it
    /// goes through the file); rows of files no longer known are dropped.
    pub fn save_pending(
        &self,
        handled: &HashSet<FileId>,
        zeros: [&str; 4],
        now: &[(FileId, &str, u64)],
        run: i64,
    ) -> rusqlite::Result<()> {
        let tx = self.conn.unchecked_transaction()?;
        {
            let mut del = tx.prepare("DELETE FROM pending WHERE file_id = ?1 AND reason NOT IN (?2, ?3, ?4, ?5)")?;
            for id in handled {
                del.execute(params![id, zeros[0], zeros[1], zeros[2], zeros[3]])?;
            }
            let mut ins =
                tx.prepare("INSERT OR REPLACE INTO pending (file_id, reason, bytes, run) VALUES (?1, ?2, ?3, ?4)")?;
            for (id, why, bytes) in now {
                ins.execute(params![id, why, *bytes as i64, run])?;
            }
            tx.execute("DELETE FROM pending WHERE file_id NOT IN (SELECT id FROM files)", [])?;
        }
        tx.commit()
    }

    /// Record what the pass turning written zeros into holes left for a
    /// later run: rows of its `reasons` of the files it went through
    /// (`handled`) are dropped, with their holders, then `left` added
    /// (reason, bytes, and for zeros files outside the run hold, those
    /// holders, a row each). A file's sharing row stays beside it (schema
    /// 15), so the report counts both.
    pub fn save_zeros_pending(
        &self,
        handled: &[FileId],
        reasons: [&str; 4],
        left: &[ZerosRow<'_>],
        run: i64,
    ) -> rusqlite::Result<()> {
        let tx = self.conn.unchecked_transaction()?;
        {
            let mut del = tx.prepare("DELETE FROM pending WHERE file_id = ?1 AND reason IN (?2, ?3, ?4, ?5)")?;
            for id in handled {
                del.execute(params![id, reasons[0], reasons[1], reasons[2], reasons[3]])?;
            }
            let mut ins =
                tx.prepare("INSERT OR REPLACE INTO pending (file_id, reason, bytes, run) VALUES (?1, ?2, ?3, ?4)")?;
            let mut holder = tx.prepare(
                "INSERT OR REPLACE INTO zeros_held (file_id, root, ino, run, generation, ctime_ns) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            let mut gone = tx.prepare("DELETE FROM zeros_held WHERE file_id = ?1")?;
            for id in handled {
                gone.execute([id])?;
            }
            for (id, why, bytes, by) in left {
                ins.execute(params![id, why, *bytes as i64, run])?;
                for ((root, ino), stamp) in *by {
                    let (generation, ctime) = (stamp.map(|s| s.generation as i64), stamp.map(|s| s.ctime_ns));
                    holder.execute(params![id, *root as i64, *ino as i64, run, generation, ctime])?;
                }
            }
            // As `save_pending` does: a run that shared nothing may still
            // punch, and must not leave rows of files since removed.
            tx.execute("DELETE FROM pending WHERE file_id NOT IN (SELECT id FROM files)", [])?;
            tx.execute("DELETE FROM zeros_held WHERE file_id NOT IN (SELECT id FROM files)", [])?;
        }
        tx.commit()
    }

    /// The files whose zeros files outside the run hold (`zeros_held`),
    /// a row for each holder recorded, as found; by file.
    pub fn zeros_holders(&self) -> rusqlite::Result<Vec<(FileId, Holder)>> {
        let mut st = self.conn.prepare(
            "SELECT file_id, root, ino, generation, ctime_ns FROM zeros_held \
             WHERE file_id IN (SELECT id FROM files) ORDER BY file_id, root, ino",
        )?;
        let rows = st.query_map([], |r| {
            let by = (r.get::<_, i64>(1)? as u64, r.get::<_, i64>(2)? as u64);
            let stamp = match (r.get::<_, Option<i64>>(3)?, r.get::<_, Option<i64>>(4)?) {
                (Some(g), Some(ctime_ns)) => Some(Stamp { generation: g as u64, ctime_ns }),
                _ => None,
            };
            Ok((r.get(0)?, (by, stamp)))
        })?;
        rows.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `dedupe::Pending::ZEROS`'s names, spelled out: the database layer
    /// sits below `dedupe` and does not import it, in tests either.
    const ZEROS: [&str; 4] = ["zeros_keep_free", "zeros_referenced_outside_run", "zeros_leased", "zeros_many_clones"];

    fn rows(db: &Db) -> Vec<(i64, String, u64)> {
        db.pending().unwrap().into_iter().map(|(id, why, b)| (id.0, why, b)).collect()
    }

    /// A file left pending by its sharing and by its zeros has both rows,
    /// each pass replaces only its own, and the report counts both.
    #[test]
    fn a_file_pending_for_its_sharing_and_its_zeros_keeps_both_rows() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("db"), "fs").unwrap();
        db.conn.execute("INSERT INTO dirs (id, path, dev) VALUES (1, x'2f', 1)", []).unwrap();
        for id in [1, 2] {
            db.conn
                .execute(
                    "INSERT INTO files (id, dir, name, ino, size, mtime, ctime, hashed_run, blocks) \
                     VALUES (?1, 1, ?2, ?1, 1, 0, 0, 1, x'')",
                    params![id, id.to_string()],
                )
                .unwrap();
        }
        let both: HashSet<FileId> = [FileId(1), FileId(2)].into();
        let pinned = "referenced_outside_run";
        db.save_pending(&both, ZEROS, &[(FileId(1), pinned, 65536)], 1).unwrap();
        let stamp = Stamp { generation: 9, ctime_ns: 1_700_000_000_000_000_005 };
        // Two holders of 1's zeros (each the newest of an extent), a row each.
        let by = [((258, 257), Some(stamp)), ((259, 300), None)];
        let held = (FileId(1), ZEROS[1], 15 << 20, &by[..]);
        db.save_zeros_pending(&[FileId(1), FileId(2)], ZEROS, &[held, (FileId(2), ZEROS[0], 4096, &[])], 1).unwrap();
        let want = |r: &[(i64, &str, u64)]| r.iter().map(|&(id, w, b)| (id, w.to_owned(), b)).collect::<Vec<_>>();
        assert_eq!(rows(&db), want(&[(1, pinned, 65536), (1, ZEROS[1], 15 << 20), (2, ZEROS[0], 4096)]));
        let by_reason: Vec<(String, u64, u64)> =
            db.pending_by_reason().unwrap().into_iter().map(|r| (r.reason, r.files, r.bytes)).collect();
        assert_eq!(by_reason.iter().map(|r| r.2).sum::<u64>(), 65536 + (15 << 20) + 4096);
        // The next run shares 1 and 2 and leaves no sharing row: the zeros'
        // rows stay for the zero pass, which then frees 2's.
        db.save_pending(&both, ZEROS, &[], 2).unwrap();
        assert_eq!(rows(&db), want(&[(1, ZEROS[1], 15 << 20), (2, ZEROS[0], 4096)]));
        db.save_zeros_pending(&[FileId(2)], ZEROS, &[], 2).unwrap();
        assert_eq!(rows(&db), want(&[(1, ZEROS[1], 15 << 20)]));
        assert_eq!(db.zeros_holders().unwrap(), by.map(|h| (FileId(1), h)));
        // The zero pass through 1 again, one holder left: the other's row goes.
        db.save_zeros_pending(&[FileId(1)], ZEROS, &[(FileId(1), ZEROS[1], 8 << 20, &by[1..])], 3).unwrap();
        assert_eq!(db.zeros_holders().unwrap(), vec![(FileId(1), by[1])]);
    }
}
