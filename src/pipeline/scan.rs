//! Phase 1, the scan: the crawler thread, the hashing pool and the
//! database writer thread, overlapped. Change detection ([`crate::changes`])
//! sorts each file on the crawler thread as it is found.

use std::cell::RefCell;
use std::ffi::CString;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::time::Instant;

use anyhow::{Context, Result};

use super::{ms, Job};
use crate::batched::Batched;
use crate::changes::{ChangeCounts, Classifier, Probe, Sorted};
use crate::db::reader::Reader;
use crate::db::writer::{self, WriteOp, CHANNEL_CAP};
use crate::db::{kept_out, Db};
use crate::display::{display_path, human};
use crate::hash::pool::{self, HashOutcome, Hashed, PoolOptions, HASH_BATCH, HASH_QUEUE};
use crate::hash::refused::Refused;
use crate::hash::MapBytes;
use crate::policy::SkipReason;
use crate::progress::Progress;

use crate::file::{FileFacts, FileId, FileKey, IdSet};
use crate::sys::{self, stat};
use crate::walk::{self, WalkResult};

/// What the scan phase found: its counts, and what planning needs.
pub(super) struct ScanOutcome {
    /// What the crawl skipped and the errors it met.
    pub(super) walked: WalkResult,
    /// What change detection sorted.
    pub(super) changes: ChangeCounts,
    /// What the hashing pool did.
    pub(super) hashed: HashOutcome,
    /// Known files pruned because the crawl no longer found them.
    pub(super) removed: u64,
    /// The scan was stopped before it saw everything.
    pub(super) interrupted: bool,
    /// How long the crawl took.
    pub(super) walk_ms: u64,
    /// How long the whole phase took (the report's `hash_ms`).
    pub(super) scan_ms: u64,
    /// Files of this run that the plan may use: the known files the crawl
    /// saw and the files it hashed, minus those that failed to hash. A
    /// bitset by row id: memory flat in the number of files.
    pub(super) seen: IdSet,
    /// Files hashed by this run that shared no extent with anything as
    /// they were hashed ([`crate::db::writer::Written::unshared`]).
    pub(super) unshared: IdSet,
}

impl ScanOutcome {
    /// Files considered: found, minus those left out when opened, minus
    /// those a stopped run did not get to.
    pub(super) fn files_scanned(&self) -> u64 {
        self.changes.files - self.hashed.skipped.values().sum::<u64>() - self.hashed.not_reached
    }
}

/// Phase 1: crawl and hash, overlapped. The crawler thread sorts every
/// file it finds into known-unchanged, moved or to-hash, and the hashing
/// pool starts on the first one found, the way `find | xargs cat` keeps the
/// disk busy. Everything goes to the database writer thread, which hands
/// the database back at the end.
pub(super) fn scan_phase(
    job: &Job,
    db: Db,
    run_id: i64,
    progress: &dyn Progress,
    stop: &AtomicBool,
) -> Result<(Db, ScanOutcome)> {
    // Change detection asks the database file by file, on a connection of
    // its own: no index of known files in memory.
    let index = Reader::open(&db.path, run_id)?;
    // Files refused as too large before, read again only once changed.
    let refused = Refused::new(db.too_large()?, job.scan.incremental);
    let t = Instant::now();
    progress.phase("1/3 scan", None, true);
    let (tx, rx) = sync_channel::<WriteOp>(CHANNEL_CAP);
    let map_bytes = std::sync::Arc::new(MapBytes::default());
    let given = map_bytes.clone();
    let writer = std::thread::Builder::new()
        .name("db-writer".into())
        .spawn(move || writer::run(db, run_id, rx, &given))
        .context("cannot start the database writer")?;
    let (mut crawled, hashed) = crawl_and_hash(job, index, (&tx, &map_bytes, &refused), progress, stop)?;
    let interrupted = stop.load(Ordering::Relaxed);
    let mut removed = 0;
    if !interrupted {
        for g in job.policy.unmatched_excludes() {
            progress.warn_run(&format!("--exclude '{g}' matched nothing under {}", job.paths().join(", ")));
        }
        // Known files under the scanned paths that were not seen are gone
        // (or no longer eligible). A stopped crawl did not see everything:
        // it prunes nothing.
        let pruned = crawled.classifier.removed(&job.scan.paths, &mut |id| {
            removed += 1;
            tx.send(WriteOp::Removed { id }).ok();
        });
        pruned.map_err(|e| anyhow::anyhow!("reading the database: {e}"))?;
    }
    drop(tx);
    let (mut walked, walk_ms) = (crawled.walked, crawled.walk_ms);
    let (mut seen, changes) = crawled.classifier.finish().map_err(|e| anyhow::anyhow!("reading the database: {e}"))?;
    let (db, written) =
        writer.join().map_err(|_| anyhow::anyhow!("database writer panicked"))?.context("writing the database")?;
    // The plan may use what the crawl saw and what this run hashed, not
    // the files that failed to hash.
    db.add_run_files(run_id, &mut seen)?;
    if !interrupted {
        db.drop_too_large(&refused.stale(&job.scan.paths))?;
    }
    for key in &hashed.failed {
        if let Some(id) = db.id_of(*key)? {
            seen.remove(id);
        }
    }
    keep_links_outside(&db, run_id, &crawled.links_outside, (&mut seen, &mut walked), progress)?;
    let unshared = written.unshared;
    let out = ScanOutcome { walked, changes, hashed, removed, interrupted, walk_ms, scan_ms: ms(t), seen, unshared };
    progress.finish_phase(&format!(
        "1/3 scan: {} files, {} hashed, {} read",
        out.files_scanned(),
        out.hashed.files,
        human(out.hashed.bytes_read)
    ));
    Ok((db, out))
}

/// What the crawler thread leaves.
struct Crawled {
    pub(super) walked: WalkResult,
    classifier: Classifier<Reader>,
    pub(super) walk_ms: u64,
    /// [`WalkResult::links_outside`], known by volume key.
    links_outside: walk::Outside,
}

/// Keep the multiply-linked files the crawl could not vouch for
/// ([`WalkResult::links_outside`]) out of the plan: out of `seen`, on every
/// run, hashed or known unchanged (the file itself may be fine; it is
/// another of its names that is protected or outside the run, and that may
/// change without the file changing). Counted `hardlink_outside` (they stay
/// in `files_scanned`, like a file found changed at share time), named
/// with `-v`, and recorded for `report` ([`Db::save_kept_out`]).
fn keep_links_outside(
    db: &Db,
    run_id: i64,
    keys: &walk::Outside,
    (seen, walked): (&mut IdSet, &mut WalkResult),
    progress: &dyn Progress,
) -> Result<()> {
    let mut kept = db.kept_out_writer(run_id, |id| seen.contains(id))?;
    let mut keys = keys.iter().map(|(volume, ino)| FileKey { volume, ino }).peekable();
    let mut count = 0;
    // A chunk at a time: where the crawl met one name of each file (one
    // snapshot of an rsnapshot tree), every file is kept out.
    while keys.peek().is_some() {
        let mut ids = Vec::new();
        for key in keys.by_ref().take(kept_out::CHUNK) {
            // Not recorded (failed, or found protected when opened):
            // nothing to keep out.
            match db.id_of(key)? {
                Some(id) if seen.contains(id) => ids.push(id),
                _ => {}
            }
        }
        kept.add(&ids)?;
        for id in &ids {
            seen.remove(*id);
        }
        count += ids.len() as u64;
        let mut names: Vec<_> = db.file_facts(ids)?.into_values().map(|f| f.path).collect();
        names.sort();
        for path in names {
            progress.info(&format!(
                "{}: not shared: another of its hard links is outside the paths scanned, or left out",
                display_path(&path)
            ));
        }
    }
    kept.finish()?;
    if count > 0 {
        *walked.skipped.entry(SkipReason::HardlinkOutside).or_default() += count;
    }
    Ok(())
}

/// Run the crawl (on its own thread, sorting files as found) and the
/// hashing pool (on this one) together.
fn crawl_and_hash(
    job: &Job,
    index: Reader,
    (writes, map_bytes, refused): (&SyncSender<WriteOp>, &MapBytes, &Refused),
    progress: &dyn Progress,
    stop: &AtomicBool,
) -> Result<(Crawled, HashOutcome)> {
    let (hash_tx, hash_rx) = sync_channel::<Vec<(FileFacts, Option<FileId>)>>(HASH_QUEUE / HASH_BATCH);
    let opts = PoolOptions {
        threads: job.scan.threads,
        block_size: job.scan.block_size,
        drop_cache: job.scan.drop_cache,
        fs: job.scan.fs.kind,
        by_owner: !job.scan.share_across_owners,
        checksum_kinds: job.scan.paths.iter().any(|p| crate::sys::mounts::checksums_off(p)),
    };
    let sink = |h: Hashed| {
        let op = match h {
            Hashed::File { id, file, hash } => WriteOp::Hashed {
                id,
                dev: file.key.volume,
                ino: file.key.ino,
                path: file.path,
                mtime: file.mtime,
                ctime: file.ctime,
                hash,
            },
            Hashed::Protected { id } => WriteOp::Removed { id },
            Hashed::TooLarge { file } => {
                refused.confirm(file.key);
                WriteOp::TooLarge { file }
            }
        };
        // Its map's bytes were reserved before it was hashed (see
        // `MapBytes`); the writer gives them back.
        let _ = writes.send(op);
    };
    std::thread::scope(|s| -> Result<_> {
        let writes = writes.clone();
        let crawler = std::thread::Builder::new()
            .name("crawl".into())
            .spawn_scoped(s, move || crawl(job, index, &writes, hash_tx, progress, stop))
            .context("cannot start the crawler")?;
        let hashed =
            pool::hash_all(&opts, &job.policy, &job.tree, hash_rx, (&sink, map_bytes, refused), progress, stop);
        let crawled = crawler.join().map_err(|_| anyhow::anyhow!("crawler panicked"))?;
        Ok((crawled, hashed?))
    })
}

/// The crawl: every file found is sorted by change detection; a move goes
/// to the database writer, a file to read to the hashing pool, in batches
/// of up to [`HASH_BATCH`] (sent early whenever the crawl has nothing more
/// for the moment, so hashing starts with the first file found).
fn crawl(
    job: &Job,
    index: Reader,
    writes: &SyncSender<WriteOp>,
    to_hash: SyncSender<Vec<(FileFacts, Option<FileId>)>>,
    progress: &dyn Progress,
    stop: &AtomicBool,
) -> Crawled {
    let t = Instant::now();
    // Shared by the two closures below: the walk calls one at a time.
    let classifier = RefCell::new(Classifier::new(index, job.scan.incremental));
    // `st_dev` → volume key (btrfs subvolume id): files are known by
    // subvolume and inode, which survive a remount; `st_dev` does not.
    let mut keys = sys::SubvolIds::new();
    // Files to hash; the walk sends what is queued whenever it waits.
    let queued = RefCell::new(Batched::new(to_hash, HASH_BATCH));
    let hand_over = || {
        // The walk waits for its threads: the database's read snapshot is
        // not held meanwhile (see `Index::release`).
        classifier.borrow().release();
        queued.borrow_mut().flush();
    };
    let each = |mut c: FileFacts| {
        // From here on a candidate's `dev` is its volume key. The parent
        // directory is opened below the starting paths, like every open.
        let st_dev = c.key.volume;
        let parent = c.path.parent().unwrap_or(&c.path);
        c.key.volume = keys.id_for_dir(c.key.volume, || job.tree.open_dir(parent));
        let probe = FsProbe { job, st_dev };
        let sorted = classifier.borrow_mut().sort(c, &probe);
        if !matches!(sorted, Sorted::Unchanged | Sorted::Left(_)) {
            classifier.borrow().release(); // the sends below may wait
        }
        match sorted {
            Sorted::Moved { id, file } => {
                let _ = writes.send(WriteOp::Renamed { id, dev: file.key.volume, path: file.path, ctime: file.ctime });
            }
            Sorted::ToHash { file, id } => {
                queued.borrow_mut().send((file, id));
            }
            Sorted::Unchanged | Sorted::Left(_) => {}
        }
    };
    let mut walked = walk::walk(&job.tree, job.scan.fs.kind, &job.policy, progress, stop, each, hand_over);
    drop(queued); // hands over the last batch
                  // The crawl is over: from here the scan has a total and an ETA.
    let classifier = classifier.into_inner();
    let n = classifier.counts();
    progress.set_total(n.queued_bytes, Some(n.queued_files));
    // Each of these files was handed on, so its st_dev was asked for a key.
    let links_outside = std::mem::take(&mut walked.links_outside).map_devices(|dev| keys.given(dev));
    Crawled { walked, classifier, walk_ms: ms(t), links_outside }
}

/// Change detection's questions, answered on the volume: opens go below
/// the starting paths. `st_dev` is the device number the crawl saw (the
/// candidate's `dev` is its volume key).
struct FsProbe<'a, 'j> {
    job: &'a Job<'j>,
    st_dev: u64,
}

impl Probe for FsProbe<'_, '_> {
    /// Looked up below the starting paths like every open: the recorded
    /// name's directory is opened beneath them and the name `fstatat`ed
    /// there, so a symlink planted on the way is not followed.
    fn same_inode(&self, recorded: &Path, c: &FileFacts) -> bool {
        let (Some(parent), Some(name)) = (recorded.parent(), recorded.file_name()) else { return false };
        let (Ok(dir), Ok(name)) = (self.job.tree.open_dir(parent), CString::new(name.as_bytes())) else {
            return false;
        };
        stat::stat_at(dir.as_fd(), &name).is_ok_and(|st| st.st_dev == self.st_dev && st.st_ino == c.key.ino)
    }

    /// The `user.nodedup` attribute of a moved file, read on the file the
    /// crawl listed (opened below the starting path, identity checked).
    fn may_move(&self, c: &FileFacts) -> Result<(), SkipReason> {
        let f = self.job.tree.open_file(&c.path).map_err(|_| SkipReason::Vanished)?;
        match f.metadata() {
            Ok(m) if m.is_file() && (m.dev(), m.ino()) == (self.st_dev, c.key.ino) => {}
            _ => return Err(SkipReason::Vanished),
        }
        self.job.policy.check_file_xattr_fd(f.as_fd())
    }
}
