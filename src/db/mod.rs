//! The fingerprint database: one SQLite file per filesystem.
//!
//! In: hashed files from the hashing threads (through [`writer`]). Out: the
//! index of known files (for change detection) and the duplicate groups the
//! planner works on. The write connection belongs to one writer thread during
//! the scan; reads happen before and after it on the main thread.

pub mod migrate;
pub mod writer;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use crate::hash::ZERO_FP;
use crate::plan::{self, short_fp, Fp, Plan, PlanFile, PlanOptions};
use crate::types::FileId;
use crate::walk::Candidate;

/// Why a database could not be used. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error(
        "database {path} is locked by another dedupscan run (lock file {path}.lock); try again when it has finished"
    )]
    Locked { path: PathBuf },
    #[error("database was written by a newer dedupscan (schema version {found}, this build knows up to {supported}); upgrade dedupscan or point --db at another file")]
    TooNew { found: i64, supported: i64 },
    #[error("database {path} is not readable as a dedupscan database ({reason}); it was left untouched. Move it aside (e.g. `mv {path} {path}.broken`) and run again to rebuild it from a full scan")]
    Corrupt { path: PathBuf, reason: String },
    #[error("database {path} describes filesystem {found}, but the paths are on filesystem {expected}; use the default database location or another --db")]
    WrongFilesystem { path: PathBuf, found: String, expected: String },
    #[error("cannot create database {path}: {source}")]
    Create { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
}

/// What the database knows about one file, for change detection.
#[derive(Debug, Clone)]
pub struct Known {
    pub id: FileId,
    pub path: PathBuf,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

/// An open database plus the lock that keeps other runs out.
pub struct Db {
    pub conn: Connection,
    pub path: PathBuf,
    /// The run lock; `None` for a read-only [`Db::open_for_report`].
    _lock: Option<Flock<File>>,
}

impl Db {
    /// Open (creating if needed, mode 0600) the database at `path` for the
    /// filesystem `fs_uuid`, take its lock, and migrate it.
    pub fn open(path: &Path, fs_uuid: &str) -> Result<Db, DbError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|source| DbError::Create { path: path.to_owned(), source })?;
        }
        let lock = take_lock(path)?;
        // Create the file ourselves so that it is 0600 from the first byte:
        // it lists every path and fingerprint on the volume.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| DbError::Create { path: path.to_owned(), source })?;
        let corrupt = |e: rusqlite::Error| DbError::Corrupt { path: path.to_owned(), reason: e.to_string() };
        let mut conn =
            Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)
                .map_err(corrupt)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0)).map_err(corrupt)?;
        debug_assert_eq!(mode.to_lowercase(), "wal");
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        migrate::migrate(&mut conn).map_err(|e| match e {
            DbError::Sqlite(s) => corrupt(s),
            other => other,
        })?;
        let db = Db { conn, path: path.to_owned(), _lock: Some(lock) };
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
    pub fn open_for_report(path: &Path) -> Result<Db, DbError> {
        Ok(Db { conn: Self::open_readonly(path)?, path: path.to_owned(), _lock: None })
    }

    /// A read-only connection to an existing database.
    pub fn open_readonly(path: &Path) -> Result<Connection, DbError> {
        let corrupt = |e: rusqlite::Error| DbError::Corrupt { path: path.to_owned(), reason: e.to_string() };
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(corrupt)?;
        let v: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(corrupt)?;
        if v > migrate::CURRENT {
            return Err(DbError::TooNew { found: v, supported: migrate::CURRENT });
        }
        Ok(conn)
    }

    pub fn meta(&self, key: &str) -> rusqlite::Result<Option<String>> {
        self.conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).optional()
    }

    pub fn set_meta(&self, key: &str, value: &str) -> rusqlite::Result<()> {
        self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)", [key, value]).map(drop)
    }

    /// Every known file, keyed by (dev, inode).
    pub fn load_index(&self) -> rusqlite::Result<HashMap<(u64, u64), Known>> {
        let mut st = self.conn.prepare("SELECT id, dev, ino, path, size, mtime_ns, ctime_ns FROM files")?;
        let rows = st.query_map([], |r| {
            let key = (r.get::<_, i64>(1)? as u64, r.get::<_, i64>(2)? as u64);
            Ok((
                key,
                Known {
                    id: r.get(0)?,
                    path: PathBuf::from(std::ffi::OsString::from_vec(r.get(3)?)),
                    size: r.get::<_, i64>(4)? as u64,
                    mtime_ns: r.get(5)?,
                    ctime_ns: r.get(6)?,
                },
            ))
        })?;
        rows.collect()
    }

    /// Drop every block fingerprint (after the block size changed, all
    /// files must be hashed again).
    pub fn forget_all_hashes(&self) -> rusqlite::Result<()> {
        self.conn.execute_batch("DELETE FROM anchors; DELETE FROM files;")
    }

    /// Record the start of a run; returns its id.
    pub fn begin_run(&self, command: &str, dry_run: bool) -> rusqlite::Result<i64> {
        self.conn.execute(
            "INSERT INTO runs (started_at, command, dry_run) VALUES (?1, ?2, ?3)",
            params![unix_now(), command, dry_run],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    pub fn finish_run(&self, run: i64, report_json: &str) -> rusqlite::Result<()> {
        self.conn
            .execute(
                "UPDATE runs SET finished_at = ?1, report = ?2 WHERE id = ?3",
                params![unix_now(), report_json, run],
            )
            .map(drop)
    }

    /// Files hashed by a run after `run` (fresh since then).
    pub fn hashed_after(&self, run: i64) -> rusqlite::Result<HashSet<FileId>> {
        let mut st = self.conn.prepare("SELECT id FROM files WHERE hashed_run > ?1")?;
        let rows = st.query_map([run], |r| r.get(0))?;
        rows.collect()
    }

    /// Groups of files with the same size and whole-file digest, among
    /// `allowed`, each sorted by id (oldest first).
    pub fn whole_file_groups(&self, allowed: &HashSet<FileId>) -> rusqlite::Result<Vec<Vec<FileId>>> {
        let mut st =
            self.conn.prepare("SELECT id, size, digest FROM files WHERE size > 0 ORDER BY size, digest, id")?;
        let mut rows = st.query([])?;
        let mut groups = Vec::new();
        let mut cur: Vec<FileId> = Vec::new();
        let mut cur_key: Option<(i64, Vec<u8>)> = None;
        while let Some(r) = rows.next()? {
            let id: FileId = r.get(0)?;
            if !allowed.contains(&id) {
                continue;
            }
            let key = (r.get::<_, i64>(1)?, r.get::<_, Vec<u8>>(2)?);
            if cur_key.as_ref() != Some(&key) {
                if cur.len() > 1 {
                    groups.push(std::mem::take(&mut cur));
                }
                cur.clear();
                cur_key = Some(key);
            }
            cur.push(id);
        }
        if cur.len() > 1 {
            groups.push(cur);
        }
        Ok(groups)
    }

    /// Occurrences of every anchor fingerprint seen at least twice among
    /// `allowed` files, skipping files in `covered` (already handled as
    /// whole-file duplicates).
    pub fn anchor_groups(
        &self,
        allowed: &HashSet<FileId>,
        covered: &HashSet<FileId>,
    ) -> rusqlite::Result<Vec<Vec<(FileId, u64)>>> {
        let mut st = self.conn.prepare("SELECT fp, file_id, blk FROM anchors ORDER BY fp")?;
        let mut rows = st.query([])?;
        let mut groups = Vec::new();
        let mut cur: Vec<(FileId, u64)> = Vec::new();
        let mut cur_fp: Option<i64> = None;
        while let Some(r) = rows.next()? {
            let id: FileId = r.get(1)?;
            if !allowed.contains(&id) || covered.contains(&id) {
                continue;
            }
            let fp: i64 = r.get(0)?;
            if cur_fp != Some(fp) {
                if cur.len() > 1 {
                    groups.push(std::mem::take(&mut cur));
                }
                cur.clear();
                cur_fp = Some(fp);
            }
            cur.push((id, r.get::<_, i64>(2)? as u64));
        }
        if cur.len() > 1 {
            groups.push(cur);
        }
        Ok(groups)
    }

    /// Build the plan over the `allowed` files: whole-file groups first,
    /// then anchor groups. With `fresh`, only groups holding a fresh file are
    /// planned (incremental runs). Returns the plan and the number of
    /// whole-file groups.
    pub fn plan(
        &self,
        allowed: &HashSet<FileId>,
        fresh: Option<&HashSet<FileId>>,
        opts: PlanOptions,
    ) -> rusqlite::Result<(Plan, usize)> {
        let mut whole = self.whole_file_groups(allowed)?;
        let covered: HashSet<FileId> = whole.iter().flat_map(|g| g[1..].iter().copied()).collect();
        let anchor_groups = match fresh {
            Some(fresh) => {
                whole.retain(|g| g.iter().any(|id| fresh.contains(id)));
                self.anchor_groups_for(fresh, allowed, &covered)?
            }
            None => self.anchor_groups(allowed, &covered)?,
        };
        let mut involved: Vec<FileId> =
            whole.iter().flatten().copied().chain(anchor_groups.iter().flatten().map(|(id, _)| *id)).collect();
        involved.sort_unstable();
        involved.dedup();
        let files = self.plan_files(involved)?;
        Ok((plan::plan(&files, &whole, &anchor_groups, opts), whole.len()))
    }

    /// Anchor groups that hold an anchor of one of the `fresh` files: each
    /// fresh file's anchors are recomputed from its block map and looked up
    /// by key range, so an incremental run never scans the whole index.
    pub fn anchor_groups_for(
        &self,
        fresh: &HashSet<FileId>,
        allowed: &HashSet<FileId>,
        covered: &HashSet<FileId>,
    ) -> rusqlite::Result<Vec<Vec<(FileId, u64)>>> {
        let mut blob_st = self.conn.prepare_cached("SELECT blocks FROM files WHERE id = ?1")?;
        let mut range_st =
            self.conn.prepare_cached("SELECT fp, file_id, blk FROM anchors WHERE fp BETWEEN ?1 AND ?2")?;
        let mut prefixes: HashSet<u32> = HashSet::new();
        let mut fresh_ids: Vec<FileId> = fresh.iter().copied().collect();
        fresh_ids.sort_unstable();
        for id in fresh_ids {
            let Some(blob): Option<Vec<u8>> = blob_st.query_row([id], |r| r.get(0)).optional()? else { continue };
            let blocks = decode_blocks(&blob);
            prefixes.extend(plan::anchors(&blocks).into_iter().map(|i| blocks[i as usize]));
        }
        let mut by_fp: std::collections::BTreeMap<i64, Vec<(FileId, u64)>> = Default::default();
        for p in prefixes {
            let hi = (p as u64) << 32;
            let rows = range_st.query_map(rusqlite::params![hi as i64, (hi | 0xFFFF_FFFF) as i64], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, FileId>(1)?, r.get::<_, i64>(2)? as u64))
            })?;
            for row in rows {
                let (fp, id, blk) = row?;
                if allowed.contains(&id) && !covered.contains(&id) {
                    by_fp.entry(fp).or_default().push((id, blk));
                }
            }
        }
        Ok(by_fp.into_values().filter(|g| g.len() > 1 && g.iter().any(|(id, _)| fresh.contains(id))).collect())
    }

    /// The recorded facts of the given files, as the executor checks them
    /// before use.
    pub fn file_facts(&self, ids: impl IntoIterator<Item = FileId>) -> rusqlite::Result<HashMap<FileId, Candidate>> {
        let mut st =
            self.conn.prepare_cached("SELECT path, dev, ino, size, mtime_ns, ctime_ns FROM files WHERE id = ?1")?;
        let mut out = HashMap::new();
        for id in ids {
            let row = st
                .query_row([id], |r| {
                    Ok(Candidate {
                        path: PathBuf::from(std::ffi::OsString::from_vec(r.get(0)?)),
                        dev: r.get::<_, i64>(1)? as u64,
                        ino: r.get::<_, i64>(2)? as u64,
                        size: r.get::<_, i64>(3)? as u64,
                        mtime_ns: r.get(4)?,
                        ctime_ns: r.get(5)?,
                    })
                })
                .optional()?;
            if let Some(c) = row {
                out.insert(id, c);
            }
        }
        Ok(out)
    }

    /// Block maps of the given files, ranked as sources (see
    /// [`PlanFile::rank`]): hashed by an earlier run first, then by path.
    pub fn plan_files(&self, ids: impl IntoIterator<Item = FileId>) -> rusqlite::Result<Vec<PlanFile>> {
        let mut st = self.conn.prepare_cached("SELECT size, blocks, hashed_run, path FROM files WHERE id = ?1")?;
        let mut rows: Vec<((i64, Vec<u8>), PlanFile)> = Vec::new();
        for id in ids {
            let row: Option<(i64, Vec<u8>, i64, Vec<u8>)> =
                st.query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))).optional()?;
            if let Some((size, blob, run, path)) = row {
                rows.push(((run, path), PlanFile { id, rank: 0, size: size as u64, blocks: decode_blocks(&blob) }));
            }
        }
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(rows
            .into_iter()
            .enumerate()
            .map(|(i, (_, mut f))| {
                f.rank = i as u64;
                f
            })
            .collect())
    }
}

/// Block map blob: per block the 4-byte fingerprint ([`short_fp`]), little
/// endian; a 0 (zero block or hole) is followed by the length of the run of
/// zero blocks it starts, so sparse files cost nothing for their holes.
pub fn encode_blocks(blocks: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(blocks.len() * 4);
    let mut i = 0;
    while i < blocks.len() {
        let fp = short_fp(blocks[i]);
        out.extend_from_slice(&fp.to_le_bytes());
        i += 1;
        if fp == 0 {
            let start = i - 1;
            while i < blocks.len() && blocks[i] == ZERO_FP && i - start < u32::MAX as usize {
                i += 1;
            }
            out.extend_from_slice(&((i - start) as u32).to_le_bytes());
        }
    }
    out
}

/// Inverse of [`encode_blocks`].
pub fn decode_blocks(blob: &[u8]) -> Vec<Fp> {
    let mut words = blob.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")));
    let mut out = Vec::with_capacity(blob.len() / 4);
    while let Some(fp) = words.next() {
        if fp == 0 {
            let run = words.next().unwrap_or(1) as usize;
            out.resize(out.len() + run, 0);
        } else {
            out.push(fp);
        }
    }
    out
}

/// Path as stored: raw bytes, lossless.
pub fn path_bytes(p: &Path) -> &[u8] {
    p.as_os_str().as_bytes()
}

/// Take `<db>.lock` exclusively without waiting. The lock belongs to the
/// open descriptor, so the kernel releases it even when the run is killed.
fn take_lock(path: &Path) -> Result<Flock<File>, DbError> {
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|source| DbError::Create { path: PathBuf::from(&lock_path), source })?;
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(guard) => Ok(guard),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(DbError::Locked { path: path.to_owned() }),
        Err((_, e)) => Err(DbError::Create { path: PathBuf::from(&lock_path), source: e.into() }),
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_maps_round_trip_with_zero_runs() {
        let fps = [0x1234_5678_0000_0001u64, 0, 0, 0, 7 << 40, 0, 9 << 33];
        let blob = encode_blocks(&fps);
        assert_eq!(decode_blocks(&blob), fps.iter().map(|&f| short_fp(f)).collect::<Vec<_>>());
        // Seven blocks, two zero runs: 4 + 8 + 4 + 8 + 4 bytes.
        assert_eq!(blob.len(), 28);
        let holes = vec![0u64; 100_000];
        assert_eq!(encode_blocks(&holes).len(), 8);
        assert_eq!(decode_blocks(&encode_blocks(&holes)).len(), 100_000);
    }
}
