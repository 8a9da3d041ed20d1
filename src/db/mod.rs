//! The fingerprint database: one SQLite file per filesystem.
//!
//! In: hashed files from the hashing threads (through [`writer`]). Out:
//! rows only — the index of known files (for change detection), the block
//! maps the planner groups ([`maps`]), the facts the executor checks, and
//! what the `report` command shows ([`summary`]). No grouping or planning
//! happens here, and the SQLite connection never leaves this module: every
//! query is a method of [`Db`]. The write connection belongs to one writer
//! thread during the scan; reads happen before and after it on the main
//! thread.

pub mod compact;
pub mod explain;
pub mod kept_out;
pub mod maps;
pub mod migrate;
pub mod owner;
pub mod pending;
pub mod place;
pub mod reader;
pub mod sources;
pub mod summary;
pub mod too_large;
pub mod writer;

pub use maps::{MapRow, Snapshot};

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use crate::blockmap::{BlockMap, Fp};
pub use crate::file::Known;
use crate::file::{child_path, FileFacts, FileId, FileKey};
use crate::policy::DbFiles;
use place::Place;

/// Why a database could not be used. Each message says what to do.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)] // the fields are named by the messages
pub enum DbError {
    /// Another run holds the lock.
    #[error(
        "database {path} is locked by another dedupscan run (lock file {path}.lock); try again when it has finished"
    )]
    Locked { path: PathBuf },
    /// The schema is newer than this build.
    #[error("database was written by a newer dedupscan (schema version {found}, this build knows up to {supported}); upgrade dedupscan or point --db at another file")]
    TooNew { found: i64, supported: i64 },
    /// Read-only (`report`), and the schema is older than this build's: the
    /// block maps may be in a format it does not read (v11 widened them),
    /// and a report must not rewrite the database.
    #[error("database {path} has schema version {found}, older than this build's ({supported}); run `dedupscan` on the volume once to upgrade it (the upgrade to version 11 hashes every file again), then report")]
    TooOld { path: PathBuf, found: i64, supported: i64 },
    /// Not a readable SQLite database, or not one of ours.
    #[error("database {path} is not readable as a dedupscan database ({reason}); it was left untouched. Move it aside (e.g. `mv {path} {path}.broken`) and run again to rebuild it from a full scan")]
    Corrupt { path: PathBuf, reason: String },
    /// The database belongs to another filesystem.
    #[error("database {path} describes filesystem {found}, but the paths are on filesystem {expected}; use the default database location or another --db")]
    WrongFilesystem { path: PathBuf, found: String, expected: String },
    /// The file, its directory or its lock file could not be created.
    #[error("cannot create database {path}: {source}")]
    Create { path: PathBuf, source: std::io::Error },
    /// Another user could redirect or read the database there (see
    /// [`place`]): nothing was opened or created.
    #[error("refusing database {path}: {reason}; keep the database in a directory that only root (or the user running dedupscan) can write, such as the default /var/lib/dedupscan")]
    Unsafe { path: PathBuf, reason: String },
    /// Any other SQLite error.
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
}

/// An open database plus the lock that keeps other runs out.
pub struct Db {
    /// Private: callers go through the query methods (here, [`maps`],
    /// [`summary`]), so every SQL statement lives in `db/`.
    conn: Connection,
    /// Where the database lives: its directory made canonical (no symlink).
    pub path: PathBuf,
    /// Its directory, checked and held.
    place: Place,
    /// The run lock; `None` for a read-only [`Db::open_for_report`].
    _lock: Option<Flock<File>>,
    /// The schema version this open found, when it upgraded an existing
    /// database (the run says so when the upgrade dropped the block maps).
    pub upgraded_from: Option<i64>,
}

impl Db {
    /// Open (creating if needed, mode 0600) the database at `path` for the
    /// filesystem `fs_uuid`, take its lock, and migrate it. Its directory
    /// and files are checked first ([`place`]): one another user could
    /// redirect or read is refused ([`DbError::Unsafe`]).
    pub fn open(path: &Path, fs_uuid: &str) -> Result<Db, DbError> {
        let place = Place::prepare(path)?;
        place.check_files()?;
        let lock = take_lock(&place)?;
        place.create_database()?;
        let path = place.path.clone();
        let corrupt = |e: rusqlite::Error| DbError::Corrupt { path: path.to_owned(), reason: e.to_string() };
        let flags =
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_NOFOLLOW;
        let mut conn = Connection::open_with_flags(&path, flags).map_err(corrupt)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0)).map_err(corrupt)?;
        debug_assert_eq!(mode.to_lowercase(), "wal");
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "cache_size", CACHE_SIZE)?;
        stable_plans(&conn)?;
        let found = migrate::migrate(&mut conn).map_err(|e| match e {
            DbError::Sqlite(s) => corrupt(s),
            other => other,
        })?;
        let upgraded_from = (found > 0 && found < migrate::CURRENT).then_some(found);
        let db = Db { conn, path: path.clone(), place, _lock: Some(lock), upgraded_from };
        match db.meta("filesystem")? {
            Some(found) if found != fs_uuid => {
                return Err(DbError::WrongFilesystem { path: path.to_owned(), found, expected: fs_uuid.to_owned() })
            }
            Some(_) => {}
            None => db.set_meta("filesystem", fs_uuid)?,
        }
        Ok(db)
    }

    /// Open an existing database read-only for `report`, without the lock
    /// (WAL readers never block the writer, so a report works during a run).
    /// Its directory and files are checked as for a run: `report` reads
    /// every path and fingerprint too.
    pub fn open_for_report(path: &Path) -> Result<Db, DbError> {
        let place = Place::existing(path)?;
        place.check_files()?;
        let path = place.path.clone();
        Ok(Db { conn: Self::open_readonly(&path)?, path, place, _lock: None, upgraded_from: None })
    }

    /// The database's files (itself, SQLite's, the lock), for the crawl to
    /// leave alone: by the directory's identity and their names, so those
    /// SQLite creates during the run are known before they exist.
    pub fn own_files(&self) -> DbFiles {
        self.place.own_files()
    }

    /// A read-only connection to an existing database at `path`, a path
    /// a [`Place`] made canonical (a symlink in it is refused).
    fn open_readonly(path: &Path) -> Result<Connection, DbError> {
        let corrupt = |e: rusqlite::Error| DbError::Corrupt { path: path.to_owned(), reason: e.to_string() };
        // No mutex: a connection is used by one thread at a time (rusqlite's
        // `Connection` is not `Sync`); with one, every column read locks and
        // unlocks it.
        let flags =
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_NOFOLLOW;
        let conn = Connection::open_with_flags(path, flags).map_err(corrupt)?;
        conn.pragma_update(None, "cache_size", CACHE_SIZE).map_err(corrupt)?;
        stable_plans(&conn).map_err(corrupt)?;
        let v: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(corrupt)?;
        if v > migrate::CURRENT {
            return Err(DbError::TooNew { found: v, supported: migrate::CURRENT });
        }
        // A version-11 or 12 database differs only by the shared runs
        // (`schema/0012_shared_runs.sql`) or refusals (`0013_too_large.sql`)
        // it lacks: readable, its files grouped block by block.
        if v < migrate::MAPS_DROPPED_AT {
            return Err(DbError::TooOld { path: path.to_owned(), found: v, supported: migrate::CURRENT });
        }
        Ok(conn)
    }

    /// Record the stable name of the device the filesystem is on, which
    /// tells it from a clone with the same UUID ([`owner`]).
    pub fn on_device(self, device: Option<&str>) -> rusqlite::Result<Db> {
        if let Some(device) = device {
            self.set_meta(owner::DEVICE_KEY, device)?;
        }
        Ok(self)
    }

    /// A value of the `meta` table (filesystem, block size, ...).
    pub fn meta(&self, key: &str) -> rusqlite::Result<Option<String>> {
        self.conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).optional()
    }

    /// Set a value of the `meta` table.
    pub fn set_meta(&self, key: &str, value: &str) -> rusqlite::Result<()> {
        self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)", [key, value]).map(drop)
    }

    /// Have the next run read files `ids` again whatever their size and
    /// times say: their recorded fingerprints were found stale (see
    /// `dedupe::verify`). Their mtime tag is inverted, which no stat of
    /// the file gives (the tag of another time), so change detection finds
    /// them changed at their path and under any other.
    pub fn distrust(&self, ids: &BTreeSet<FileId>) -> rusqlite::Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let tx = self.conn.unchecked_transaction()?;
        {
            let mut st = tx.prepare("UPDATE files SET mtime = ~mtime WHERE id = ?1")?;
            for id in ids {
                st.execute([id])?;
            }
        }
        tx.commit()
    }

    /// Record what run `run` found pinned (btrfs; see
    /// [`crate::dedupe::PinReason`]): the rows of the destinations whose
    /// extents it judged (`checked`) are replaced by `now`; rows of files
    /// forgotten, or changed since their row was written, are dropped.
    pub fn save_pinned(&self, checked: &[FileId], now: &[(FileId, &str, u64)], run: i64) -> rusqlite::Result<()> {
        let tx = self.conn.unchecked_transaction()?;
        {
            let mut del = tx.prepare("DELETE FROM pinned WHERE file_id = ?1")?;
            for id in checked {
                del.execute([id])?;
            }
            let mut ins = tx.prepare(
                "INSERT OR REPLACE INTO pinned (file_id, reason, bytes, ctime, run) \
                 SELECT id, ?2, ?3, ctime, ?4 FROM files WHERE id = ?1",
            )?;
            for (id, why, bytes) in now {
                ins.execute(params![id, why, *bytes as i64, run])?;
            }
            tx.execute(
                "DELETE FROM pinned WHERE NOT EXISTS \
                 (SELECT 1 FROM files f WHERE f.id = pinned.file_id AND f.ctime = pinned.ctime)",
                [],
            )?;
        }
        tx.commit()
    }

    /// Drop every block fingerprint (after the block size changed, all
    /// files must be hashed again).
    pub fn forget_all_hashes(&self) -> rusqlite::Result<()> {
        self.conn.execute_batch("DELETE FROM files; DELETE FROM dirs; DELETE FROM shared_runs; DELETE FROM sources;")
    }

    /// Record the start of a run; returns its id.
    pub fn begin_run(&self, command: &str, dry_run: bool) -> rusqlite::Result<i64> {
        self.conn.execute(
            "INSERT INTO runs (started_at, command, dry_run) VALUES (?1, ?2, ?3)",
            params![unix_now(), command, dry_run],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Record the end of run `run` and its report (JSON).
    pub fn finish_run(&self, run: i64, report_json: &str) -> rusqlite::Result<()> {
        self.conn
            .execute(
                "UPDATE runs SET finished_at = ?1, report = ?2 WHERE id = ?3",
                params![unix_now(), report_json, run],
            )
            .map(drop)
    }

    /// The recorded facts of the given files, as the executor checks them
    /// before use.
    pub fn file_facts(&self, ids: impl IntoIterator<Item = FileId>) -> rusqlite::Result<HashMap<FileId, FileFacts>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {PATH_COLS}, d.dev, f.ino, f.size, f.mtime, f.ctime {FROM_FILES} WHERE f.id = ?1"
        ))?;
        // One read transaction, as in `plan::from_db`: ~0.6 s less for the 100k
        // files of the FULL benchmark's plan. Inside one already (a batch of
        // `plan::from_db` handed out while it reads), that one serves.
        let _read = if self.conn.is_autocommit() { Some(self.conn.unchecked_transaction()?) } else { None };
        let mut out = HashMap::new();
        // In id order, so that consecutive lookups walk the same B-tree
        // pages: FULL's 118,244 files in 0.12 s instead of 0.24 s in the
        // order of a hash set.
        let mut ids: Vec<FileId> = ids.into_iter().collect();
        ids.sort_unstable();
        for id in ids {
            let row = st
                .query_row([id], |r| {
                    Ok(FileFacts {
                        path: child_path(r.get_ref(0)?.as_blob()?, r.get_ref(1)?.as_blob()?),
                        key: FileKey { volume: r.get::<_, i64>(2)? as u64, ino: r.get::<_, i64>(3)? as u64 },
                        size: r.get::<_, i64>(4)? as u64,
                        mtime: r.get(5)?,
                        ctime: r.get(6)?,
                    })
                })
                .optional()?;
            if let Some(c) = row {
                out.insert(id, c);
            }
        }
        Ok(out)
    }
}

/// The columns a file's path is rebuilt from, and the join they need.
/// SQLite's page cache, in KiB when negative: 512 KiB, not the default 2
/// MiB. The database is read in streams (every block map, the files in
/// inode order) and by row id, which the kernel's page cache serves as
/// well; the rest of SQLite's cache stood at the plan's peak (heaptrack on
/// FULL: 2.3 MB).
const CACHE_SIZE: i64 = -512;

const PATH_COLS: &str = "d.path, f.name";
const FROM_FILES: &str = "FROM files f JOIN dirs d ON d.id = f.dir";

/// Smallest encoded block map (64 bytes: eleven data blocks, sixteen with
/// the 4-byte maps before schema v11) that copies store once, as a
/// reference to a twin (see `schema/0004_small_database.sql`): below it, a
/// reference and its index entry would cost about what they save.
pub const TWIN_MIN_MAP: usize = 64;

/// A block map as `files.blocks` stores it: the map itself, or the id of
/// the twin that holds it.
pub(crate) fn stored_map<'a>(conn: &Connection, v: ValueRef<'a>) -> rusqlite::Result<Cow<'a, [u8]>> {
    match v {
        ValueRef::Blob(b) => Ok(Cow::Borrowed(b)),
        ValueRef::Integer(holder) => {
            let mut st = conn.prepare_cached("SELECT blocks FROM files WHERE id = ?1")?;
            Ok(Cow::Owned(st.query_row([holder], |r| r.get::<_, Vec<u8>>(0))?))
        }
        other => Err(rusqlite::Error::InvalidColumnType(0, "blocks".into(), other.data_type())),
    }
}

/// The block map of file `id` (through its twin if it has one), if the
/// file is known.
pub(crate) fn file_map(conn: &Connection, id: FileId) -> rusqlite::Result<Option<Vec<u8>>> {
    let mut st = conn.prepare_cached("SELECT blocks FROM files WHERE id = ?1")?;
    st.query_row([id], |r| Ok(stored_map(conn, r.get_ref(0)?)?.into_owned())).optional()
}

/// Block map blob from one 64-bit fingerprint per block (tests and
/// benches; the hasher builds a [`BlockMap`] directly). See
/// [`crate::blockmap`] for the format.
pub fn encode_blocks(blocks: &[u64]) -> Vec<u8> {
    BlockMap::from_fps(blocks).into_bytes()
}

/// Inverse of [`encode_blocks`], expanded: one entry per block, holes as 0.
/// Only for small maps (tests); everything else reads maps sparsely through
/// [`BlockMap`].
pub fn decode_blocks(blob: &[u8]) -> Vec<Fp> {
    BlockMap::from_bytes(blob.to_vec()).to_dense(u64::MAX).expect("a small block map")
}

/// Path as stored: raw bytes, lossless.
pub fn path_bytes(p: &Path) -> &[u8] {
    p.as_os_str().as_bytes()
}

/// One query plan per statement, whatever values are bound to it
/// (`SQLITE_DBCONFIG_ENABLE_QPSG`). SQLite as built here (STAT4) otherwise
/// marks a statement whose plan might depend on a bound value, and the
/// statement cache's `clear_bindings` expires it: every use of a cached
/// lookup then parses and plans its SQL again (the crawl's lookup of a
/// file: 26 µs instead of 3 µs). The lookups are by key (an inode, an
/// id), so one plan serves every value. Found in the zero
/// pass: `id_of` asked once per holder of a shared extent spent 34% of a
/// run re-preparing.
pub(crate) fn stable_plans(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).map(|_| ())
}

/// Take `<db>.lock` exclusively without waiting. The lock belongs to the
/// open descriptor, so the kernel releases it even when the run is killed.
fn take_lock(place: &Place) -> Result<Flock<File>, DbError> {
    let f = place.open_lock()?;
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(guard) => Ok(guard),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(DbError::Locked { path: place.path.clone() }),
        Err((_, e)) => {
            let mut lock_path = place.path.as_os_str().to_owned();
            lock_path.push(".lock");
            Err(DbError::Create { path: PathBuf::from(lock_path), source: e.into() })
        }
    }
}

/// Seconds since the epoch (0 if the clock is before it).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blockmap::short_fp;

    #[test]
    fn a_report_refuses_an_older_schema_and_leaves_it_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.sqlite");
        let mut c = Connection::open(&path).unwrap();
        migrate::migrate_to(&mut c, 10).unwrap();
        drop(c);
        let err = Db::open_for_report(&path).err().expect("a v10 database read by a v11 report");
        assert!(matches!(err, DbError::TooOld { found: 10, .. }), "{err}");
        assert!(err.to_string().contains("run `dedupscan` on the volume once"), "{err}");
        let c = Connection::open(&path).unwrap();
        assert_eq!(c.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0)).unwrap(), 10, "rewritten");
        drop(c);
        // Version 11 lacks only the shared runs: a report reads it as it
        // is (no runs: every block grouped), and leaves it at 11.
        let mut c = Connection::open(&path).unwrap();
        migrate::migrate_to(&mut c, 11).unwrap();
        drop(c);
        let db = Db::open_for_report(&path).expect("a v11 database is readable");
        db.for_each_shared_runs(|_| true, |_, _, _, _| panic!("no runs at v11")).unwrap();
        drop(db);
        let c = Connection::open(&path).unwrap();
        assert_eq!(c.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0)).unwrap(), 11, "rewritten");
    }

    #[test]
    fn block_maps_round_trip_with_zero_runs() {
        let fps = [0x1234_5678_0000_0001u64, 0, 0, 0, 7 << 40, 0, 9 << 33];
        let blob = encode_blocks(&fps);
        assert_eq!(decode_blocks(&blob), fps.iter().map(|&f| short_fp(f)).collect::<Vec<_>>());
        // Seven blocks, two zero runs: 6 + 12 + 6 + 12 + 6 bytes.
        assert_eq!(blob.len(), 42);
        let holes = vec![0u64; 100_000];
        assert_eq!(encode_blocks(&holes).len(), 12);
        assert_eq!(decode_blocks(&encode_blocks(&holes)).len(), 100_000);
    }

    use crate::hash::FileHash;
    use writer::{WriteOp, Written};

    /// Apply `ops` through the writer thread's loop, as run `run`.
    fn write(db: Db, run: i64, ops: Vec<WriteOp>) -> (Db, Written) {
        let (tx, rx) = std::sync::mpsc::sync_channel(ops.len() + 1);
        for op in ops {
            tx.send(op).unwrap();
        }
        drop(tx);
        writer::run(db, run, rx, &crate::hash::MapBytes::default()).unwrap()
    }

    fn hashed(id: Option<FileId>, ino: u64, path: &str, blocks: &[u64]) -> WriteOp {
        let map = crate::blockmap::BlockMap::from_fps(blocks);
        let hash = FileHash { map, ..FileHash::empty(blocks.len() as u64 * 4096, 1) };
        WriteOp::Hashed { id, dev: 1, ino, path: path.into(), mtime: 0, ctime: 0, hash }
    }

    /// A block map of `n` blocks.
    fn map(seed: u64, n: u64) -> Vec<u64> {
        (1..=n)
            .map(|i| if i % 5 == 0 { (seed * 1000 + i) << 36 } else { ((seed * 1000 + i) << 36) | 1 << 32 })
            .collect()
    }

    fn id_of(db: &Db, ino: u64) -> FileId {
        db.conn.query_row("SELECT id FROM files WHERE ino = ?1", [ino as i64], |r| r.get(0)).unwrap()
    }

    fn stored_as(db: &Db, id: FileId) -> String {
        db.conn.query_row("SELECT typeof(blocks) FROM files WHERE id = ?1", [id], |r| r.get(0)).unwrap()
    }

    /// Files with equal (resolved) block maps, as sorted groups of two or
    /// more: what the planner will see as whole-file copies.
    fn whole_groups(db: &Db) -> Vec<Vec<FileId>> {
        let mut by_map: std::collections::BTreeMap<Vec<u8>, Vec<FileId>> = Default::default();
        db.for_each_map(|_| true, |id, _, map| by_map.entry(map.to_vec()).or_default().push(id)).unwrap();
        let mut groups: Vec<Vec<FileId>> = by_map.into_values().filter(|g| g.len() > 1).collect();
        groups.iter_mut().for_each(|g| g.sort());
        groups.sort();
        groups
    }

    #[test]
    fn copies_store_one_block_map_and_hand_it_over() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("db"), "fs").unwrap();
        let (m, small) = (map(1, 20), map(2, 3));
        let ops = vec![
            hashed(None, 1, "/v/a", &m),
            hashed(None, 2, "/v/b", &m),
            hashed(None, 3, "/w/c", &m),
            hashed(None, 4, "/v/s1", &small),
            hashed(None, 5, "/v/s2", &small),
        ];
        let (db, _) = write(db, 1, ops);
        let (a, b, c) = (id_of(&db, 1), id_of(&db, 2), id_of(&db, 3));
        // The copies refer to the first; short maps are stored every time.
        assert_eq!(stored_as(&db, a), "blob");
        assert_eq!((stored_as(&db, b), stored_as(&db, c)), ("integer".into(), "integer".into()));
        assert_eq!((stored_as(&db, id_of(&db, 4)), stored_as(&db, id_of(&db, 5))), ("blob".into(), "blob".into()));
        assert_eq!(whole_groups(&db), vec![vec![a, b, c], vec![id_of(&db, 4), id_of(&db, 5)]]);

        // The holder goes: the next copy holds the map, the other points at it.
        let (db, _) = write(db, 2, vec![WriteOp::Removed { id: a }]);
        assert_eq!(stored_as(&db, b), "blob");
        let c_ref: i64 = db.conn.query_row("SELECT blocks FROM files WHERE id = ?1", [c], |r| r.get(0)).unwrap();
        assert_eq!(c_ref, b.0);
        assert_eq!(whole_groups(&db)[0], vec![b, c]);

        // The new holder is rewritten with other content: the last copy
        // takes the map.
        let (db, _) = write(db, 3, vec![hashed(Some(b), 2, "/v/b", &map(3, 20))]);
        assert_eq!(stored_as(&db, c), "blob");
        assert_eq!(whole_groups(&db), vec![vec![id_of(&db, 4), id_of(&db, 5)]]);
        let rows = db.map_rows([c]).unwrap();
        assert_eq!(rows[0].map, BlockMap::from_fps(&m));

        // Directories without files are dropped; paths survive the split.
        let (db, _) = write(db, 4, vec![WriteOp::Removed { id: c }]);
        let dirs: Vec<Vec<u8>> = db
            .conn
            .prepare("SELECT path FROM dirs")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(dirs, vec![b"/v".to_vec()]);
        let facts = db.file_facts([b]).unwrap();
        assert_eq!(facts[&b].path, Path::new("/v/b"));
    }

    #[test]
    fn shared_runs_follow_their_file() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("db"), "fs").unwrap();
        let op = |id, ino, runs: Vec<(u64, u64, u64)>| {
            let mut op = hashed(id, ino, &format!("/v/{ino}"), &map(ino, 20));
            if let WriteOp::Hashed { hash, .. } = &mut op {
                (hash.shared_runs, hash.salt) = (runs, 3);
            }
            op
        };
        let (db, _) = write(db, 1, vec![op(None, 1, vec![(0, 100, 20)]), op(None, 2, vec![(2, 102, 3)])]);
        let (a, b) = (id_of(&db, 1), id_of(&db, 2));
        let runs = |db: &Db| {
            let mut all = Vec::new();
            db.for_each_shared_runs(|_| true, |id, k, salt, r| all.push((id, k.ino, salt, r.to_vec()))).unwrap();
            all.sort();
            all
        };
        assert_eq!(runs(&db), vec![(a, 1, 3, vec![(0, 100, 20)]), (b, 2, 3, vec![(2, 102, 3)])]);
        // Hashed again with no shared extent, removed: the rows go too.
        let (db, _) = write(db, 2, vec![op(Some(a), 1, vec![]), WriteOp::Removed { id: b }]);
        assert_eq!(runs(&db), vec![]);
        let (db, _) = write(db, 3, vec![op(Some(a), 1, vec![(5, 7, 1)])]);
        assert_eq!(runs(&db), vec![(a, 1, 3, vec![(5, 7, 1)])]);
        db.forget_all_hashes().unwrap();
        assert_eq!(runs(&db), vec![]);
    }

    /// A cached lookup asked with value after value keeps its one plan
    /// ([`stable_plans`]): without it, every use of `id_of` was parsed
    /// and planned again.
    #[test]
    fn a_cached_lookup_is_planned_once_whatever_it_is_asked() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("db"), "fs").unwrap();
        let ops = (1..=3).map(|i| hashed(None, i, &format!("/v/{i}"), &map(i, 2))).collect();
        let (db, _) = write(db, 1, ops);
        for ino in [1, 2, 3, 9, 1, 2] {
            let found = db.id_of(FileKey { volume: 1, ino }).unwrap();
            assert_eq!(found.is_some(), ino <= 3);
        }
        let st = db.conn.prepare_cached(reader::ID_OF).unwrap();
        assert_eq!(st.get_status(rusqlite::StatementStatus::RePrepare), 0, "the lookup was prepared again");
    }

    #[test]
    fn a_renamed_file_moves_to_its_new_directory() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("db"), "fs").unwrap();
        let (db, _) = write(db, 1, vec![hashed(None, 1, "/v/a", &map(1, 2))]);
        let a = id_of(&db, 1);
        let (db, _) = write(db, 2, vec![WriteOp::Renamed { id: a, dev: 1, path: "/w/x/b".into(), ctime: 9 }]);
        use crate::changes::Index;
        let k = reader::Reader::open(&db.path, 0).unwrap().get(FileKey { volume: 1, ino: 1 }).unwrap().unwrap();
        assert_eq!((k.file.path.as_path(), k.file.ctime, k.hashed_run), (Path::new("/w/x/b"), 9, 1));
        let n: i64 = db.conn.query_row("SELECT count(*) FROM dirs", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1);
    }
}
