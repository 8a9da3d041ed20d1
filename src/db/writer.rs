//! The database writer: the one thread that writes during a scan.
//!
//! In: [`WriteOp`]s over a bounded channel from the hashing threads (the
//! bound gives back-pressure, so memory stays flat however fast hashing
//! runs). Out: rows committed in batches, one transaction each, so an
//! interrupted run loses at most the last batch.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, OptionalExtension};

use super::{decode_blocks, encode_blocks, path_bytes, Db};
use crate::hash::FileHash;
use crate::plan::{anchors, short_fp, Fp};
use crate::types::FileId;

/// Bytes of the whole-file digest kept: 128 bits identify content among any
/// number of files a volume can hold, and the kernel compares anyway.
pub const DIGEST_LEN: usize = 16;

/// Files per transaction at most.
pub const BATCH_FILES: usize = 512;
/// Longest a hashed file waits before it is committed.
pub const BATCH_TIME: Duration = Duration::from_millis(1000);
/// Capacity of the channel from the hashers.
pub const CHANNEL_CAP: usize = 256;

/// One change to the database.
#[derive(Debug)]
pub enum WriteOp {
    /// A freshly hashed file; `id` is its existing row, if any.
    Hashed {
        id: Option<FileId>,
        dev: u64,
        ino: u64,
        path: std::path::PathBuf,
        mtime_ns: i64,
        ctime_ns: i64,
        hash: FileHash,
    },
    /// A known, unchanged file seen under a new name (whose ctime the
    /// rename moved).
    Renamed { id: FileId, path: std::path::PathBuf, ctime_ns: i64 },
    /// A known file that is gone (or no longer eligible).
    Removed { id: FileId },
}

/// Ids given to files that had no row: `(dev, ino)` → id.
pub type NewIds = Vec<((u64, u64), FileId)>;

/// Run the writer loop until the channel closes; rows hashed now are marked
/// with `run_id`. Returns the database and the ids of the new rows.
pub fn run(db: Db, run_id: i64, rx: Receiver<WriteOp>) -> rusqlite::Result<(Db, NewIds)> {
    let mut batch: Vec<WriteOp> = Vec::with_capacity(BATCH_FILES);
    let mut new_ids = NewIds::new();
    let mut since = Instant::now();
    loop {
        let timeout = BATCH_TIME.saturating_sub(since.elapsed());
        match rx.recv_timeout(timeout) {
            Ok(op) => {
                if batch.is_empty() {
                    since = Instant::now();
                }
                batch.push(op);
                if batch.len() >= BATCH_FILES {
                    commit(&db.conn, run_id, &mut batch, &mut new_ids)?;
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                commit(&db.conn, run_id, &mut batch, &mut new_ids)?;
                since = Instant::now();
            }
            Err(RecvTimeoutError::Disconnected) => {
                commit(&db.conn, run_id, &mut batch, &mut new_ids)?;
                return Ok((db, new_ids));
            }
        }
    }
}

/// Apply and clear `batch` in one transaction.
pub fn commit(conn: &Connection, run_id: i64, batch: &mut Vec<WriteOp>, new_ids: &mut NewIds) -> rusqlite::Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let tx = conn.unchecked_transaction()?;
    for op in batch.drain(..) {
        apply(&tx, run_id, op, new_ids)?;
    }
    tx.commit()
}

/// Delete a file's anchors. The block map keeps only the high half of each
/// fingerprint, which is the high half of the anchor's key: each anchor is
/// found again by key range.
fn delete_anchors(conn: &Connection, id: FileId) -> rusqlite::Result<()> {
    let old: Option<Vec<u8>> =
        conn.prepare_cached("SELECT blocks FROM files WHERE id = ?1")?.query_row([id], |r| r.get(0)).optional()?;
    if let Some(blob) = old {
        let blocks = decode_blocks(&blob);
        let mut del =
            conn.prepare_cached("DELETE FROM anchors WHERE fp BETWEEN ?1 AND ?2 AND file_id = ?3 AND blk = ?4")?;
        for i in anchors(&blocks) {
            let hi = (blocks[i as usize] as u64) << 32;
            del.execute(params![hi as i64, (hi | 0xFFFF_FFFF) as i64, id, i as i64])?;
        }
    }
    Ok(())
}

fn apply(conn: &Connection, run_id: i64, op: WriteOp, new_ids: &mut NewIds) -> rusqlite::Result<()> {
    match op {
        WriteOp::Hashed { id, dev, ino, path, mtime_ns, ctime_ns, hash } => {
            if let Some(id) = id {
                delete_anchors(conn, id)?;
            }
            // A known file keeps its id (the row is replaced); a new one gets
            // the next rowid.
            conn.prepare_cached(
                "INSERT OR REPLACE INTO files (id, dev, ino, path, size, mtime_ns, ctime_ns, digest, blocks, hashed_run) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10)",
            )?
            .execute(params![
                id,
                dev as i64,
                ino as i64,
                path_bytes(&path),
                hash.size as i64,
                mtime_ns,
                ctime_ns,
                &hash.digest[..DIGEST_LEN],
                encode_blocks(&hash.blocks),
                run_id
            ])?;
            let id = id.unwrap_or_else(|| {
                let id = FileId(conn.last_insert_rowid());
                new_ids.push(((dev, ino), id));
                id
            });
            let mut ins =
                conn.prepare_cached("INSERT OR IGNORE INTO anchors (fp, file_id, blk) VALUES (?1, ?2, ?3)")?;
            let short: Vec<Fp> = hash.blocks.iter().map(|&f| short_fp(f)).collect();
            for i in anchors(&short) {
                ins.execute(params![hash.blocks[i as usize] as i64, id, i as i64])?;
            }
        }
        WriteOp::Renamed { id, path, ctime_ns } => {
            conn.prepare_cached("UPDATE files SET path = ?2, ctime_ns = ?3 WHERE id = ?1")?.execute(params![
                id,
                path_bytes(&path),
                ctime_ns
            ])?;
        }
        WriteOp::Removed { id } => {
            delete_anchors(conn, id)?;
            conn.prepare_cached("DELETE FROM files WHERE id = ?1")?.execute([id])?;
        }
    }
    Ok(())
}
