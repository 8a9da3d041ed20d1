//! The hashing pool: the rayon threads that open, check and hash the files
//! the crawl queues.
//!
//! In: the files to hash, in the order the crawl finds them, over a bounded
//! channel (the crawler runs ahead of the pool by that much, no more). Out:
//! each file's fingerprints, or why it was left out, handed to a sink as
//! soon as it is done (the pipeline forwards them to the database writer),
//! and the counts of the whole pass ([`HashOutcome`]).
//!
//! This is where the per-file policy is applied to what is hashed: each
//! file is opened below its starting path ([`Tree`]: no symlink, no `..`, no
//! mount crossed), must be the inode the crawl listed, and its `user.nodedup`
//! attribute and inode flags are read on that descriptor before any data is.

use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Mutex;

use anyhow::{Context, Result};
use rayon::prelude::*;

use super::budget::map_estimate;
use super::refused::Refused;
use super::{ExtentCache, FileHash, MapBytes};
use crate::display::display_path;
use crate::errors::ErrorKind;
use crate::file::{FileFacts, FileId, FileKey};
use crate::policy::{Policy, SkipReason};
use crate::progress::Progress;
use crate::sys::beneath::Tree;
use crate::sys::{self, FsKind};

/// How the pool hashes.
#[derive(Debug, Clone, Copy)]
pub struct PoolOptions {
    /// Hashing threads (most of them wait on the disk).
    pub threads: usize,
    /// Bytes per fingerprinted block.
    pub block_size: u64,
    /// Drop each chunk from the page cache once hashed (`--drop-cache`).
    pub drop_cache: bool,
    /// Filesystem of the files: only btrfs and XFS share extents, so only
    /// there is the extent cache used.
    pub fs: FsKind,
    /// Fingerprints of one owner's files never equal another owner's
    /// (see [`super::owner_salt`]); false with `--share-across-owners`.
    pub by_owner: bool,
    /// Ask every file hashed whether it keeps data checksums (btrfs,
    /// mounted `nodatasum` or `nodatacow`: new files keep none); otherwise
    /// only files hashed again (see [`super::checksum_salt`]).
    pub checksum_kinds: bool,
}

/// A file the pool is done with, for the database.
#[derive(Debug)]
pub enum Hashed {
    /// Hashed (the file's `dev` is its volume key).
    File {
        /// Its row, when it was known.
        id: Option<FileId>,
        /// The facts it was read under.
        file: FileFacts,
        /// Its fingerprints.
        hash: FileHash,
    },
    /// A known file now protected by the policy (a marker, a flag): what
    /// was known of it is to be forgotten.
    Protected {
        /// Its row.
        id: FileId,
    },
    /// Read and refused as too large, unchanged while it was read: the
    /// refusal is recorded so that later runs do not read it again
    /// ([`super::refused`]).
    TooLarge {
        /// The facts it was read under.
        file: FileFacts,
    },
}

/// The counts of one hashing pass.
#[derive(Debug, Default)]
pub struct HashOutcome {
    /// Files hashed.
    pub files: u64,
    /// Bytes read from disk to hash them.
    pub bytes_read: u64,
    /// Bytes whose fingerprints came from the extent cache, not a read.
    pub bytes_reused: u64,
    /// Files left out after all, by reason (found when the file was opened).
    pub skipped: HashMap<SkipReason, u64>,
    /// Files that could not be hashed, by error kind (each warned about).
    pub errors: HashMap<ErrorKind, u64>,
    /// (volume key, ino) of the files that could not be hashed this run.
    pub failed: HashSet<FileKey>,
    /// Files left in the queue when the run was stopped.
    pub not_reached: u64,
    /// Sizes of the files skipped or not reached: not considered after all.
    pub left_out_bytes: u64,
}

/// Files waiting for a hashing thread at most: the crawler runs ahead of
/// the hashers by this much, no more (bounded memory).
pub const HASH_QUEUE: usize = 4096;

/// Files handed to the pool at once (at most). One at a time, each file
/// cost a wake-up of the crawler thread, which waits on the full queue
/// while the hashing holds it back.
pub const HASH_BATCH: usize = 64;

/// Counters the hashing threads update together.
#[derive(Default)]
struct Counters {
    files: AtomicU64,
    bytes: AtomicU64,
    reused: AtomicU64,
    /// Everything else, rarer: behind a lock.
    tally: Mutex<HashOutcome>,
}

thread_local! {
    /// Each hashing thread's read buffer ([`super::CHUNK`] bytes once grown).
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Each hashing thread's `st_dev` → volume key cache.
    static VOL_KEYS: std::cell::RefCell<sys::SubvolIds> = std::cell::RefCell::new(sys::SubvolIds::new());
}

/// Why one file was not hashed.
enum HashFail {
    Skip(SkipReason),
    Error(ErrorKind, std::io::Error),
    /// Its block map is past the bound ([`ErrorKind::TooLarge`]), and it
    /// did not change while it was read (the facts it was read under):
    /// a verdict worth recording.
    TooLarge(FileFacts, std::io::Error),
}

/// Hash every file received on `to_hash` (in batches: a file and its row when known)
/// on a pool of `opts.threads` threads, handing each result to `sink`.
/// Files are taken one at a time as threads come free, in the order they
/// arrive. Once `stop` is set, the files still queued are counted as not
/// reached. A file `refused` as too large by an earlier run, unchanged
/// since, is refused again without being opened.
pub fn hash_all(
    opts: &PoolOptions,
    policy: &Policy,
    tree: &Tree,
    to_hash: Receiver<Vec<(FileFacts, Option<FileId>)>>,
    (sink, maps, refused): (&(dyn Fn(Hashed) + Sync), &MapBytes, &Refused),
    progress: &dyn Progress,
    stop: &AtomicBool,
) -> Result<HashOutcome> {
    let counters = Counters::default();
    // Fingerprints of shared physical extents, reused across files (only
    // btrfs and XFS share extents).
    let cache = (opts.fs != FsKind::Other).then(|| ExtentCache::new(opts.block_size));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .thread_name(|i| format!("hash-{i}"))
        .build()
        .context("cannot start hashing threads")?;
    pool.install(|| {
        // rayon may run an init per item, so the read buffer lives in a
        // thread-local (a 1 MiB buffer per file would cost more than
        // hashing small files).
        to_hash.into_iter().flatten().par_bridge().for_each(|(cand, id)| {
            if stop.load(Ordering::Relaxed) {
                let mut t = counters.tally.lock().unwrap();
                t.not_reached += 1;
                t.left_out_bytes += cand.size;
                return;
            }
            let hashed = match refused.earlier(&cand) {
                Some(r) => Err(refused_again(r.run)),
                None => READ_BUF.with_borrow_mut(|buf| {
                    hash_one(&cand, id.is_some(), tree, policy, opts, (cache.as_ref(), maps), buf)
                }),
            };
            progress.inc(cand.size);
            progress.inc_files(1);
            match hashed {
                Ok((now, h)) => {
                    counters.files.fetch_add(1, Ordering::Relaxed);
                    counters.bytes.fetch_add(h.bytes_read, Ordering::Relaxed);
                    counters.reused.fetch_add(h.bytes_reused, Ordering::Relaxed);
                    sink(Hashed::File { id, file: now, hash: h });
                }
                Err(HashFail::Error(kind, e))
                    if e.raw_os_error() == Some(libc::EIO) && tree.stop_if_stopped(stop, |w| progress.warn_run(w)) =>
                {
                    // The whole filesystem stopped (XFS shut down after an
                    // error answers `EIO` to every file): the files still
                    // queued are not reached, the work done is kept. Counted,
                    // not warned about: said once for the run.
                    let mut t = counters.tally.lock().unwrap();
                    *t.errors.entry(kind).or_default() += 1;
                    t.failed.insert(cand.key);
                }
                Err(fail) => left_out(&cand, id, fail, &counters.tally, sink, progress),
            }
        })
    });
    let mut out = counters.tally.into_inner().unwrap();
    out.files = counters.files.into_inner();
    out.bytes_read = counters.bytes.into_inner();
    out.bytes_reused = counters.reused.into_inner();
    Ok(out)
}

/// Count a file that was not hashed, and say why when it is news.
fn left_out(
    cand: &FileFacts,
    id: Option<FileId>,
    fail: HashFail,
    tally: &Mutex<HashOutcome>,
    sink: &(dyn Fn(Hashed) + Sync),
    progress: &dyn Progress,
) {
    let key = cand.key;
    match fail {
        HashFail::Skip(r) => {
            if let (Some(id), true) = (id, r.is_policy()) {
                // Now protected: forget what was known of it.
                sink(Hashed::Protected { id });
            }
            if r == SkipReason::Leased {
                progress.info(&format!(
                    "{}: not read: another process holds a lease on it (a file server's oplock or delegation); \
                     tried again next run",
                    display_path(&cand.path)
                ));
            }
            if r == SkipReason::ChangedDuringScan {
                progress.warn(&format!(
                    "{}: changed while it was read; it is hashed again next run",
                    display_path(&cand.path)
                ));
            }
            let mut t = tally.lock().unwrap();
            *t.skipped.entry(r).or_default() += 1;
            t.left_out_bytes += cand.size;
            t.failed.insert(key);
        }
        HashFail::TooLarge(now, e) => {
            progress.warn(&format!(
                "{}: {}: {e}; left out, and not read again while it is unchanged",
                display_path(&cand.path),
                ErrorKind::TooLarge
            ));
            sink(Hashed::TooLarge { file: now });
            let mut t = tally.lock().unwrap();
            *t.errors.entry(ErrorKind::TooLarge).or_default() += 1;
            t.failed.insert(key);
        }
        HashFail::Error(kind, e) => {
            // A read error is the disk's (a bad sector, a btrfs checksum
            // failure): the admin needs to know where to look.
            let disk = if e.raw_os_error() == Some(libc::EIO) {
                "; left out, tried again next run; the disk may be failing (see the kernel log)"
            } else {
                ""
            };
            progress.warn(&format!("{}: {kind}: {e}{disk}", display_path(&cand.path)));
            let mut t = tally.lock().unwrap();
            *t.errors.entry(kind).or_default() += 1;
            t.failed.insert(key);
        }
    }
}

/// Open, check and hash one file. Returns the facts it was hashed under.
///
/// The file is opened below its starting path (`tree`: no symlink, no `..`,
/// no mount crossed) and must be the inode the crawl listed; the nodedup
/// attribute and the inode flags are read from that descriptor.
fn hash_one(
    c: &FileFacts,
    known: bool,
    tree: &Tree,
    policy: &Policy,
    opts: &PoolOptions,
    (cache, maps): (Option<&ExtentCache>, &MapBytes),
    buf: &mut Vec<u8>,
) -> Result<(FileFacts, FileHash), HashFail> {
    let file = tree.open_file(&c.path).map_err(|e| match (SkipReason::of_reopen(&e), e.raw_os_error()) {
        // Gone, replaced on the way, or leased since the crawl listed it.
        (Some(r), _) => HashFail::Skip(r),
        (None, Some(libc::EACCES | libc::EPERM)) => HashFail::Error(ErrorKind::Unreadable, e),
        (None, _) => HashFail::Error(ErrorKind::Open, e),
    })?;
    // The facts recorded are taken in a clock tick past the file's last
    // change (see `settle`): a write after them moves its times.
    let before = super::settle::settled_metadata(&file).map_err(|e| HashFail::Error(ErrorKind::Stat, e))?;
    let key = VOL_KEYS.with_borrow_mut(|k| k.id_for(before.dev(), &file));
    if !before.is_file() || before.ino() != c.key.ino || key != c.key.volume {
        return Err(HashFail::Skip(SkipReason::Vanished));
    }
    policy.check_file_xattr_fd(file.as_fd()).map_err(HashFail::Skip)?;
    let flags = sys::inode_flags(file.as_fd(), opts.fs).map_err(|e| HashFail::Error(ErrorKind::Flags, e.into()))?;
    policy.check_flags(flags).map_err(HashFail::Skip)?;
    let now = FileFacts::from_metadata(c.path.clone(), key, &before);
    if now.size == 0 {
        return Err(HashFail::Skip(SkipReason::Empty));
    }
    // The opened file's owner, from the same fstat as its facts.
    let salt = if opts.by_owner { super::owner_salt(before.uid()) } else { 1 };
    // Asked (a tree search, ~5 µs, +7% on FULL's hashing if asked of every
    // file) of every file where new files keep no checksums, otherwise only
    // of files hashed again: a file without them made under an earlier
    // mount meets a refusal once, is marked stale, and is salted when read
    // again (`Executor::checksums_differ`). Unknown (no CAP_SYS_ADMIN):
    // taken to keep checksums, as most do. A NOCOW file keeps none (made
    // NOCOW while empty) or some (flagged after its data was written):
    // asked always.
    let ask = opts.fs == FsKind::Btrfs && (opts.checksum_kinds || known || flags.nocow);
    let nodatasum = ask && sys::btrfs_tree::nodatasum(file.as_fd()) == Ok(true);
    let salt = super::checksum_salt(salt, nodatasum);
    // Room for its map before it grows (see `MapBytes`): at most a block's
    // fingerprint for every block allocated (holes cost nothing).
    let data = now.size.min(before.blocks().saturating_mul(512));
    let reserved = maps.reserve(map_estimate(data, opts.block_size));
    let h = match super::hash_file_with(&file, now.size, opts.block_size, buf, opts.drop_cache, cache, salt) {
        Ok(h) => h,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(HashFail::Skip(SkipReason::ChangedDuringScan))
        }
        // Memory is bounded per file: a block map that cannot be held costs
        // this file (an error, exit code 1), never the run.
        Err(e) if e.kind() == std::io::ErrorKind::OutOfMemory => {
            return Err(HashFail::Error(ErrorKind::OutOfMemory, e))
        }
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
            // Recorded only if it did not change while it was read.
            let after = file.metadata().map_err(|e| HashFail::Error(ErrorKind::Stat, e))?;
            return Err(if FileFacts::from_metadata(c.path.clone(), key, &after) == now {
                HashFail::TooLarge(now, e)
            } else {
                HashFail::Error(ErrorKind::TooLarge, e)
            });
        }
        Err(e) => return Err(HashFail::Error(ErrorKind::Read, e)),
    };
    let after = file.metadata().map_err(|e| HashFail::Error(ErrorKind::Stat, e))?;
    if FileFacts::from_metadata(c.path.clone(), key, &after) != now {
        // What was read may not be what the shared blocks hold.
        if let Some(cache) = cache {
            cache.forget(&h.cached);
        }
        return Err(HashFail::Skip(SkipReason::ChangedDuringScan));
    }
    reserved.keep(h.map.as_bytes().len() as u64);
    Ok((now, h))
}

/// The refusal of a file an earlier run read and refused as too large
/// (run `run`), found unchanged: said like the first, without the read.
fn refused_again(run: i64) -> HashFail {
    let e = std::io::Error::new(
        std::io::ErrorKind::FileTooLarge,
        format!(
            "its block map was larger than this build handles when run {run} read it, and it has not changed \
             since: not read again (exclude it to silence this)"
        ),
    );
    HashFail::Error(ErrorKind::TooLarge, e)
}
