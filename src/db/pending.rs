//! The `pending` table: destinations a run left for a later one, and the
//! files whose written zeros wait for room (`pipeline::pending` decides
//! what goes in).

use std::collections::HashSet;

use rusqlite::params;

use super::Db;
use crate::file::FileId;

/// A row the zero pass leaves: file, reason, bytes of zeros, and the
/// holder outside the run that keeps them (subvolume id, inode), if any.
pub type ZerosRow<'a> = (FileId, &'a str, u64, Option<(u64, u64)>);

impl Db {
    /// Destinations left for a later run (out of space, or extents pinned
    /// by a file outside the run), with why and how many planned bytes (see
    /// [`crate::dedupe::Pending`]).
    pub fn pending(&self) -> rusqlite::Result<Vec<(FileId, String, u64)>> {
        // Not the rows of files removed since (a run that plans nothing
        // does not get to drop them).
        let mut st = self.conn.prepare(
            "SELECT file_id, reason, bytes FROM pending WHERE file_id IN (SELECT id FROM files) ORDER BY file_id",
        )?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? as u64)))?;
        rows.collect()
    }

    /// Record what a run left pending: rows of the destinations it went
    /// through (`handled`) are replaced by `now`; rows of files no longer
    /// known are dropped.
    pub fn save_pending(
        &self,
        handled: &HashSet<FileId>,
        now: &[(FileId, &str, u64)],
        run: i64,
    ) -> rusqlite::Result<()> {
        let tx = self.conn.unchecked_transaction()?;
        {
            let mut del = tx.prepare("DELETE FROM pending WHERE file_id = ?1")?;
            for id in handled {
                del.execute([id])?;
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
    /// (reason, bytes, and for zeros a file outside the run holds, that
    /// holder). A file with a row already (the sharing's: its group is
    /// planned again anyway, and the pass with it) keeps it; its holder is
    /// recorded all the same (a sharing row of reason
    /// `referenced_outside_run` waits for FIEMAP to show no extent shared,
    /// which never comes while clones in the run share them).
    pub fn save_zeros_pending(
        &self,
        handled: &[FileId],
        reasons: [&str; 3],
        left: &[ZerosRow<'_>],
        run: i64,
    ) -> rusqlite::Result<()> {
        let tx = self.conn.unchecked_transaction()?;
        {
            let mut del = tx.prepare("DELETE FROM pending WHERE file_id = ?1 AND reason IN (?2, ?3, ?4)")?;
            for id in handled {
                del.execute(params![id, reasons[0], reasons[1], reasons[2]])?;
            }
            let mut ins =
                tx.prepare("INSERT OR IGNORE INTO pending (file_id, reason, bytes, run) VALUES (?1, ?2, ?3, ?4)")?;
            let mut holder =
                tx.prepare("INSERT OR REPLACE INTO zeros_held (file_id, root, ino, run) VALUES (?1, ?2, ?3, ?4)")?;
            let mut gone = tx.prepare("DELETE FROM zeros_held WHERE file_id = ?1")?;
            for id in handled {
                gone.execute([id])?;
            }
            for (id, why, bytes, by) in left {
                ins.execute(params![id, why, *bytes as i64, run])?;
                if let Some((root, ino)) = by {
                    holder.execute(params![id, *root as i64, *ino as i64, run])?;
                }
            }
            // As `save_pending` does: a run that shared nothing may still
            // punch, and must not leave rows of files since removed.
            tx.execute("DELETE FROM pending WHERE file_id NOT IN (SELECT id FROM files)", [])?;
            tx.execute("DELETE FROM zeros_held WHERE file_id NOT IN (SELECT id FROM files)", [])?;
        }
        tx.commit()
    }

    /// The files whose zeros a file outside the run holds (`zeros_held`),
    /// each with the newest such holder: subvolume id and inode.
    pub fn zeros_holders(&self) -> rusqlite::Result<Vec<(FileId, (u64, u64))>> {
        let mut st = self.conn.prepare(
            "SELECT file_id, root, ino FROM zeros_held WHERE file_id IN (SELECT id FROM files) ORDER BY file_id",
        )?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, (r.get::<_, i64>(1)? as u64, r.get::<_, i64>(2)? as u64))))?;
        rows.collect()
    }
}
