//! The database writer: the one thread that writes during a scan.
//!
//! In: [`WriteOp`]s over a bounded channel from the hashing threads (the
//! bound gives back-pressure, so memory stays flat however fast hashing
//! runs). Out: rows committed in batches, one transaction each, so an
//! interrupted run loses at most the last batch.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{params, Connection};

use super::maps::encode_runs;
use super::{file_map, path_bytes, Db, TWIN_MIN_MAP};

use crate::file::{FileFacts, FileId, IdSet, TimeTag};
use crate::hash::{FileHash, MapBytes};

/// Files per transaction at most.
pub const BATCH_FILES: usize = 512;
/// Longest a hashed file waits before it is committed.
pub const BATCH_TIME: Duration = Duration::from_millis(1000);
/// Capacity of the channel from the hashers.
pub const CHANNEL_CAP: usize = 256;
/// The writer commits once its transaction holds this many block-map bytes
/// (well under [`crate::hash::budget::MAP_BYTES_CAP`], so hashers rarely
/// wait on it).
const COMMIT_BYTES: u64 = 8 << 20;

impl WriteOp {
    /// Block-map bytes this change carries (see [`MapBytes`]).
    pub fn map_bytes(&self) -> u64 {
        match self {
            WriteOp::Hashed { hash, .. } => hash.map.as_bytes().len() as u64,
            _ => 0,
        }
    }
}

/// How long the writer sleeps when nothing is queued. It polls rather than
/// waits on the channel: a waiting receiver is woken by every send, a futex
/// call and two context switches per hashed file (about 18,000 a second on
/// the benchmark corpus, where the writer keeps up and so always waits). At
/// this interval the channel's bound still holds the files of 2 ms at
/// 100,000 files a second.
const POLL: Duration = Duration::from_millis(2);

/// One change to the database.
#[derive(Debug)]
pub enum WriteOp {
    /// A freshly hashed file.
    Hashed {
        /// Its existing row, if any (the row is replaced, the id kept).
        id: Option<FileId>,
        /// Volume key of its filesystem (see `sys::volume_key`).
        dev: u64,
        /// Inode number.
        ino: u64,
        /// Where it was found.
        path: PathBuf,
        /// Tag of its mtime as hashed.
        mtime: TimeTag,
        /// Tag of its ctime as hashed.
        ctime: TimeTag,
        /// Its size and block map.
        hash: FileHash,
    },
    /// A known, unchanged file seen under a new name (whose ctime the
    /// rename moved).
    Renamed {
        /// Its row.
        id: FileId,
        /// Volume key of the new path.
        dev: u64,
        /// The new path.
        path: PathBuf,
        /// Its new ctime tag.
        ctime: TimeTag,
    },
    /// A known file that is gone (or no longer eligible).
    Removed {
        /// Its row.
        id: FileId,
    },
    /// A file read and refused as too large (see `hash::refused`): the
    /// facts it was read under, recorded so later runs do not read it again.
    TooLarge {
        /// The file as read.
        file: FileFacts,
    },
}

/// What the writer did, for the rest of the run. Counts only: the rows of
/// this run are found in the database by their `hashed_run` (a list of ids
/// would grow with the number of files; issue 14).
#[derive(Debug, Default)]
pub struct Written {
    /// Files that had no row.
    pub new_files: u64,
    /// Files hashed by this run (new rows and replaced ones).
    pub hashed: u64,
    /// Files hashed by this run whose every extent was their own as they
    /// were hashed ([`crate::hash::FileHash::unshared`]). A bitset by row
    /// id: flat in the number of files.
    pub unshared: IdSet,
}

/// The writer's state: the run it marks rows with, what it did, and the
/// directory rows it knows.
struct Writer {
    run_id: i64,
    out: Written,
    /// `(dev, directory path)` → `dirs.id`, loaded once: lookups never
    /// touch the database, and the table needs no index.
    dirs: HashMap<(u64, PathBuf), i64>,
    /// A file left a directory: drop directories without files at the end.
    prune_dirs: bool,
    /// Block maps of [`TWIN_MIN_MAP`] bytes or more written by this run,
    /// `(size, map hash)` → the file holding it, and back.
    holders: HashMap<(u64, u64), FileId>,
    holder_keys: HashMap<FileId, (u64, u64)>,
}

/// Run the writer loop until the channel closes; rows hashed now are marked
/// with `run_id`. Returns the database and what was written.
/// The hashers hold each op's [`WriteOp::map_bytes`] in `bytes` before they
/// send it ([`MapBytes::reserve`]); the writer gives them back as it commits.
pub fn run(db: Db, run_id: i64, rx: Receiver<WriteOp>, bytes: &MapBytes) -> rusqlite::Result<(Db, Written)> {
    /// Closes `bytes` however the writer ends, a panic included: a hasher
    /// waiting for room would otherwise wait forever.
    struct Closing<'a>(&'a MapBytes);
    impl Drop for Closing<'_> {
        fn drop(&mut self) {
            self.0.close();
        }
    }
    let _closing = Closing(bytes);
    write_all(db, run_id, rx, bytes)
}

/// [`run`]'s loop.
fn write_all(db: Db, run_id: i64, rx: Receiver<WriteOp>, bytes: &MapBytes) -> rusqlite::Result<(Db, Written)> {
    let mut w = Writer::new(&db.conn, run_id)?;
    let mut batch: Vec<WriteOp> = Vec::with_capacity(BATCH_FILES);
    let mut held = 0u64;
    let commit = |w: &mut Writer, batch: &mut Vec<WriteOp>, held: &mut u64| -> rusqlite::Result<()> {
        w.commit(&db.conn, batch)?;
        bytes.give(std::mem::take(held));
        Ok(())
    };
    let mut since = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(op) => {
                if batch.is_empty() {
                    since = Instant::now();
                }
                held += op.map_bytes();
                batch.push(op);
                if batch.len() >= BATCH_FILES || held >= COMMIT_BYTES {
                    commit(&mut w, &mut batch, &mut held)?;
                }
            }
            Err(TryRecvError::Empty) => {
                if since.elapsed() >= BATCH_TIME {
                    commit(&mut w, &mut batch, &mut held)?;
                    since = Instant::now();
                }
                std::thread::sleep(POLL);
            }
            Err(TryRecvError::Disconnected) => {
                commit(&mut w, &mut batch, &mut held)?;
                if w.prune_dirs {
                    db.conn.execute("DELETE FROM dirs WHERE id NOT IN (SELECT dir FROM files)", [])?;
                }
                return Ok((db, w.out));
            }
        }
    }
}

impl Writer {
    fn new(conn: &Connection, run_id: i64) -> rusqlite::Result<Writer> {
        let mut st = conn.prepare("SELECT id, dev, path FROM dirs")?;
        let dirs = st
            .query_map([], |r| {
                let path = PathBuf::from(std::ffi::OsStr::from_bytes(r.get_ref(2)?.as_blob()?));
                Ok(((r.get::<_, i64>(1)? as u64, path), r.get::<_, i64>(0)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(Writer {
            run_id,
            out: Written::default(),
            dirs,
            prune_dirs: false,
            holders: HashMap::new(),
            holder_keys: HashMap::new(),
        })
    }

    fn commit(&mut self, conn: &Connection, batch: &mut Vec<WriteOp>) -> rusqlite::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let tx = conn.unchecked_transaction()?;
        for op in batch.drain(..) {
            self.apply(&tx, op)?;
        }
        tx.commit()
    }

    /// The `dirs` row of the directory holding `path` on `dev` (created if
    /// new), and the file's name.
    fn locate<'p>(&mut self, conn: &Connection, dev: u64, path: &'p Path) -> rusqlite::Result<(i64, &'p [u8])> {
        let dir = path.parent().unwrap_or(Path::new(""));
        let name = path.file_name().map_or(path_bytes(path), |n| n.as_bytes());
        if let Some(&id) = self.dirs.get(&(dev, dir.to_owned())) {
            return Ok((id, name));
        }
        conn.prepare_cached("INSERT INTO dirs (dev, path) VALUES (?1, ?2)")?
            .execute(params![dev as i64, path_bytes(dir)])?;
        let id = conn.last_insert_rowid();
        self.dirs.insert((dev, dir.to_owned()), id);
        Ok((id, name))
    }

    /// The file of this run that holds the same block map as `blob` (of
    /// size and map hash `key`). Only maps of [`TWIN_MIN_MAP`] bytes or more
    /// are held, so an equal map is long enough to share.
    fn holder_of(&self, conn: &Connection, key: (u64, u64), blob: &[u8]) -> rusqlite::Result<Option<FileId>> {
        let Some(&h) = self.holders.get(&key) else { return Ok(None) };
        // A hash is not proof: compare the maps.
        Ok((file_map(conn, h)?.as_deref() == Some(blob)).then_some(h))
    }

    /// Before the row of `id` is replaced or deleted: if it holds the block
    /// map of twins, give the map to the first of them and point the others
    /// at it.
    fn hand_over(&mut self, conn: &Connection, id: FileId) -> rusqlite::Result<()> {
        if let Some(key) = self.holder_keys.remove(&id) {
            self.holders.remove(&key);
        }
        let twins: Vec<FileId> = conn
            .prepare_cached("SELECT id FROM files WHERE typeof(blocks) = 'integer' AND blocks = ?1 ORDER BY id")?
            .query_map([id], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        if let Some(&heir) = twins.first() {
            conn.prepare_cached("UPDATE files SET blocks = (SELECT blocks FROM files WHERE id = ?2) WHERE id = ?1")?
                .execute(params![heir, id])?;
            conn.prepare_cached("UPDATE files SET blocks = ?1 WHERE typeof(blocks) = 'integer' AND blocks = ?2")?
                .execute(params![heir, id])?;
        }
        Ok(())
    }

    fn apply(&mut self, conn: &Connection, op: WriteOp) -> rusqlite::Result<()> {
        match op {
            WriteOp::Hashed { id, dev, ino, path, mtime, ctime, hash } => {
                if let Some(id) = id {
                    self.hand_over(conn, id)?;
                    self.prune_dirs = true;
                }
                let (dir, name) = self.locate(conn, dev, &path)?;
                let key = (hash.size, hash.map.hash64());
                let blob = hash.map.as_bytes();
                let holder = self.holder_of(conn, key, blob)?;
                let sharable = blob.len() >= TWIN_MIN_MAP;
                let stored = match holder {
                    Some(h) => ToSqlOutput::from(h.0),
                    // Borrowed: a map is stored without another copy.
                    None => ToSqlOutput::Borrowed(ValueRef::Blob(blob)),
                };
                // A known file keeps its id (the row is replaced); a new one
                // gets the next rowid.
                conn.prepare_cached(
                    "INSERT OR REPLACE INTO files (id, dir, name, ino, size, mtime, ctime, hashed_run, blocks) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9)",
                )?
                .execute(params![
                    id,
                    dir,
                    name,
                    ino as i64,
                    hash.size as i64,
                    mtime,
                    ctime,
                    self.run_id,
                    stored,
                ])?;
                let replaced = id.is_some();
                let id = id.unwrap_or_else(|| {
                    self.out.new_files += 1;
                    FileId(conn.last_insert_rowid())
                });
                if replaced {
                    conn.prepare_cached("DELETE FROM shared_runs WHERE file_id = ?1")?.execute([id])?;
                    conn.prepare_cached("DELETE FROM sources WHERE file_id = ?1")?.execute([id])?;
                }
                if !hash.shared_runs.is_empty() {
                    conn.prepare_cached(
                        "INSERT OR REPLACE INTO shared_runs (file_id, salt, runs) VALUES (?1, ?2, ?3)",
                    )?
                    .execute(params![id, hash.salt as i64, encode_runs(&hash.shared_runs)])?;
                }
                self.out.hashed += 1;
                if hash.unshared {
                    self.out.unshared.insert(id);
                }
                if sharable && holder.is_none() {
                    self.holders.insert(key, id);
                    self.holder_keys.insert(id, key);
                }
            }
            WriteOp::Renamed { id, dev, path, ctime } => {
                let (dir, name) = self.locate(conn, dev, &path)?;
                conn.prepare_cached("UPDATE files SET dir = ?2, name = ?3, ctime = ?4 WHERE id = ?1")?
                    .execute(params![id, dir, name, ctime])?;
                self.prune_dirs = true;
            }
            WriteOp::Removed { id } => {
                self.hand_over(conn, id)?;
                conn.prepare_cached("DELETE FROM files WHERE id = ?1")?.execute([id])?;
                conn.prepare_cached("DELETE FROM shared_runs WHERE file_id = ?1")?.execute([id])?;
                conn.prepare_cached("DELETE FROM sources WHERE file_id = ?1")?.execute([id])?;
                self.prune_dirs = true;
            }
            WriteOp::TooLarge { file } => super::too_large::record(conn, &file, self.run_id)?,
        }
        Ok(())
    }
}
