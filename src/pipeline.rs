//! The pipeline of one run, phase by phase:
//!
//! ```text
//! 1/3 scan: crawl ══► hash (rayon) ──► db writer   2/3 plan   3/3 share   ──► report
//!        (the crawler thread feeds the hashing pool as it finds files)
//! ```
//!
//! Each phase reports through [`Progress`] how much work remains; the
//! result is one [`Report`].

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, Result};
use rayon::prelude::*;

use crate::config::{Action, Config};
use crate::db::writer::{self, WriteOp, CHANNEL_CAP};
use crate::db::{Db, Known};
use crate::dedupe::{self, Mode};
use crate::hash;
use crate::plan::PlanOptions;
use crate::policy::{Policy, SkipReason};
use crate::progress::Progress;
use crate::report::{display_path, human, Report};
use crate::sys::beneath::Tree;
use crate::sys::{self, FsKind};
use crate::types::FileId;
use crate::walk::{self, Candidate};

/// Scan (and for [`Action::Run`], plan and share) as `cfg` says.
/// `stop` is set by SIGINT/SIGTERM: the run finishes its current batch,
/// commits and reports.
pub fn run(cfg: &Config, progress: &dyn Progress, stop: &AtomicBool) -> Result<Report> {
    // A database error says which database and what to do about it.
    run_inner(cfg, progress, stop).map_err(|e| crate::progress::explain_db_error(&cfg.db_path, e))
}

fn run_inner(cfg: &Config, progress: &dyn Progress, stop: &AtomicBool) -> Result<Report> {
    let t0 = Instant::now();
    let fs = cfg.fs.clone().expect("scan has a filesystem");
    let mut report = Report {
        report_version: crate::report::REPORT_VERSION,
        dedupscan_version: env!("CARGO_PKG_VERSION").to_owned(),
        command: if cfg.action == Action::Run { "run" } else { "scan" }.to_owned(),
        dry_run: cfg.dry_run,
        incremental: cfg.incremental,
        paths: cfg.paths.iter().map(|p| display_path(p)).collect(),
        filesystem: fs.kind.name().to_owned(),
        filesystem_uuid: fs.uuid.clone(),
        database: display_path(&cfg.db_path),
        block_size: cfg.block_size,
        ..Default::default()
    };
    // The globs were checked by Config; building the policy before the
    // database is opened keeps any error here from touching it.
    let mut policy = Policy::new(&cfg.excludes, Some(&cfg.db_path)).context("invalid --exclude glob")?;
    policy.include_readonly_snapshots = cfg.include_readonly_snapshots;
    // The starting paths, held open for the whole run: every directory and
    // file below them is opened relative to these (sys::beneath), never by
    // resolving a full path again.
    let tree = Tree::open(&cfg.paths).with_context(|| {
        format!("cannot open {}", cfg.paths.iter().map(|p| display_path(p)).collect::<Vec<_>>().join(", "))
    })?;
    let db = Db::open(&cfg.db_path, &fs.uuid)?;
    let run_id = db.begin_run(&report.command, cfg.dry_run)?;
    if db.meta("block_size")?.as_deref() != Some(&cfg.block_size.to_string()) {
        if db.meta("block_size")?.is_some() {
            progress.warn(&format!(
                "{}: block size differs from the database's: every file is hashed again",
                display_path(&cfg.db_path)
            ));
        }
        db.forget_all_hashes()?;
        db.set_meta("block_size", &cfg.block_size.to_string())?;
    }

    // 1+2. crawl and hash, overlapped: the crawler thread sorts every file
    // it finds into known-unchanged or to-hash, and the hashing pool starts
    // on the first one found, the way `find | xargs cat` keeps the disk busy.
    let index = db.load_index()?;
    let t = Instant::now();
    progress.phase("1/3 scan", None, true);
    let (tx, rx) = sync_channel::<WriteOp>(CHANNEL_CAP);
    let writer = std::thread::Builder::new()
        .name("db-writer".into())
        .spawn(move || writer::run(db, run_id, rx))
        .context("cannot start the database writer")?;
    let (hash_tx, hash_rx) = sync_channel::<(Candidate, Option<FileId>)>(HASH_QUEUE);
    let (walked, cls, stats) = std::thread::scope(|s| -> Result<_> {
        let (policy, index, writes, tree) = (&policy, &index, tx.clone(), &tree);
        let crawler = std::thread::Builder::new()
            .name("crawl".into())
            .spawn_scoped(s, move || {
                let t = Instant::now();
                let mut cls = Classifier::new(cfg, policy, index, tree);
                let walked = walk::walk(tree, fs.kind, policy, progress, stop, |c| {
                    if let Some(item) = cls.sort(c, &writes) {
                        let _ = hash_tx.send(item);
                    }
                });
                // The crawl is over: from here the scan has a total and an ETA.
                progress.set_total(cls.queued_bytes, Some(cls.queued_files));
                cls.walk_ms = ms(t);
                (walked, cls)
            })
            .context("cannot start the crawler")?;
        let stats = hash_all(cfg, policy, tree, hash_rx, tx.clone(), progress, stop);
        let (walked, cls) = crawler.join().map_err(|_| anyhow::anyhow!("crawler panicked"))?;
        Ok((walked, cls, stats?))
    })?;
    for (r, n) in &walked.skipped {
        report.skip(*r, *n);
    }
    for (k, n) in &walked.errors {
        report.error(k, *n);
    }
    report.timings.walk_ms = cls.walk_ms;
    report.interrupted = stop.load(Ordering::Relaxed);
    if !report.interrupted {
        for g in policy.unmatched_excludes() {
            progress.warn(&format!("--exclude '{g}' matched nothing under {}", report.paths.join(", ")));
        }
        // Known files under the scanned paths that were not seen are gone
        // (or no longer eligible). A stopped crawl did not see everything:
        // it prunes nothing.
        let removed = cls.removed();
        report.files_removed = removed.len() as u64;
        for id in removed {
            tx.send(WriteOp::Removed { id }).ok();
        }
    }
    drop(tx);
    report.files_scanned = cls.files;
    report.logical_bytes = cls.logical_bytes;
    report.files_unchanged = cls.unchanged;
    report.skip(SkipReason::Nodedup, cls.nodedup);
    for (r, n) in &walked.skipped_dirs {
        *report.skipped_dirs.entry(r.name().to_owned()).or_default() += *n;
    }
    report.files_renamed = cls.renamed;
    let (db, written) =
        writer.join().map_err(|_| anyhow::anyhow!("database writer panicked"))?.context("writing the database")?;
    let mut ids = cls.ids;
    ids.extend(written.new_ids.iter().copied());
    // The index of known files (a path per file) is done with: free it
    // before planning and sharing. An incremental plan keeps which run
    // hashed each file.
    let hashed_runs: Vec<(FileId, i64)> =
        if cfg.incremental { index.values().map(|k| (k.id, k.hashed_run)).collect() } else { Vec::new() };
    drop(index);
    report.files_hashed = stats.files.load(Ordering::Relaxed);
    report.bytes_hashed = stats.bytes.load(Ordering::Relaxed);
    report.bytes_reused = stats.reused.load(Ordering::Relaxed);
    let HashTally { skipped, errors, failed, not_reached, left_out_bytes } = stats.tally.into_inner().unwrap();
    report.logical_bytes -= left_out_bytes;
    for (r, n) in skipped {
        report.skip(r, n);
        report.files_scanned -= n;
    }
    for (k, n) in errors {
        report.error(k, n);
        report.files_failed += n;
    }
    // A stopped run considered only the files it got to.
    report.files_scanned -= not_reached;
    report.timings.hash_ms = ms(t);
    progress.finish_phase(&format!(
        "1/3 scan: {} files, {} hashed, {} read",
        report.files_scanned,
        report.files_hashed,
        human(report.bytes_hashed)
    ));

    if cfg.action == Action::Run && !report.interrupted {
        let scanned = Scanned { hashed_runs: &hashed_runs, ids: &ids, hashed: &written.hashed, failed: &failed };
        share(cfg, &db, run_id, &fs, &tree, &scanned, &mut report, progress, stop)?;
        let complete = !cfg.dry_run && !report.interrupted && report.sharing_refused.is_none();
        if complete {
            db.set_meta(LAST_SHARE_RUN, &run_id.to_string())?;
        }
    }
    report.timings.total_ms = ms(t0);
    db.finish_run(run_id, &serde_json::to_string(&report)?)?;
    Ok(report)
}

/// Meta key: id of the last real run that went through all of its plan.
/// Files hashed before it were matched and shared then.
const LAST_SHARE_RUN: &str = "last_complete_share_run";

/// Whether a known file can be trusted without reading it.
///
/// Size, mtime and ctime equal: unchanged. A rename changes the ctime too
/// (on XFS and btrfs), so a file found under a *new* path with its size and
/// mtime intact counts as moved, not rewritten. At the same path any ctime
/// change means a rehash: that is how a rewrite with its mtime set back is
/// caught. A wrong belief can only cost a missed match, never data: the
/// kernel compares every byte before sharing.
fn unchanged(k: &Known, c: &Candidate) -> bool {
    k.size == c.size && k.mtime == c.mtime && (k.ctime == c.ctime || k.path != c.path)
}

/// Whether `path` (a recorded name) still names the inode of `c`.
/// `st_dev` is the raw device number of `c` (its `dev` is the volume key).
fn same_inode(path: &Path, st_dev: u64, c: &Candidate) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.dev() == st_dev && m.ino() == c.ino)
}

/// Files waiting for a hashing thread at most: the crawler runs ahead of
/// the hashers by this much, no more (bounded memory).
const HASH_QUEUE: usize = 4096;

/// Change detection, one file at a time as the crawl finds it.
struct Classifier<'a> {
    cfg: &'a Config,
    policy: &'a Policy,
    index: &'a HashMap<(u64, u64), Known>,
    tree: &'a Tree,
    /// Known files seen by this crawl: `(volume key, ino)` → id. Paths live
    /// once, in the queue being hashed or in the database.
    ids: HashMap<(u64, u64), FileId>,
    /// `st_dev` → volume key (btrfs subvolume id): files are known by
    /// subvolume and inode, which survive a remount; `st_dev` does not.
    keys: sys::SubvolIds,
    files: u64,
    logical_bytes: u64,
    unchanged: u64,
    renamed: u64,
    /// Moved files found marked `user.nodedup`.
    nodedup: u64,
    /// Files and bytes handed to the hashers (the scan's total).
    queued_files: u64,
    queued_bytes: u64,
    walk_ms: u64,
}

impl<'a> Classifier<'a> {
    fn new(cfg: &'a Config, policy: &'a Policy, index: &'a HashMap<(u64, u64), Known>, tree: &'a Tree) -> Self {
        Classifier {
            cfg,
            policy,
            index,
            tree,
            ids: HashMap::new(),
            keys: sys::SubvolIds::new(),
            files: 0,
            logical_bytes: 0,
            unchanged: 0,
            renamed: 0,
            nodedup: 0,
            queued_files: 0,
            queued_bytes: 0,
            walk_ms: 0,
        }
    }

    /// Sort one crawled file: known and unchanged (a move is recorded
    /// through `writes`), or to be hashed (returned).
    fn sort(&mut self, mut c: Candidate, writes: &SyncSender<WriteOp>) -> Option<(Candidate, Option<FileId>)> {
        // From here on a candidate's `dev` is its volume key. The parent
        // directory is opened below the starting paths, like every open.
        let st_dev = c.dev;
        let parent = c.path.parent().unwrap_or(&c.path);
        c.dev = self.keys.id_for_dir(c.dev, || self.tree.open_dir(parent));
        let known = self.index.get(&(c.dev, c.ino));
        if let Some(k) = known {
            self.ids.insert((c.dev, c.ino), k.id);
            if k.path != c.path && same_inode(&k.path, st_dev, &c) {
                // A hard link: the crawl met the inode under another of its
                // names first (the parallel crawl's order varies). Nothing
                // moved; keep the recorded name.
                c.path = k.path.clone();
            }
        }
        match known {
            Some(k) if self.cfg.incremental && unchanged(k, &c) => {
                if k.path != c.path {
                    if let Err(r) = self.moved_xattr(&c, st_dev) {
                        // Moved and marked nodedup (or gone): forgotten
                        // (pruned as unseen).
                        self.ids.remove(&(c.dev, c.ino));
                        self.nodedup += u64::from(r == SkipReason::Nodedup);
                        return None;
                    }
                }
                self.files += 1;
                self.logical_bytes += c.size;
                if k.path != c.path {
                    self.renamed += 1;
                    let _ = writes.send(WriteOp::Renamed { id: k.id, dev: c.dev, path: c.path, ctime: c.ctime });
                } else {
                    self.unchanged += 1;
                }
                None
            }
            _ => {
                self.files += 1;
                self.logical_bytes += c.size;
                self.queued_files += 1;
                self.queued_bytes += c.size;
                Some((c, known.map(|k| k.id)))
            }
        }
    }

    /// The `user.nodedup` attribute of a moved file, read on the file the
    /// crawl listed (opened below the starting path, identity checked).
    /// `st_dev` is the device number the crawl saw (`c.dev` is the volume key).
    fn moved_xattr(&self, c: &Candidate, st_dev: u64) -> Result<(), SkipReason> {
        let f = self.tree.open_file(&c.path).map_err(|_| SkipReason::Vanished)?;
        match f.metadata() {
            Ok(m) if m.is_file() && (m.dev(), m.ino()) == (st_dev, c.ino) => {}
            _ => return Err(SkipReason::Vanished),
        }
        use std::os::fd::AsFd;
        self.policy.check_file_xattr_fd(f.as_fd())
    }

    /// Known files under the scanned paths that the crawl did not see.
    fn removed(&self) -> Vec<FileId> {
        let seen: HashSet<FileId> = self.ids.values().copied().collect();
        self.index
            .values()
            .filter(|k| !seen.contains(&k.id) && self.cfg.paths.iter().any(|root| k.path.starts_with(root)))
            .map(|k| k.id)
            .collect()
    }
}

#[derive(Default)]
struct HashTally {
    skipped: HashMap<SkipReason, u64>,
    errors: HashMap<&'static str, u64>,
    /// (volume key, ino) of files that could not be hashed this run.
    failed: HashSet<(u64, u64)>,
    /// Files left in the queue when the run was stopped.
    not_reached: u64,
    /// Sizes of the files skipped or not reached: not considered after all.
    left_out_bytes: u64,
}

#[derive(Default)]
struct HashStats {
    files: AtomicU64,
    bytes: AtomicU64,
    /// Bytes whose fingerprints came from the extent cache, not a read.
    reused: AtomicU64,
    tally: Mutex<HashTally>,
}

fn hash_all(
    cfg: &Config,
    policy: &Policy,
    tree: &Tree,
    to_hash: Receiver<(Candidate, Option<FileId>)>,
    tx: SyncSender<WriteOp>,
    progress: &dyn Progress,
    stop: &AtomicBool,
) -> Result<HashStats> {
    let stats = HashStats::default();
    let fs_kind = cfg.fs.as_ref().map_or(FsKind::Other, |f| f.kind);
    // Fingerprints of shared physical extents, reused across files (only
    // btrfs and XFS share extents).
    let cache = (fs_kind != FsKind::Other).then(|| hash::ExtentCache::new(cfg.block_size));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(cfg.threads)
        .thread_name(|i| format!("hash-{i}"))
        .build()
        .context("cannot start hashing threads")?;
    pool.install(|| {
        // Files are taken one at a time as threads come free. rayon may run
        // the init per item, so the read buffer lives in a thread-local (a
        // 1 MiB buffer per file would cost more than hashing small files).
        to_hash.into_iter().par_bridge().for_each_init(
            || tx.clone(),
            |tx, (cand, id)| {
                if stop.load(Ordering::Relaxed) {
                    let mut t = stats.tally.lock().unwrap();
                    t.not_reached += 1;
                    t.left_out_bytes += cand.size;
                    return;
                }
                let key = (cand.dev, cand.ino);
                let hashed =
                    READ_BUF.with_borrow_mut(|buf| hash_one(&cand, tree, policy, fs_kind, cfg, cache.as_ref(), buf));
                match hashed {
                    Ok((now, h)) => {
                        stats.files.fetch_add(1, Ordering::Relaxed);
                        stats.bytes.fetch_add(h.bytes_read, Ordering::Relaxed);
                        stats.reused.fetch_add(h.bytes_reused, Ordering::Relaxed);
                        progress.inc(cand.size);
                        progress.inc_files(1);
                        let op = WriteOp::Hashed {
                            id,
                            dev: now.dev,
                            ino: now.ino,
                            path: now.path,
                            mtime: now.mtime,
                            ctime: now.ctime,
                            hash: h,
                        };
                        let _ = tx.send(op);
                    }
                    Err(HashFail::Skip(r)) => {
                        progress.inc(cand.size);
                        progress.inc_files(1);
                        if let (Some(id), true) = (id, r.is_policy()) {
                            // Now protected: forget what was known of it.
                            let _ = tx.send(WriteOp::Removed { id });
                        }
                        if r == SkipReason::ChangedDuringScan {
                            progress.warn(&format!(
                                "{}: changed while it was read; it is hashed again next run",
                                display_path(&cand.path)
                            ));
                        }
                        let mut t = stats.tally.lock().unwrap();
                        *t.skipped.entry(r).or_default() += 1;
                        t.left_out_bytes += cand.size;
                        t.failed.insert(key);
                    }
                    Err(HashFail::Error(kind, e)) => {
                        progress.inc(cand.size);
                        progress.inc_files(1);
                        progress.warn(&format!("{}: {kind}: {e}", display_path(&cand.path)));
                        let mut t = stats.tally.lock().unwrap();
                        *t.errors.entry(kind).or_default() += 1;
                        t.failed.insert(key);
                    }
                }
            },
        )
    });
    drop(tx);
    Ok(stats)
}

thread_local! {
    /// Each hashing thread's read buffer ([`hash::CHUNK`] bytes once grown).
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Each hashing thread's `st_dev` → volume key cache.
    static VOL_KEYS: std::cell::RefCell<sys::SubvolIds> = std::cell::RefCell::new(sys::SubvolIds::new());
}

enum HashFail {
    Skip(SkipReason),
    Error(&'static str, std::io::Error),
}

/// Open, check and hash one file. Returns the facts it was hashed under.
///
/// The file is opened below its starting path (`tree`: no symlink, no `..`,
/// no mount crossed) and must be the inode the crawl listed; the nodedup
/// attribute and the inode flags are read from that descriptor.
fn hash_one(
    c: &Candidate,
    tree: &Tree,
    policy: &Policy,
    fs: FsKind,
    cfg: &Config,
    cache: Option<&hash::ExtentCache>,
    buf: &mut Vec<u8>,
) -> Result<(Candidate, hash::FileHash), HashFail> {
    let file = tree.open_file(&c.path).map_err(|e| match e.raw_os_error() {
        // Gone, or a directory on the way replaced by a symlink or a mount
        // since the crawl listed it: not the file that was listed.
        Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::EXDEV) => HashFail::Skip(SkipReason::Vanished),
        Some(libc::EACCES) | Some(libc::EPERM) => HashFail::Error("unreadable", e),
        _ => HashFail::Error("open", e),
    })?;
    let before = file.metadata().map_err(|e| HashFail::Error("stat", e))?;
    let key = VOL_KEYS.with_borrow_mut(|k| k.id_for(before.dev(), &file));
    if !before.is_file() || before.ino() != c.ino || key != c.dev {
        return Err(HashFail::Skip(SkipReason::Vanished));
    }
    use std::os::fd::AsFd;
    policy.check_file_xattr_fd(file.as_fd()).map_err(HashFail::Skip)?;
    let flags = sys::inode_flags(file.as_fd(), fs).map_err(|e| HashFail::Error("flags", e.into()))?;
    Policy::check_flags(flags).map_err(HashFail::Skip)?;
    let now = Candidate { dev: key, ..Candidate::from_metadata(c.path.clone(), &before) };
    if now.size == 0 {
        return Err(HashFail::Skip(SkipReason::Empty));
    }
    let h = match hash::hash_file_with(&file, now.size, cfg.block_size, buf, cfg.drop_cache, cache) {
        Ok(h) => h,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(HashFail::Skip(SkipReason::ChangedDuringScan))
        }
        // Memory is bounded per file: a block map that cannot be held costs
        // this file (an error, exit code 1), never the run.
        Err(e) if e.kind() == std::io::ErrorKind::OutOfMemory => return Err(HashFail::Error("out_of_memory", e)),
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => return Err(HashFail::Error("too_large", e)),
        Err(e) => return Err(HashFail::Error("read", e)),
    };
    let after = file.metadata().map_err(|e| HashFail::Error("stat", e))?;
    if (Candidate { dev: key, ..Candidate::from_metadata(c.path.clone(), &after) }) != now {
        // What was read may not be what the shared blocks hold.
        if let Some(cache) = cache {
            cache.forget(&h.cached);
        }
        return Err(HashFail::Skip(SkipReason::ChangedDuringScan));
    }
    Ok((now, h))
}

/// What the scan phase leaves for planning.
struct Scanned<'a> {
    /// Which run hashed each file known before this run (incremental runs).
    hashed_runs: &'a [(FileId, i64)],
    /// Files seen by this run: `(volume key, ino)` → id.
    ids: &'a HashMap<(u64, u64), FileId>,
    /// Files hashed by this run.
    hashed: &'a [FileId],
    /// Files that could not be hashed this run.
    failed: &'a HashSet<(u64, u64)>,
}

/// Phases 3 and 4: plan from the database, then share or verify.
#[allow(clippy::too_many_arguments)]
fn share(
    cfg: &Config,
    db: &Db,
    run_id: i64,
    fs: &sys::FsInfo,
    tree: &Tree,
    scanned: &Scanned,
    report: &mut Report,
    progress: &dyn Progress,
    stop: &AtomicBool,
) -> Result<()> {
    let t = Instant::now();
    progress.phase("2/3 plan", None, false);
    // Files of this run, as recorded (the facts they were hashed under).
    let allowed: HashSet<FileId> =
        scanned.ids.iter().filter(|(key, _)| !scanned.failed.contains(key)).map(|(_, id)| *id).collect();
    // Incremental: everything hashed before the last complete sharing run
    // was matched then; plan only the groups that hold a newer file.
    let last_share: Option<i64> = db.meta(LAST_SHARE_RUN)?.and_then(|v| v.parse().ok());
    // Destinations an earlier run left pending are planned again, even when
    // nothing changed: those that ran out of space every time (the space may
    // be back), those whose extents a file outside the plan kept only once
    // FIEMAP no longer flags those extents shared (the snapshot is gone);
    // replanning a still-pinned file's group every night would cost a
    // nightly run as much as the group.
    let pending = db.pending()?;
    pending_into(report, &pending);
    let pinned = dedupe::Pending::Pinned.name();
    let pinned_facts = db.file_facts(pending.iter().filter(|p| p.1 == pinned).map(|p| p.0))?;
    let retry = |p: &&(FileId, String, u64)| p.1 != pinned || !still_shared(tree, pinned_facts.get(&p.0));
    let fresh = match (cfg.incremental, last_share) {
        (true, Some(last)) => Some(
            (scanned.hashed_runs.iter().filter(|(_, run)| *run > last).map(|(id, _)| *id))
                .chain(scanned.hashed.iter().copied())
                .chain(pending.iter().filter(retry).map(|p| p.0))
                .filter(|id| allowed.contains(id))
                .collect::<HashSet<_>>(),
        ),
        _ => None,
    };
    if fresh.as_ref().is_some_and(|f| f.is_empty()) {
        progress.finish_phase("2/3 plan: nothing new since the last complete run");
        report.timings.plan_ms = ms(t);
        return Ok(());
    }
    let opts = PlanOptions {
        block_size: cfg.block_size,
        min_blocks: (cfg.min_range / cfg.block_size).max(1),
        ..Default::default()
    };
    let root = cfg.paths.first().expect("a path");
    // Free space before sharing, measured while planning: the two syncfs
    // calls wait on the disk (~0.2 s on FULL/btrfs) and the plan only reads
    // the database, so nothing we do changes the volume in between.
    let before = (!cfg.dry_run && fs.kind != FsKind::Other).then(|| {
        let root = root.clone();
        std::thread::spawn(move || free_bytes(&root))
    });
    let planned = db.plan(&allowed, fresh.as_ref(), opts)?;
    let (plan, whole_groups) = (planned.plan, planned.whole_groups.len());
    // The recorded facts of the files the plan names, for the executor's
    // identity checks.
    let files = db.file_facts(plan.ranges.iter().flat_map(|r| [r.src, r.dest]).collect::<HashSet<_>>())?;
    report.ranges_planned = plan.ranges.len() as u64;
    if cfg.list {
        let name = |id: &FileId| files.get(id).map(|c| display_path(&c.path)).unwrap_or_default();
        report.ranges = Some(
            plan.ranges
                .iter()
                .map(|r| crate::report::ListedRange {
                    source: name(&r.src),
                    source_offset: r.src_off,
                    destination: name(&r.dest),
                    destination_offset: r.dest_off,
                    bytes: r.len,
                    state: None,
                    unshared_bytes: None,
                })
                .collect(),
        );
    }
    report.timings.plan_ms = ms(t);
    progress.finish_phase(&format!(
        "2/3 plan: {} ranges, {} duplicate ({} whole-file groups)",
        plan.ranges.len(),
        human(plan.bytes()),
        whole_groups
    ));

    let t = Instant::now();
    let mode = if cfg.dry_run { Mode::DryRun } else { Mode::Share };
    if mode == Mode::Share && fs.kind == FsKind::Other {
        report.sharing_refused = Some(format!(
            "{} is not on btrfs or XFS (filesystem magic {:#x}): scanned and reported, nothing shared",
            report.paths.join(", "),
            fs.magic
        ));
        progress.warn(report.sharing_refused.as_deref().unwrap_or_default());
        return Ok(());
    }
    let before = before
        .map(|h| h.join().map_err(|_| anyhow::anyhow!("free space measurement panicked")).and_then(|r| r))
        .transpose()?;
    progress.phase(if cfg.dry_run { "3/3 verify" } else { "3/3 share" }, Some(plan.bytes()), true);
    let bookends = (fs.kind == FsKind::Btrfs && cfg.rewrite_ratio > 0.0).then(|| dedupe::Bookends {
        tmp_dir: if root.is_dir() { root.clone() } else { root.parent().unwrap_or(root).to_owned() },
        max_ratio: cfg.rewrite_ratio,
    });
    let out = dedupe::execute(&plan, &files, tree, cfg.block_size, mode, bookends.as_ref(), progress, stop);
    if let Some(before) = before {
        // Flushing the volume can take seconds after much sharing: say so
        // instead of leaving a full bar at "eta 0s".
        progress.finish_phase("");
        progress.phase("3/3 share: measuring freed space", None, false);
        report.freed_bytes = free_bytes(root)? as i64 - before as i64;
    }
    if mode == Mode::Share {
        // A stopped run may not have reached every destination: it only
        // adds to what is pending.
        let handled: HashSet<FileId> =
            if stop.load(Ordering::Relaxed) { HashSet::new() } else { plan.ranges.iter().map(|r| r.dest).collect() };
        let now: Vec<(FileId, &str, u64)> = out.pending.iter().map(|(id, (why, b))| (*id, why.name(), *b)).collect();
        db.save_pending(&handled, &now, run_id)?;
        pending_into(report, &db.pending()?);
    }
    report.duplicate_bytes = out.duplicate_bytes;
    report.deduped_bytes = out.deduped_bytes;
    report.already_shared_bytes = out.already_shared_bytes;
    report.rewritten_bytes = out.rewritten_bytes;
    report.sources_swapped = out.swapped_sources;
    // Found only now: these files were considered (and hashed or known
    // unchanged), they stay in files_scanned; they are left out of sharing.
    report.skip(SkipReason::ChangedDuringScan, out.changed_files);
    report.skip(SkipReason::Inline, out.inline_files);
    for (k, n) in &out.errors {
        report.error(k, *n);
    }
    for (k, n) in &out.status.errors {
        report.error(&format!("dedupe_{}", k.to_lowercase()), *n);
    }
    report.dedupe_status = out.status;
    if let Some(r) = out.refused {
        progress.warn(&r);
        report.sharing_refused = Some(r);
    }
    report.interrupted |= stop.load(Ordering::Relaxed);
    report.timings.dedupe_ms = ms(t);
    progress.finish_phase(&format!(
        "3/3 {}: {} {}",
        if cfg.dry_run { "verify" } else { "share" },
        human(if cfg.dry_run { report.duplicate_bytes } else { report.deduped_bytes }),
        if cfg.dry_run { "verified duplicate" } else { "shared" }
    ));
    Ok(())
}

/// Whether the recorded file `c` still has an extent FIEMAP flags shared
/// (metadata only). A file that cannot be opened or mapped is retried.
fn still_shared(tree: &Tree, c: Option<&Candidate>) -> bool {
    use std::os::fd::AsFd;
    let Some(c) = c else { return false };
    let Ok(f) = tree.open_file(&c.path) else { return false };
    sys::fiemap(f.as_fd(), 0, c.size.max(1)).is_ok_and(|ext| ext.iter().any(|e| e.is_shared()))
}

/// Put the pending work (database rows) into the report, by reason.
fn pending_into(report: &mut Report, rows: &[(FileId, String, u64)]) {
    report.pending.clear();
    report.pending_bytes = 0;
    for (_, why, bytes) in rows {
        let w = report.pending.entry(why.clone()).or_default();
        w.files += 1;
        w.bytes += bytes;
        report.pending_bytes += bytes;
    }
}

/// Free bytes on the filesystem of `path`, after flushing it so that
/// released extents are counted (btrfs frees them at transaction commit).
fn free_bytes(path: &Path) -> Result<u64> {
    let f = sys::inode::open_path_readonly(path).with_context(|| format!("{}: cannot open", display_path(path)))?;
    use std::os::fd::AsFd;
    // Two commits: btrfs may release extents freed by the first one's
    // delayed references only in the next transaction.
    for _ in 0..2 {
        sys::syncfs(&f).with_context(|| format!("{}: syncfs", display_path(path)))?;
    }
    Ok(sys::fs_info(f.as_fd())?.free_bytes)
}

fn ms(t: Instant) -> u64 {
    t.elapsed().as_millis() as u64
}
