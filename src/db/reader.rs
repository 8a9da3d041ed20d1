//! Reads that stream, so that memory stays flat in the number of files
//! (issue 14): the crawl's per-file lookups on a read connection of its own
//! ([`Reader`], beside the writer thread's connection: WAL readers never
//! block it), and whole-table passes that hand rows to a callback instead
//! of collecting them.

use rustc_hash::FxHashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rusqlite::{params, Connection};

use super::{Db, DbError, FROM_FILES, PATH_COLS};
use crate::changes::{Index, IndexError};
use crate::file::{child_path, FileFacts, FileId, FileKey, IdSet, Known};

/// A read-only connection for change detection during a scan: files are
/// looked up one at a time by `(volume key, inode)` (indexed), never loaded
/// all at once.
pub struct Reader {
    conn: Connection,
    /// The run scanning: rows it writes meanwhile are not "known before".
    run: i64,
    /// Every known file, loaded in one pass when there are at most
    /// [`PRELOAD_MAX`] of them; `None`: one indexed lookup per file.
    preloaded: Option<Preloaded>,
    /// The read transaction the lookups share (see [`Reader::in_read`]):
    /// when it began and how many lookups it has served.
    read: std::cell::Cell<Option<(std::time::Instant, u32)>>,
}

/// The known files of a preload, compact: each directory's path once, and
/// per file its name, not its whole path, in an array sorted by key (found
/// by binary search). A map of `Known`s held each full path in a heap block
/// of its own, 245 bytes a file in all, the peak of a no-change
/// `--incremental` run on FULL (53 MB for 126,815 files); a hash map of
/// these entries still took 19 MB of buckets at half load.
struct Preloaded {
    dirs: Vec<PathBuf>,
    files: Vec<(FileKey, Compact)>,
}

/// One known file of a [`Preloaded`].
struct Compact {
    id: FileId,
    /// Index in [`Preloaded::dirs`].
    dir: u32,
    name: Box<[u8]>,
    size: u64,
    mtime: crate::file::TimeTag,
    ctime: crate::file::TimeTag,
    hashed_run: i64,
}

impl Preloaded {
    /// The known file at `key`, as a lookup would answer.
    fn get(&self, key: FileKey) -> Option<Known> {
        let at = self.files.binary_search_by_key(&key, |e| e.0).ok()?;
        let c = &self.files[at].1;
        let mut path = self.dirs[c.dir as usize].clone();
        path.push(std::ffi::OsStr::from_bytes(&c.name));
        let file = FileFacts { path, key, size: c.size, mtime: c.mtime, ctime: c.ctime };
        Some(Known { id: c.id, file, hashed_run: c.hashed_run })
    }
}

/// Up to this many known files, change detection loads them all in one
/// pass instead of asking per file: a pass over the table is faster than a
/// lookup per file (FULL corpus, 126,815 files: a no-change `--incremental`
/// run took 1.22 s with lookups against 0.87 s with the whole index; again
/// in session 20: 1.74–2.58 s against 1.09–1.61 s), and the preload stays
/// under about 25 MB ([`Preloaded`]: a run holding it peaks about 20 bytes
/// a file above one that looks files up — FULL 24 against 22 MB), below
/// issue 14's 256 MB bound. Beyond it, memory stays flat in the number of
/// files.
pub const PRELOAD_MAX: u64 = 250_000;

impl Reader {
    /// A second, read-only connection to the database at `path`, for run
    /// `run`.
    pub fn open(path: &Path, run: i64) -> Result<Reader, DbError> {
        Reader::open_preloading(path, run, PRELOAD_MAX)
    }

    /// [`Reader::open`], loading every known file when there are at most
    /// `max` (tests ask for 0: lookups only).
    fn open_preloading(path: &Path, run: i64, max: u64) -> Result<Reader, DbError> {
        let conn = Db::open_readonly(path)?;
        let count: i64 = conn.query_row("SELECT count(*) FROM files", [], |r| r.get(0))?;
        if count as u64 <= max {
            let preloaded = Some(preload(&conn, count as usize)?);
            return Ok(Reader { conn, run, preloaded, read: Default::default() });
        }
        warm(path);
        // A bounded page cache (16 MiB): lookups follow the crawl, which
        // meets files in about the order their rows were written.
        conn.pragma_update(None, "cache_size", -16384)?;
        Ok(Reader { conn, run, preloaded: None, read: Default::default() })
    }

    fn known(&self, key: FileKey) -> rusqlite::Result<Option<Known>> {
        self.in_read()?;
        let mut st = self.conn.prepare_cached(KNOWN)?;
        let mut rows = st.query(params![key.ino as i64, key.volume as i64])?;
        rows.next()?.map(known_row).transpose()
    }

    /// Be in a read transaction for the next lookup: the current one, or
    /// a new one once it has served [`READ_LOOKUPS`] or lasted [`READ_FOR`].
    fn in_read(&self) -> rusqlite::Result<()> {
        let now = std::time::Instant::now();
        match self.read.get() {
            Some((since, n)) if n < READ_LOOKUPS && now.duration_since(since) < READ_FOR => {
                self.read.set(Some((since, n + 1)));
                return Ok(());
            }
            Some(_) => self.conn.execute_batch("COMMIT")?,
            None => {}
        }
        self.conn.execute_batch("BEGIN")?;
        self.read.set(Some((now, 1)));
        Ok(())
    }

    /// End the lookups' read transaction, if one is open: what follows
    /// sees the database as it is now.
    fn end_read(&self) -> rusqlite::Result<()> {
        if self.read.take().is_some() {
            self.conn.execute_batch("COMMIT")?;
        }
        Ok(())
    }
}

/// The columns [`known_row`] reads, from the join of files and their
/// directories: one list for the lookup ([`KNOWN`]) and the preload, so
/// the two cannot drift apart.
macro_rules! select_known {
    () => {
        "SELECT f.id, d.path, f.name, f.size, f.mtime, f.ctime, f.hashed_run, d.dev, f.ino, d.id \
         FROM files f JOIN dirs d ON d.id = f.dir"
    };
}

/// A row of [`select_known`]'s columns as a known file.
fn known_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Known> {
    let key = FileKey { volume: r.get::<_, i64>(7)? as u64, ino: r.get::<_, i64>(8)? as u64 };
    let file = FileFacts {
        path: child_path(r.get_ref(1)?.as_blob()?, r.get_ref(2)?.as_blob()?),
        key,
        size: r.get::<_, i64>(3)? as u64,
        mtime: r.get(4)?,
        ctime: r.get(5)?,
    };
    Ok(Known { id: r.get(0)?, file, hashed_run: r.get(6)? })
}

/// Every known file by `(volume key, inode)`, in one pass; of two rows of
/// one inode (hard links) the first written, as [`KNOWN`] answers.
fn preload(conn: &Connection, count: usize) -> rusqlite::Result<Preloaded> {
    let mut st = conn.prepare(concat!(select_known!(), " ORDER BY f.id"))?;
    let mut rows = st.query([])?;
    let mut dir_index: FxHashMap<i64, u32> = FxHashMap::default();
    let mut out = Preloaded { dirs: Vec::new(), files: Vec::with_capacity(count) };
    while let Some(r) = rows.next()? {
        // Read as a lookup reads it (one column list, one parse), then
        // split: the path joined there is split again here.
        let k = known_row(r)?;
        let name: Box<[u8]> = k.file.path.file_name().map_or(&[][..], |n| n.as_bytes()).into();
        let dir = match dir_index.get(&r.get::<_, i64>(9)?) {
            Some(&d) => d,
            None => {
                out.dirs.push(k.file.path.parent().map(Path::to_path_buf).unwrap_or_default());
                let d = out.dirs.len() as u32 - 1;
                dir_index.insert(r.get(9)?, d);
                d
            }
        };
        let f = k.file;
        let c = Compact { id: k.id, dir, name, size: f.size, mtime: f.mtime, ctime: f.ctime, hashed_run: k.hashed_run };
        out.files.push((f.key, c));
    }
    // By key, then id: the first kept of each key is the first written.
    out.files.sort_unstable_by_key(|e| (e.0, e.1.id));
    out.files.dedup_by_key(|e| e.0);
    out.files.shrink_to_fit();
    Ok(out)
}

/// Read the database file (and its WAL) once, sequentially, on a thread of
/// its own, into the page cache (not into this process: nothing is kept).
/// The crawl's lookups then cost no random read each: on a cold cache they
/// made a no-change run of a million files five times slower (56 s against
/// 11 s for the old whole-index load, which read the table in one pass).
fn warm(path: &Path) {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let files = [path.to_owned(), PathBuf::from(wal)];
    let spawned = std::thread::Builder::new().name("db-warm".into()).spawn(move || {
        use std::io::Read;
        let mut buf = vec![0u8; 1 << 20];
        for p in files {
            let Ok(mut f) = std::fs::File::open(p) else { continue };
            while matches!(f.read(&mut buf), Ok(n) if n > 0) {}
        }
    });
    // Without the thread the lookups are only slower.
    drop(spawned);
}

/// One known file by `(inode, volume key)`: through the `files_inode` index.
const KNOWN: &str = concat!(select_known!(), " WHERE f.ino = ?1 AND d.dev = ?2 ORDER BY f.id LIMIT 1");

/// The id of the file with an `(volume key, inode)` ([`Db::id_of`]).
pub(super) const ID_OF: &str = "SELECT f.id FROM files f JOIN dirs d ON d.id = f.dir WHERE f.ino = ?1 AND d.dev = ?2";

/// Lookups one read transaction serves at most, and for how long: each
/// statement outside a transaction takes and drops SQLite's WAL read lock
/// (two `fcntl` calls, and the WAL index's header read again); a million
/// unchanged files took 2.72 s with a transaction per lookup, 2.19 s
/// with these. Short, so that the snapshot it holds does not keep the
/// writer's checkpoints from the WAL for long; and the crawl releases it
/// ([`Index::release`]) before it hands a file on, which may wait for the
/// hashing, and whenever it waits for its threads: a first run, whose
/// every file is handed on, would otherwise hold it nearly all along, and
/// the WAL would grow by all it writes.
const READ_LOOKUPS: u32 = 4096;
const READ_FOR: std::time::Duration = std::time::Duration::from_millis(20);

impl Index for Reader {
    fn get(&self, key: FileKey) -> Result<Option<Known>, IndexError> {
        match &self.preloaded {
            Some(p) => Ok(p.get(key)),
            None => Ok(self.known(key)?),
        }
    }

    fn release(&self) {
        // A failed COMMIT leaves the transaction to the next lookup's.
        let _ = self.end_read();
    }

    fn each_known(&self, wanted: &dyn Fn(FileId) -> bool, f: &mut dyn FnMut(FileId, &Path)) -> Result<(), IndexError> {
        self.end_read()?;
        let mut st = self.conn.prepare(&format!("SELECT f.id, {PATH_COLS} {FROM_FILES} WHERE f.hashed_run != ?1"))?;
        let mut rows = st.query([self.run])?;
        while let Some(r) = rows.next()? {
            let id = r.get(0)?;
            if wanted(id) {
                f(id, &child_path(r.get_ref(1)?.as_blob()?, r.get_ref(2)?.as_blob()?));
            }
        }
        Ok(())
    }
}

impl Db {
    /// Add to `set` every file hashed by run `run`, and return how many.
    pub fn add_run_files(&self, run: i64, set: &mut IdSet) -> rusqlite::Result<u64> {
        let mut st = self.conn.prepare("SELECT id FROM files WHERE hashed_run = ?1")?;
        let mut rows = st.query([run])?;
        let mut n = 0;
        while let Some(r) = rows.next()? {
            set.insert(r.get(0)?);
            n += 1;
        }
        Ok(n)
    }

    /// Files hashed after run `run` (this run's included).
    pub fn hashed_after(&self, run: i64) -> rusqlite::Result<Vec<FileId>> {
        let mut st = self.conn.prepare("SELECT id FROM files WHERE hashed_run > ?1")?;
        let rows = st.query_map([run], |r| r.get(0))?;
        rows.collect()
    }

    /// The row of the file with this `(volume key, inode)`, if known.
    pub fn id_of(&self, key: FileKey) -> rusqlite::Result<Option<FileId>> {
        let mut st = self.conn.prepare_cached(ID_OF)?;
        let mut rows = st.query(params![key.ino as i64, key.volume as i64])?;
        rows.next()?.map(|r| r.get(0)).transpose()
    }

    /// Every known file's id.
    pub fn all_ids(&self) -> rusqlite::Result<IdSet> {
        let mut st = self.conn.prepare("SELECT id FROM files")?;
        let rows = st.query_map([], |r| r.get(0))?;
        rows.collect()
    }

    /// Every known file's recorded facts, `chunk` at a time, in row order
    /// (about the order the crawl found them: a chunk shares few
    /// directories).
    pub fn for_each_facts(&self, chunk: usize, mut f: impl FnMut(Vec<FileFacts>)) -> rusqlite::Result<()> {
        let mut st =
            self.conn.prepare(&format!("SELECT {PATH_COLS}, d.dev, f.ino, f.size, f.mtime, f.ctime {FROM_FILES}"))?;
        let mut rows = st.query([])?;
        let mut batch = Vec::with_capacity(chunk);
        while let Some(r) = rows.next()? {
            batch.push(FileFacts {
                path: child_path(r.get_ref(0)?.as_blob()?, r.get_ref(1)?.as_blob()?),
                key: FileKey { volume: r.get::<_, i64>(2)? as u64, ino: r.get::<_, i64>(3)? as u64 },
                size: r.get::<_, i64>(4)? as u64,
                mtime: r.get(5)?,
                ctime: r.get(6)?,
            });
            if batch.len() == chunk {
                f(std::mem::replace(&mut batch, Vec::with_capacity(chunk)));
            }
        }
        if !batch.is_empty() {
            f(batch);
        }
        Ok(())
    }

    /// The directory paths of the known files, once each.
    pub fn dir_paths(&self) -> rusqlite::Result<Vec<PathBuf>> {
        let mut st = self.conn.prepare("SELECT path FROM dirs")?;
        let rows = st.query_map([], |r| Ok(child_path(r.get_ref(0)?.as_blob()?, b"")))?;
        rows.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::writer::{self, WriteOp};
    use crate::hash::FileHash;

    fn hashed(dev: u64, ino: u64, path: &str) -> WriteOp {
        let map = crate::blockmap::BlockMap::from_fps(&[ino << 36 | 1 << 32]);
        let hash = FileHash { map, ..FileHash::empty(4096, 1) };
        WriteOp::Hashed { id: None, dev, ino, path: path.into(), mtime: 3, ctime: 4, hash }
    }

    fn write(db: Db, run: i64, ops: Vec<WriteOp>) -> Db {
        let (tx, rx) = std::sync::mpsc::sync_channel(ops.len() + 1);
        ops.into_iter().for_each(|op| tx.send(op).unwrap());
        drop(tx);
        writer::run(db, run, rx, &crate::hash::MapBytes::default()).unwrap().0
    }

    #[test]
    fn files_are_found_by_volume_and_inode_and_this_runs_rows_are_not_known_before() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("db"), "fs").unwrap();
        let db = write(db, 1, vec![hashed(1, 10, "/v/a"), hashed(2, 10, "/w/b")]);
        let db = write(db, 2, vec![hashed(1, 11, "/v/c")]);
        for max in [0, PRELOAD_MAX] {
            lookups_and_passes(&db, Reader::open_preloading(&db.path, 2, max).unwrap());
        }
    }

    /// Lookups share a read transaction until the crawl releases it (it
    /// may then wait for the hashing) or a pass over the known files
    /// begins; that pass leaves out the ids not wanted.
    #[test]
    fn lookups_share_a_read_transaction_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("db"), "fs").unwrap();
        let db = write(db, 1, vec![hashed(1, 10, "/v/a"), hashed(1, 11, "/v/b")]);
        let r = Reader::open_preloading(&db.path, 2, 0).unwrap();
        assert!(r.conn.is_autocommit());
        let a = r.get(FileKey { volume: 1, ino: 10 }).unwrap().unwrap();
        assert!(!r.conn.is_autocommit(), "a lookup did not open the transaction the next ones share");
        assert!(r.get(FileKey { volume: 1, ino: 11 }).unwrap().is_some());
        r.release();
        assert!(r.conn.is_autocommit(), "released, the transaction stayed");
        r.release();
        assert!(r.get(FileKey { volume: 1, ino: 11 }).unwrap().is_some());
        let mut known = Vec::new();
        r.each_known(&|id| id != a.id, &mut |id, p| known.push((id, p.to_owned()))).unwrap();
        assert_eq!(known.len(), 1);
        assert_eq!(known[0].1, Path::new("/v/b"));
        assert!(r.conn.is_autocommit(), "the pass ran in the lookups' old snapshot");
    }

    /// What [`files_are_found_by_volume_and_inode_and_this_runs_rows_are_not_known_before`]
    /// checks, with lookups or with the preloaded map.
    fn lookups_and_passes(db: &Db, r: Reader) {
        let a = r.get(FileKey { volume: 1, ino: 10 }).unwrap().unwrap();
        let b = r.get(FileKey { volume: 2, ino: 10 }).unwrap().unwrap();
        assert_eq!((a.file.path.as_path(), a.file.size, a.file.mtime, a.hashed_run), (Path::new("/v/a"), 4096, 3, 1));
        assert_eq!(b.file.path, Path::new("/w/b"));
        assert!(r.get(FileKey { volume: 3, ino: 10 }).unwrap().is_none());
        let mut known = Vec::new();
        r.each_known(&|_| true, &mut |id, p| known.push((id, p.to_owned()))).unwrap();
        known.sort();
        assert_eq!(known, vec![(a.id, PathBuf::from("/v/a")), (b.id, PathBuf::from("/w/b"))]);
        // The plan's set: the rows of run 2, by id.
        let mut set = IdSet::new();
        assert_eq!(db.add_run_files(2, &mut set).unwrap(), 1);
        assert!(!set.contains(a.id) && !set.contains(b.id));
        assert_eq!(db.hashed_after(1).unwrap().len(), 1);
        assert_eq!(db.all_ids().unwrap().len(), 3);
        assert_eq!(db.id_of(FileKey { volume: 2, ino: 10 }).unwrap(), Some(b.id));
        let mut n = 0;
        db.for_each_facts(2, |chunk| n += chunk.len()).unwrap();
        assert_eq!(n, 3);
    }
}
