//! Executing a plan: share ranges with `FIDEDUPERANGE`, or, in a dry run,
//! compare them byte for byte in user space so the preview is exact.
//!
//! In: a [`Plan`] and the scanned facts of every file it names. Out: an
//! [`Outcome`] with verified, submitted and confirmed bytes and every
//! per-destination status.
//!
//! The bookend pass (btrfs) runs first, on the calling thread. The plan's
//! ranges then run on a few worker threads: a `FIDEDUPERANGE` call is mostly
//! kernel CPU (comparing the pages, updating extent and reference-count
//! trees) plus waits on metadata reads and the journal, one call at a time,
//! so one thread leaves the other CPUs idle. Workers take *units* (the ranges
//! of one source, cut at 64 MiB) largest first; the planner resolved every
//! block to its root, so the order does not matter. Concurrent calls on the
//! same inode are safe: the kernel locks both inodes of a call. Every file a
//! worker finds changed, unopenable or inline is recorded for all workers and
//! counted once.
//!
//! The kernel compares the bytes page by page and reads a missing page
//! synchronously, so before each request both sides are prefetched
//! (`POSIX_FADV_WILLNEED`): on data no longer cached the disk then reads
//! large requests ahead of the compare instead of one page at a time.
//!
//! Every file is opened below the run's starting paths ([`Tree`]: no
//! symlink in any component, no `..`, no mount crossed), so a directory
//! swapped since the scan cannot send an open elsewhere. Before a file is
//! used its identity (device, inode, size, mtime, ctime) is checked on that
//! descriptor against the scan; a file that changed since is left for the
//! next run.
//!
//! A destination the kernel refuses (`EOPNOTSUPP`, `EXDEV`, `EINVAL`) is
//! counted against that destination; sharing stops for the whole run only
//! when the filesystem itself cannot share, which a probe decides once, at
//! the first such refusal: two equal blocks of an unnamed temporary file on
//! the scanned filesystem, shared with each other. Blocks whose source and destination already map to the same
//! physical extent (FIEMAP) are not submitted again, so a second run on an
//! unchanged volume submits nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use nix::errno::Errno;
use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

use crate::bookend::{self, DestExtent};
use crate::plan::{Plan, Range};
use crate::progress::Progress;
use crate::report::{display_path, DedupeStatuses};
use crate::sys::beneath::Tree;
use crate::sys::fiemap::{flags as fiemap_flags, physical_map};
use crate::sys::{self, dedupe::MAX_DESTS, dedupe::MAX_REQUEST_LEN, DedupeStatus, DestResult};
use crate::types::FileId;
use crate::walk::Candidate;

/// Whether to share for real.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Compare in user space, share nothing.
    DryRun,
    /// Submit to the kernel.
    Share,
}

/// What executing a plan did.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    /// Bytes verified equal (dry run) or submitted to the kernel.
    pub duplicate_bytes: u64,
    /// Bytes the kernel confirmed shared.
    pub deduped_bytes: u64,
    /// Bytes skipped because they already share the source's extents.
    pub already_shared_bytes: u64,
    pub status: DedupeStatuses,
    /// Files that changed since the scan and were left alone.
    pub changed_files: u64,
    /// Files whose data is inline in metadata (btrfs): nothing to share.
    pub inline_files: u64,
    /// Whole-file groups shared from a copy far less fragmented than the
    /// planned source.
    pub swapped_sources: u64,
    /// Bytes of partly covered extents copied into fresh extents so the old
    /// ones can be freed (btrfs); in a dry run, what would be.
    pub rewritten_bytes: u64,
    /// Files that could not be opened or mapped.
    pub errors: BTreeMap<String, u64>,
    /// Set when sharing was stopped because the filesystem refuses it.
    pub refused: Option<String>,
    /// Destinations left for a later run because the filesystem was out of
    /// space (ENOSPC, EDQUOT), with why and the bytes planned into them:
    /// the run records them in the database and the next run, incremental
    /// or not, plans them again.
    pub pending: BTreeMap<FileId, (Pending, u64)>,
}

/// Why a destination was left for a later run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pending {
    /// No room to rewrite the remainders of its partly covered extents
    /// (btrfs bookends). Its ranges are then not shared either: with the
    /// remainder still in the old extent, sharing the rest frees nothing,
    /// and afterwards nothing would show that the extent is pinned.
    NoSpaceRewrite,
    /// The kernel answered ENOSPC or EDQUOT to sharing into it.
    NoSpaceShare,
    /// Its extents there are also referenced by files outside the plan
    /// (a read-only snapshot, an excluded file): sharing could free
    /// nothing and would only add metadata. Planned again by every run, so
    /// it is shared once the snapshot is gone.
    Pinned,
}

impl Pending {
    /// Name in the database and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Pending::NoSpaceRewrite => "no_space_rewrite",
            Pending::NoSpaceShare => "no_space_share",
            Pending::Pinned => "referenced_outside_run",
        }
    }
}

/// Out of space or quota: worth retrying once there is room.
fn no_space(e: Errno) -> bool {
    matches!(e, Errno::ENOSPC | Errno::EDQUOT)
}

/// A range's block addresses (see [`physical_map`]), and whether any of its
/// extents is shared with another file or offset.
struct Mapped {
    blocks: Vec<Option<u64>>,
    shared: bool,
    extents: Vec<sys::Extent>,
}

/// One destination of a source range, maybe split into the sub-ranges that
/// are not shared yet (offsets relative to the range start).
struct Dest {
    id: FileId,
    file: File,
    off: u64,
    parts: Vec<(u64, u64)>,
    /// FIEMAP extents in the range (fragmentation).
    extents: usize,
}

/// One destination of one request: borrows the open file of a [`Dest`].
struct Target<'f> {
    id: FileId,
    file: &'f File,
    off: u64,
}

impl Dest {
    fn target(&self, rel: u64) -> Target<'_> {
        Target { id: self.id, file: &self.file, off: self.off + rel }
    }
}

/// Rewriting remainders of partly covered extents (btrfs; see [`crate::bookend`]).
#[derive(Debug, Clone)]
pub struct Bookends {
    /// A directory on the same filesystem for the unnamed temporary files.
    pub tmp_dir: PathBuf,
    /// Rewrite a remainder only when it is at most this many times the
    /// covered part of its extent.
    pub max_ratio: f64,
}

/// Most worker threads of the share phase. On cached data the phase is
/// kernel CPU (on XFS four fifths of it inside `FIDEDUPERANGE`), so workers
/// beyond the CPUs only contend for the filesystem's locks: on 2 vCPUs and
/// the 4.3 GiB benchmark corpus, 2 workers took 3.6–4.2 s where 1 took
/// 5.5 s, and 4 workers 4.4–4.9 s. Not measured on more CPUs; the cap keeps
/// the journal and allocation-group locks (and open files) in check there.
pub const MAX_WORKERS: usize = 4;

/// Largest file whose data btrfs may keep inline in its metadata (an
/// inline extent never exceeds the sector size; `max_inline` defaults to
/// 2048 bytes).
const INLINE_MAX: u64 = 4096;

/// Ranges of one source are cut into units of about this many bytes, so that
/// one large file (a VM image) does not end the phase on one thread.
const UNIT_BYTES: u64 = 64 << 20;

/// Worker threads for this machine: one per CPU, at least 2 (even on cached
/// data a fifth of a single thread's time is spent waiting, on metadata
/// reads and the journal), at most [`MAX_WORKERS`].
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, MAX_WORKERS)
}

/// Execute `plan`. `stop` is polled between source ranges. With
/// `bookends`, partly covered destination extents are freed first.
#[allow(clippy::too_many_arguments)]
pub fn execute(
    plan: &Plan,
    files: &HashMap<FileId, Candidate>,
    tree: &Tree,
    block_size: u64,
    mode: Mode,
    bookends: Option<&Bookends>,
    progress: &dyn Progress,
    stop: &AtomicBool,
) -> Outcome {
    execute_with_workers(plan, files, tree, block_size, mode, bookends, progress, stop, default_workers())
}

/// [`execute`] on `workers` threads (1: all on the calling thread). The
/// outcome does not depend on `workers`: every file is checked, counted and
/// warned about once, whichever worker meets it first.
#[allow(clippy::too_many_arguments)]
pub fn execute_with_workers(
    plan: &Plan,
    files: &HashMap<FileId, Candidate>,
    tree: &Tree,
    block_size: u64,
    mode: Mode,
    bookends: Option<&Bookends>,
    progress: &dyn Progress,
    stop: &AtomicBool,
    workers: usize,
) -> Outcome {
    let shared = Shared {
        files,
        tree,
        can_share: std::sync::OnceLock::new(),
        block_size,
        mode,
        progress,
        stop,
        bad: Mutex::new(HashSet::new()),
        inline: Mutex::new(HashSet::new()),
        refused: AtomicBool::new(false),
        deferred: Mutex::new(HashSet::new()),
        in_plan: files.values().map(|c| (c.dev, c.ino)).collect(),
        used_once: used_once(plan),
        solo: Mutex::new(BTreeMap::new()),
    };
    let mut out = Outcome::default();
    if let Some(b) = bookends {
        // Before any range is shared: a rewritten remainder may be the
        // source of other ranges, which must then share its new extent.
        // Destinations are independent of each other, so this pass runs on
        // the workers too.
        out.merge(on_workers(&shared, workers, &dest_coverage(plan), |ex, (id, covered)| {
            ex.free_bookends(*id, covered, b)
        }));
    }
    out.merge(on_workers(&shared, workers, &units(&plan.ranges), |ex, &(start, end)| {
        ex.run_unit(&plan.ranges[start..end])
    }));
    out
}

/// Do `work` on every item, on up to `workers` executors, each on its own
/// thread (one: on the calling thread) taking the next item from a shared
/// counter until none is left or all must stop; merge what they did.
fn on_workers<T: Sync>(
    shared: &Shared<'_>,
    workers: usize,
    items: &[T],
    work: impl Fn(&mut Executor<'_>, &T) + Sync,
) -> Outcome {
    let next = AtomicUsize::new(0);
    let run = || {
        let mut ex = Executor::new(shared);
        while !ex.halted() {
            let Some(item) = items.get(next.fetch_add(1, Ordering::Relaxed)) else { break };
            work(&mut ex, item);
        }
        ex.out
    };
    let workers = workers.clamp(1, items.len().max(1));
    if workers == 1 {
        return run();
    }
    let mut out = Outcome::default();
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for k in 0..workers {
            match std::thread::Builder::new().name(format!("share-{k}")).spawn_scoped(s, run) {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // Out of threads: carry on with those that started.
                    shared.progress.info(&format!("cannot start share worker {k}: {e}"));
                    break;
                }
            }
        }
        if handles.is_empty() {
            out.merge(run());
        }
        for h in handles {
            match h.join() {
                Ok(o) => out.merge(o),
                // A bug, not an I/O error: fail as loudly as on one thread.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    });
    out
}

/// Files named by exactly one source range (all its destinations) or one
/// destination range of `plan`.
fn used_once(plan: &Plan) -> HashSet<FileId> {
    let mut uses: HashMap<FileId, (HashSet<(u64, u64)>, u32)> = HashMap::new();
    for r in &plan.ranges {
        uses.entry(r.src).or_default().0.insert((r.src_off, r.len));
        uses.entry(r.dest).or_default().1 += 1;
    }
    uses.into_iter().filter(|(_, (s, d))| s.len() + *d as usize == 1).map(|(id, _)| id).collect()
}

/// Each destination of `plan` with the union of its planned ranges, in id
/// order.
fn dest_coverage(plan: &Plan) -> Vec<(FileId, Vec<(u64, u64)>)> {
    let mut by_dest: BTreeMap<FileId, Vec<(u64, u64)>> = BTreeMap::new();
    for r in &plan.ranges {
        by_dest.entry(r.dest).or_default().push((r.dest_off, r.len));
    }
    by_dest.into_iter().map(|(id, ranges)| (id, bookend::union(ranges))).collect()
}

/// The plan's ranges cut into units of work, as `(start, end)` indices,
/// largest first. A unit holds whole groups (one source range and all its
/// destinations, so they can go into one request) of one source (opened
/// once per unit), up to about [`UNIT_BYTES`].
fn units(ranges: &[Range]) -> Vec<(usize, usize)> {
    let mut units: Vec<(usize, usize, u64)> = Vec::new();
    let mut i = 0;
    while i < ranges.len() {
        let first = ranges[i];
        let mut j = i + 1;
        while j < ranges.len() && same_source(&ranges[j], &first) {
            j += 1;
        }
        let bytes: u64 = ranges[i..j].iter().map(|r| r.len).sum();
        match units.last_mut() {
            Some((_, end, b)) if ranges[*end - 1].src == first.src && *b < UNIT_BYTES => {
                *end = j;
                *b += bytes;
            }
            _ => units.push((i, j, bytes)),
        }
        i = j;
    }
    // Largest first, so that the last unit to finish is a small one; a
    // stable sort keeps the plan's order among equals.
    units.sort_by_key(|&(_, _, b)| std::cmp::Reverse(b));
    units.into_iter().map(|(s, e, _)| (s, e)).collect()
}

impl Outcome {
    /// Add what another worker did.
    fn merge(&mut self, o: Outcome) {
        self.duplicate_bytes += o.duplicate_bytes;
        self.deduped_bytes += o.deduped_bytes;
        self.already_shared_bytes += o.already_shared_bytes;
        self.status.same += o.status.same;
        self.status.differs += o.status.differs;
        for (k, n) in o.status.errors {
            *self.status.errors.entry(k).or_default() += n;
        }
        self.changed_files += o.changed_files;
        self.inline_files += o.inline_files;
        self.swapped_sources += o.swapped_sources;
        self.rewritten_bytes += o.rewritten_bytes;
        for (k, n) in o.errors {
            *self.errors.entry(k).or_default() += n;
        }
        if self.refused.is_none() {
            self.refused = o.refused;
        }
        for (id, (why, bytes)) in o.pending {
            let e = self.pending.entry(id).or_insert((why, 0));
            e.0 = e.0.min(why);
            e.1 += bytes;
        }
    }
}

/// What all workers share: the inputs, and the per-file verdicts that must
/// be reached (and counted, and warned about) once.
struct Shared<'a> {
    files: &'a HashMap<FileId, Candidate>,
    /// The starting paths: every file is opened below them.
    tree: &'a Tree,
    /// Whether the filesystem can share at all, probed at the first refusal.
    can_share: std::sync::OnceLock<bool>,
    block_size: u64,
    mode: Mode,
    progress: &'a dyn Progress,
    stop: &'a AtomicBool,
    /// Files that changed since the scan or could not be opened: never used
    /// again.
    bad: Mutex<HashSet<FileId>>,
    /// Files whose data is inline in metadata.
    inline: Mutex<HashSet<FileId>>,
    /// The filesystem refuses to share: every worker stops.
    refused: AtomicBool,
    /// Destinations whose bookends could not be rewritten for lack of
    /// space: left whole for a later run (see [`Pending::NoSpaceRewrite`]).
    deferred: Mutex<HashSet<FileId>>,
    /// `(volume key, inode)` of every file in the plan: an extent
    /// referenced by anything else cannot be freed by this run.
    in_plan: HashSet<(u64, u64)>,
    /// Files in exactly one range of the plan (as source or destination):
    /// a whole-file group's source and copy may swap roles safely.
    used_once: HashSet<FileId>,
    /// Disk space (FIEMAP addresses, start → end, overlapping pieces
    /// merged) of extents some FIEMAP of this phase reported not shared: see
    /// [`Shared::seen_solo`].
    solo: Mutex<BTreeMap<u64, u64>>,
}

/// FIEMAP flags of an extent whose address says nothing about the extent's
/// place on disk (or which has none yet).
const NO_ADDRESS: u32 =
    fiemap_flags::UNKNOWN | fiemap_flags::DELALLOC | fiemap_flags::ENCODED | fiemap_flags::DATA_INLINE;

impl Shared<'_> {
    /// Remember the disk space of every extent of `extents` that FIEMAP
    /// reports not shared, i.e. referenced by one file of the plan only.
    fn note_solo(&self, extents: &[sys::Extent]) {
        let mut solo = locked(&self.solo);
        for e in extents.iter().filter(|e| !e.is_shared() && e.flags & NO_ADDRESS == 0 && e.length > 0) {
            add_span(&mut solo, e.physical, e.physical + e.length);
        }
    }

    /// Whether extent `e`, reported shared now, was seen not shared earlier
    /// in this phase: then every reference added since came from this
    /// run's own requests between files of the plan (and the bookend
    /// pass's temporary files, gone when it ends), so no file outside the
    /// plan can reference it and asking the kernel for its owners
    /// (`LOGICAL_INO`, a back-reference walk of the whole extent, half the
    /// share phase's CPU on btrfs SMALL before this) is not needed. Disk
    /// space overlapping means the same extent: extents do not overlap on
    /// disk, and space this run frees is only reused for extents this run
    /// shares into plan files. Encoded (compressed) and unplaced extents
    /// are never matched: their addresses are no byte ranges on disk.
    /// This also keeps an extent this run gave more references than
    /// `LOGICAL_INO` can list (a disk image that became the source of
    /// thousands of small files) from counting as pinned: on the SMALL
    /// benchmark corpus that left a 584 KiB part of the VM image pending
    /// after every first run.
    fn seen_solo(&self, e: &sys::Extent) -> bool {
        if e.flags & NO_ADDRESS != 0 || e.length == 0 {
            return false;
        }
        overlaps(&locked(&self.solo), e.physical, e.physical + e.length)
    }
}

/// Add `[start, end)` to a set of disjoint spans (start → end), merging it
/// with every span it overlaps or touches.
fn add_span(spans: &mut BTreeMap<u64, u64>, mut start: u64, mut end: u64) {
    let touching: Vec<(u64, u64)> =
        spans.range(..=end).rev().take_while(|&(_, &e)| e >= start).map(|(&s, &e)| (s, e)).collect();
    for (s, e) in touching {
        spans.remove(&s);
        start = start.min(s);
        end = end.max(e);
    }
    spans.insert(start, end);
}

/// Whether `[start, end)` overlaps a span of a set built by [`add_span`].
fn overlaps(spans: &BTreeMap<u64, u64>, start: u64, end: u64) -> bool {
    spans.range(..end).next_back().is_some_and(|(_, &e)| e > start)
}

/// A set behind a mutex; a worker that panicked holding it cannot have left
/// it half updated (one insert), so poisoning is ignored.
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One worker: its own buffers and counts, merged at the end.
struct Executor<'a> {
    sh: &'a Shared<'a>,
    files: &'a HashMap<FileId, Candidate>,
    block_size: u64,
    mode: Mode,
    progress: &'a dyn Progress,
    out: Outcome,
    /// `st_dev` → volume key, for the identity check of opened files.
    keys: sys::SubvolIds,
    /// Whether the extent at a FIEMAP address is referenced by a file
    /// outside the plan (`None`: cannot tell on this filesystem).
    pinned: HashMap<u64, bool>,
    /// The filesystem cannot list an extent's owners (not btrfs, no
    /// CAP_SYS_ADMIN): stop asking.
    no_owners: bool,
    buf_a: Vec<u8>,
    buf_b: Vec<u8>,
}

/// Why sharing stops when the filesystem cannot share extents at all.
const REFUSED: &str = "the filesystem does not support sharing extents (FIDEDUPERANGE: operation not supported); on XFS this needs a filesystem made with reflink=1";

/// Statuses that may mean "this filesystem cannot share" rather than "this
/// file": then [`probe_can_share`] decides.
fn unsupported(s: DedupeStatus) -> bool {
    matches!(s, DedupeStatus::Error(Errno::EOPNOTSUPP | Errno::ENOTTY | Errno::EXDEV | Errno::EINVAL))
}

/// Whether the filesystem of the run's first starting path can share
/// extents at all: write two equal 4 KiB blocks into an unnamed temporary
/// file there (`O_TMPFILE`: never visible, gone on close) and share the
/// second with the first. Refused with `EOPNOTSUPP`/`ENOTTY`/`EINVAL`: it
/// cannot (XFS without reflink). Any other failure to probe (no room for a
/// temporary file, read-only mount) says nothing about sharing: assumed
/// able, so a single refusal never stops the whole run.
fn probe_can_share(tree: &Tree) -> bool {
    let Ok(tmp) = tree.tmpfile() else { return true };
    let block = [0x5a_u8; 4096];
    if tmp.write_all_at(&block, 0).and_then(|_| tmp.write_all_at(&block, 4096)).is_err() {
        return true;
    }
    match sys::dedupe_range(tmp.as_fd(), 0, 4096, &[(tmp.as_fd(), 4096)]) {
        Ok(r) => !unsupported(r[0].status),
        Err(Errno::EOPNOTSUPP | Errno::ENOTTY | Errno::EINVAL) => false,
        Err(_) => true,
    }
}

fn same_source(a: &Range, b: &Range) -> bool {
    (a.src, a.src_off, a.len) == (b.src, b.src_off, b.len)
}

impl<'a> Executor<'a> {
    fn new(sh: &'a Shared<'a>) -> Executor<'a> {
        Executor {
            sh,
            files: sh.files,
            block_size: sh.block_size,
            mode: sh.mode,
            progress: sh.progress,
            out: Outcome::default(),
            keys: sys::SubvolIds::new(),
            pinned: HashMap::new(),
            no_owners: false,
            buf_a: vec![0; 1 << 20],
            buf_b: vec![0; 1 << 20],
        }
    }

    /// Stopped by a signal, or the filesystem refuses to share (seen by any
    /// worker).
    fn halted(&self) -> bool {
        self.sh.stop.load(Ordering::Relaxed) || self.refused()
    }

    fn refused(&self) -> bool {
        self.sh.refused.load(Ordering::Relaxed)
    }

    /// Sharing is impossible on this filesystem: say so once, stop everyone.
    fn refuse(&mut self) {
        self.out.refused = Some(REFUSED.to_owned());
        self.sh.refused.store(true, Ordering::Relaxed);
    }

    /// A request was refused in a way that may mean "this filesystem cannot
    /// share" or only "this destination cannot be shared into" (another
    /// filesystem, a file that changed kind). Probe the filesystem once: if
    /// it cannot share, stop everyone (true); otherwise the refusal is the
    /// destination's (false).
    fn refuse_if_fs_cannot_share(&mut self) -> bool {
        let can = *self.sh.can_share.get_or_init(|| probe_can_share(self.sh.tree));
        if !can {
            self.refuse();
        }
        !can
    }

    /// Run the ranges of one unit (one source, whole groups, in plan order).
    fn run_unit(&mut self, ranges: &[Range]) {
        let mut src_file: Option<(FileId, File)> = None;
        let mut i = 0;
        while i < ranges.len() {
            if self.halted() {
                break;
            }
            let first = ranges[i];
            let mut j = i + 1;
            while j < ranges.len() && same_source(&ranges[j], &first) {
                j += 1;
            }
            let group = &ranges[i..j];
            i = j;
            if src_file.as_ref().map(|(id, _)| *id) != Some(first.src) {
                src_file = self.open(first.src).map(|f| (first.src, f));
            }
            if let Some((_, src)) = &src_file {
                self.source_group(src, &first, group);
            }
            // Counted once done, so the bar's ETA covers the group's work.
            self.progress.inc(group.iter().map(|r| r.len).sum());
        }
    }

    /// Open a file read-only and check that it is still what was scanned.
    /// A file found changed or unopenable is counted and warned about by
    /// the first worker that finds it, and never used again by any.
    fn open(&mut self, id: FileId) -> Option<File> {
        if locked(&self.sh.bad).contains(&id) {
            return None;
        }
        let c = self.files.get(&id)?;
        let res = self.sh.tree.open_file(&c.path).and_then(|f| Ok((f.metadata()?, f)));
        match res {
            Ok((m, f)) => {
                use std::os::unix::fs::MetadataExt;
                let key = self.keys.id_for(m.dev(), &f);
                let now = Candidate { dev: key, ..Candidate::from_metadata(c.path.clone(), &m) };
                if now != *c || !m.is_file() {
                    if locked(&self.sh.bad).insert(id) {
                        self.progress.warn(&format!(
                            "{}: changed since it was scanned; left alone, it is rehashed next run",
                            display_path(&c.path)
                        ));
                        self.out.changed_files += 1;
                    }
                    return None;
                }
                Some(f)
            }
            Err(e) => {
                if locked(&self.sh.bad).insert(id) {
                    // Gone, or a directory on its path replaced by a symlink
                    // or a mount since the scan: the scanned file is no
                    // longer there.
                    let kind = match e.raw_os_error() {
                        Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::EXDEV) => "vanished",
                        _ => "open",
                    };
                    self.progress.warn(&format!("{}: cannot open: {e}", display_path(&c.path)));
                    *self.out.errors.entry(kind.to_owned()).or_default() += 1;
                }
                None
            }
        }
    }

    /// Share one source range into its destinations. They are opened,
    /// mapped and submitted [`MAX_DESTS`] at a time (one request's worth), so
    /// that a file with thousands of copies keeps at most that many files
    /// open per worker, well under the usual limit of 1024.
    ///
    /// The source is mapped only when a destination's range holds an extent
    /// the kernel reports shared: a destination with no shared extent there
    /// cannot already share the source's blocks, so on a first run (nothing
    /// shared yet) this halves the FIEMAP calls, which on btrfs walk the
    /// back references of every extent (a quarter of the share phase's CPU
    /// on FULL/btrfs before this).
    fn source_group(&mut self, src: &File, r: &Range, group: &[Range]) {
        let mut src_map: Option<Vec<Option<u64>>> = None;
        // A source that may be inline is mapped first, as before: sharing
        // from an inline extent into a destination that is not makes btrfs
        // copy the bytes into the destination every run instead of sharing.
        let may_be_inline =
            r.src_off == 0 && self.files.get(&r.src).is_some_and(|c| c.size <= INLINE_MAX.max(self.block_size));
        if may_be_inline && self.map_once(&mut src_map, src, r).is_none() {
            return;
        }
        for batch in group.chunks(MAX_DESTS) {
            if self.halted() {
                return;
            }
            let mut whole: Vec<Dest> = Vec::new();
            let mut partial: Vec<Dest> = Vec::new();
            for d in batch {
                if locked(&self.sh.deferred).contains(&d.dest) {
                    continue;
                }
                let Some(file) = self.open(d.dest) else { continue };
                let Some(dst) = self.map(file.as_fd(), d.dest, d.dest_off, d.len) else { continue };
                let parts = if dst.shared {
                    let Some(src_blocks) = self.map_once(&mut src_map, src, r) else { return };
                    unshared_parts(src_blocks, &dst.blocks, self.block_size, r.len)
                } else {
                    vec![(0, r.len)]
                };
                let unshared: u64 = parts.iter().map(|p| p.1).sum();
                self.out.already_shared_bytes += r.len - unshared;
                let parts = if dst.shared { self.drop_pinned(file.as_fd(), d, &dst.extents, parts) } else { parts };
                if parts.is_empty() {
                    continue;
                }
                let dest = Dest { id: d.dest, file, off: d.dest_off, parts, extents: dst.extents.len() };
                if dest.parts == [(0, r.len)] {
                    whole.push(dest);
                } else {
                    partial.push(dest);
                }
            }
            if let Some(k) = self.less_fragmented_copy(src, r, group, &whole, &partial) {
                // The copy becomes the source and the source one more
                // destination (see `less_fragmented_copy`).
                let best = &whole[k];
                let mut targets = vec![Target { id: r.src, file: src, off: r.src_off }];
                targets.extend(whole.iter().enumerate().filter(|&(i, _)| i != k).map(|(_, d)| d.target(0)));
                self.out.swapped_sources += 1;
                self.submit(&best.file, best.off, r.len, &targets);
            } else if !whole.is_empty() {
                let targets: Vec<Target<'_>> = whole.iter().map(|d| d.target(0)).collect();
                self.submit(src, r.src_off, r.len, &targets);
            }
            for d in &partial {
                for &(o, l) in &d.parts {
                    self.submit(src, r.src_off + o, l, &[d.target(o)]);
                }
            }
        }
    }

    /// The copy to share from instead of the planned source, if the source
    /// is far more fragmented than one of its copies: sharing a contiguous
    /// copy from a 20,000-extent file leaves the copy with 20,000 extents;
    /// the other way round, every copy ends contiguous. The planner picks
    /// sources by rank alone, so this is decided here, and only where it is
    /// safe whatever the other workers do: a whole-file group (one source
    /// range, every destination whole and still unshared) whose source and
    /// chosen copy appear in no other range of the plan. "Far more": at
    /// least 4 times the extents and 32 more; files under 1 MiB are never
    /// considered (one FIEMAP more per source, on btrfs a back-reference
    /// walk per extent).
    fn less_fragmented_copy(
        &mut self,
        src: &File,
        r: &Range,
        group: &[Range],
        whole: &[Dest],
        partial: &[Dest],
    ) -> Option<usize> {
        const MIN_LEN: u64 = 1 << 20;
        let size = self.files.get(&r.src)?.size;
        if r.len < MIN_LEN || r.src_off != 0 || r.len != size || !partial.is_empty() || whole.len() != group.len() {
            return None;
        }
        if !self.sh.used_once.contains(&r.src) || whole.iter().any(|d| d.off != 0) {
            return None;
        }
        let (k, best) = whole
            .iter()
            .enumerate()
            .filter(|(_, d)| self.sh.used_once.contains(&d.id))
            .min_by_key(|(_, d)| d.extents)?;
        let src_extents = sys::fiemap(src.as_fd(), 0, r.len).ok()?.len();
        (src_extents >= 4 * best.extents && src_extents >= best.extents + 32).then_some(k)
    }

    /// The parts (relative to `d.dest_off`) of a destination range that lie
    /// in extents nothing outside the plan references. A shared extent of
    /// the destination that a file outside the plan (a read-only snapshot,
    /// an excluded file) also references stays allocated whatever this run
    /// does: sharing into it would free nothing and grow metadata. Such
    /// parts are dropped and the destination counted pending
    /// ([`Pending::Pinned`]), so a later run shares it once the snapshot
    /// is gone. Asked only of extents FIEMAP flags `SHARED` whose blocks
    /// do not already share the source's and that were not seen unshared
    /// earlier in this phase ([`Shared::seen_solo`]), once per extent per
    /// worker.
    fn drop_pinned(
        &mut self,
        fd: BorrowedFd<'_>,
        d: &Range,
        extents: &[sys::Extent],
        parts: Vec<(u64, u64)>,
    ) -> Vec<(u64, u64)> {
        if self.no_owners || parts.is_empty() {
            return parts;
        }
        let mut kept = Vec::with_capacity(parts.len());
        let mut dropped = 0;
        for (o, l) in parts {
            let (start, end) = (d.dest_off + o, d.dest_off + o + l);
            let mut pos = start;
            for e in extents.iter().filter(|e| e.is_shared() && e.logical < end && e.logical + e.length > start) {
                let (es, ee) = (e.logical.max(start), (e.logical + e.length).min(end));
                if self.sh.seen_solo(e) || !self.is_pinned(fd, e.physical) {
                    continue;
                }
                if es > pos {
                    kept.push((pos - d.dest_off, es - pos));
                }
                dropped += ee - es;
                pos = ee;
            }
            if pos < end {
                kept.push((pos - d.dest_off, end - pos));
            }
        }
        if dropped > 0 {
            self.pend(d.dest, Pending::Pinned, dropped);
        }
        kept
    }

    /// Whether the extent at FIEMAP address `phys` is referenced by a file
    /// outside the plan (or by more files than can be listed).
    fn is_pinned(&mut self, fd: BorrowedFd<'_>, phys: u64) -> bool {
        if let Some(&p) = self.pinned.get(&phys) {
            return p;
        }
        let p = match sys::fs::extent_owners(fd, phys) {
            Ok(o) => !o.complete || o.refs.iter().any(|r| !self.sh.in_plan.contains(r)),
            Err(Errno::ENOTTY | Errno::EOPNOTSUPP | Errno::EPERM | Errno::EINVAL) => {
                // Not btrfs, or not allowed: share as before.
                self.no_owners = true;
                false
            }
            // Gone meanwhile, or another error: let the kernel decide.
            Err(_) => false,
        };
        self.pinned.insert(phys, p);
        p
    }

    /// The source side of range `r`, mapped on first use only (`None`: it
    /// is inline, nothing to share from it).
    fn map_once<'m>(
        &mut self,
        cache: &'m mut Option<Vec<Option<u64>>>,
        src: &File,
        r: &Range,
    ) -> Option<&'m [Option<u64>]> {
        if cache.is_none() {
            *cache = Some(self.map(src.as_fd(), r.src, r.src_off, r.len)?.blocks);
        }
        cache.as_deref()
    }

    /// Rewrite the uncovered remainders of the partly covered extents of
    /// destination `id`, whose planned ranges cover `covered` (see
    /// [`crate::bookend`]).
    fn free_bookends(&mut self, id: FileId, covered: &[(u64, u64)], b: &Bookends) {
        let Some(size) = self.files.get(&id).map(|c| c.size) else { return };
        // Covered from start to end (a whole-file copy, most
        // destinations): every extent is shared whole, no remainder is
        // left, so neither open nor FIEMAP it here (on btrfs FIEMAP
        // walks the back references of every extent). The share phase
        // still checks the file before using it.
        if matches!(covered[..], [(0, len)] if len >= size) {
            return;
        }
        let Some(file) = self.open(id) else { return };
        let Ok(extents) = sys::fiemap(file.as_fd(), 0, size) else { return };
        self.sh.note_solo(&extents);
        let extents: Vec<DestExtent> = extents
            .iter()
            .map(|e| DestExtent {
                logical: e.logical,
                length: e.length,
                shared: e.is_shared(),
                unstable: e.flags & NO_ADDRESS != 0,
            })
            .collect();
        let pieces = bookend::remainders(&extents, covered, size, b.max_ratio);
        if pieces.is_empty() {
            return;
        }
        match self.mode {
            Mode::DryRun => self.out.rewritten_bytes += pieces.iter().map(|p| p.1).sum::<u64>(),
            Mode::Share => {
                if let Err(e) = self.rewrite(&file, size, &pieces, &b.tmp_dir) {
                    let path = display_path(&self.files[&id].path);
                    if e.raw_os_error().is_some_and(|n| no_space(Errno::from_raw(n))) {
                        locked(&self.sh.deferred).insert(id);
                        let bytes = covered.iter().map(|c| c.1).sum();
                        self.out.pending.insert(id, (Pending::NoSpaceRewrite, bytes));
                        self.progress.warn(&format!(
                            "{path}: no space to rewrite partly shared extents ({e}); not shared now, retried by the next run"
                        ));
                        *self.out.errors.entry("no_space".to_owned()).or_default() += 1;
                    } else {
                        self.progress.warn(&format!("{path}: cannot rewrite partly shared extents: {e}"));
                        *self.out.errors.entry("rewrite".to_owned()).or_default() += 1;
                    }
                }
            }
        }
    }

    /// Copy `pieces` of `dest` into an unnamed temporary file on the same
    /// filesystem (at the same offsets, same size, so an unaligned tail ends
    /// at both EOFs), then share them back into `dest`: the kernel compares
    /// the bytes, and `dest` then references fresh extents there.
    fn rewrite(&mut self, dest: &File, size: u64, pieces: &[(u64, u64)], dir: &std::path::Path) -> std::io::Result<()> {
        let tmp = sys::inode::open_tmpfile(dir)?;
        tmp.set_len(size)?;
        for &(off, len) in pieces {
            let mut pos = 0;
            while pos < len {
                let n = ((len - pos) as usize).min(self.buf_a.len());
                dest.read_exact_at(&mut self.buf_a[..n], off + pos)?;
                tmp.write_all_at(&self.buf_a[..n], off + pos)?;
                pos += n as u64;
            }
        }
        for &(off, len) in pieces {
            let mut pos = 0;
            while pos < len {
                let n = (len - pos).min(MAX_REQUEST_LEN);
                let r = sys::dedupe_range(tmp.as_fd(), off + pos, n, &[(dest.as_fd(), off + pos)])
                    .map_err(std::io::Error::from)?;
                match r[0] {
                    DestResult { status: DedupeStatus::Same, bytes_deduped } if bytes_deduped > 0 => {
                        self.out.rewritten_bytes += bytes_deduped;
                        pos += bytes_deduped;
                    }
                    // Out of space: the caller leaves the file for later.
                    DestResult { status: DedupeStatus::Error(e), .. } if no_space(e) => {
                        return Err(std::io::Error::from(e));
                    }
                    // Changed meanwhile, or refused: the file keeps its old extent.
                    _ => break,
                }
            }
        }
        Ok(())
    }

    /// Physical address per block of a range (`None` where unknown), or
    /// `None` for a file whose data is inline in metadata: sharing it frees
    /// nothing, and btrfs would report success every run.
    fn map(&mut self, fd: BorrowedFd<'_>, id: FileId, off: u64, len: u64) -> Option<Mapped> {
        Some(match sys::fiemap(fd, off, len) {
            Ok(ext) if ext.iter().any(|e| e.flags & sys::fiemap::flags::DATA_INLINE != 0) => {
                if locked(&self.sh.inline).insert(id) {
                    self.out.inline_files += 1;
                }
                return None;
            }
            Ok(ext) => {
                self.sh.note_solo(&ext);
                Mapped {
                    blocks: physical_map(&ext, off, len, self.block_size),
                    shared: ext.iter().any(|e| e.is_shared()),
                    extents: ext,
                }
            }
            Err(e) => {
                if e != Errno::EOPNOTSUPP {
                    let path = self.files.get(&id).map(|c| display_path(&c.path)).unwrap_or_default();
                    self.progress.info(&format!("{path}: fiemap: {e}"));
                }
                Mapped {
                    blocks: vec![None; len.div_ceil(self.block_size) as usize],
                    shared: false,
                    extents: Vec::new(),
                }
            }
        })
    }

    /// Share (or verify) `src[off..off+len]` into every destination, in
    /// requests of at most 16 MiB.
    fn submit(&mut self, src: &File, off: u64, len: u64, dests: &[Target<'_>]) {
        let mut alive: Vec<bool> = vec![true; dests.len()];
        let mut done = 0;
        while done < len && alive.iter().any(|&a| a) && !self.refused() {
            let chunk = (len - done).min(MAX_REQUEST_LEN);
            match self.mode {
                Mode::DryRun => {
                    for (k, d) in dests.iter().enumerate() {
                        if !alive[k] {
                            continue;
                        }
                        match self.compare(src, off + done, d, d.off + done, chunk) {
                            Ok(true) => {
                                self.out.duplicate_bytes += chunk;
                                self.out.status.same += 1;
                            }
                            Ok(false) => {
                                self.out.status.differs += 1;
                                alive[k] = false;
                            }
                            Err(e) => {
                                self.dest_error(d.id, &e.to_string(), "read");
                                alive[k] = false;
                            }
                        }
                    }
                }
                Mode::Share => {
                    let idx: Vec<usize> = (0..dests.len()).filter(|&k| alive[k]).collect();
                    if done == 0 {
                        prefetch(src, off, chunk);
                        idx.iter().for_each(|&k| prefetch(dests[k].file, dests[k].off, chunk));
                    }
                    // The next chunk is read while the kernel compares this one.
                    let next = (len - done - chunk).min(MAX_REQUEST_LEN);
                    if next > 0 {
                        prefetch(src, off + done + chunk, next);
                        idx.iter().for_each(|&k| prefetch(dests[k].file, dests[k].off + done + chunk, next));
                    }
                    let fds: Vec<(BorrowedFd<'_>, u64)> =
                        idx.iter().map(|&k| (dests[k].file.as_fd(), dests[k].off + done)).collect();
                    self.out.duplicate_bytes += chunk * idx.len() as u64;
                    match sys::dedupe_range(src.as_fd(), off + done, chunk, &fds) {
                        Ok(results)
                            if results.iter().any(|r| unsupported(r.status)) && self.refuse_if_fs_cannot_share() =>
                        {
                            self.out.duplicate_bytes -= chunk * idx.len() as u64;
                        }
                        Ok(results) => {
                            for (res, &k) in results.iter().zip(&idx) {
                                if matches!(res.status, DedupeStatus::Error(e) if no_space(e)) {
                                    self.pend(dests[k].id, Pending::NoSpaceShare, len - done);
                                }
                                if !self.record(dests[k].id, res.status, res.bytes_deduped) {
                                    alive[k] = false;
                                } else if res.bytes_deduped < chunk {
                                    // The kernel may share less than asked:
                                    // carry on from where it stopped.
                                    if !self.finish_short(src, off + done, chunk, &dests[k], done, res.bytes_deduped) {
                                        alive[k] = false;
                                    }
                                }
                            }
                        }
                        Err(Errno::EOPNOTSUPP | Errno::ENOTTY | Errno::EXDEV | Errno::EINVAL)
                            if self.refuse_if_fs_cannot_share() =>
                        {
                            self.out.duplicate_bytes -= chunk * idx.len() as u64;
                        }
                        Err(e) => {
                            self.out.duplicate_bytes -= chunk * idx.len() as u64;
                            for &k in &idx {
                                if no_space(e) {
                                    self.pend(dests[k].id, Pending::NoSpaceShare, len - done);
                                }
                                self.dest_error(
                                    dests[k].id,
                                    e.desc(),
                                    e.to_string().split(':').next().unwrap_or("errno"),
                                );
                                alive[k] = false;
                            }
                        }
                    }
                }
            }
            done += chunk;
        }
    }

    /// Re-issue the rest of a request the kernel shared only partly.
    fn finish_short(&mut self, src: &File, src_off: u64, chunk: u64, d: &Target<'_>, done: u64, first: u64) -> bool {
        let mut got = first;
        while got < chunk {
            let fd = [(d.file.as_fd(), d.off + done + got)];
            match sys::dedupe_range(src.as_fd(), src_off + got, chunk - got, &fd) {
                Ok(r) if r[0].status == DedupeStatus::Same && r[0].bytes_deduped > 0 => {
                    self.out.deduped_bytes += r[0].bytes_deduped;
                    got += r[0].bytes_deduped;
                }
                Ok(r) => {
                    if matches!(r[0].status, DedupeStatus::Error(e) if no_space(e)) {
                        self.pend(d.id, Pending::NoSpaceShare, chunk - got);
                    }
                    self.record(d.id, r[0].status, 0);
                    return false;
                }
                Err(e) => {
                    if no_space(e) {
                        self.pend(d.id, Pending::NoSpaceShare, chunk - got);
                    }
                    self.dest_error(d.id, e.desc(), "short");
                    return false;
                }
            }
        }
        true
    }

    /// Leave `bytes` planned into destination `id` for a later run.
    fn pend(&mut self, id: FileId, why: Pending, bytes: u64) {
        let e = self.out.pending.entry(id).or_insert((why, 0));
        e.0 = e.0.min(why);
        e.1 += bytes;
    }

    /// Count one destination's status; false when it must not be used again.
    fn record(&mut self, id: FileId, status: DedupeStatus, bytes: u64) -> bool {
        match status {
            DedupeStatus::Same => {
                self.out.status.same += 1;
                self.out.deduped_bytes += bytes;
                true
            }
            DedupeStatus::Differs => {
                self.out.status.differs += 1;
                let path = self.files.get(&id).map(|c| display_path(&c.path)).unwrap_or_default();
                self.progress.info(&format!("{path}: contents differ from the source; not shared"));
                false
            }
            DedupeStatus::Error(e) => {
                let name = format!("{e:?}");
                *self.out.status.errors.entry(name).or_default() += 1;
                let path = self.files.get(&id).map(|c| display_path(&c.path)).unwrap_or_default();
                self.progress.warn(&format!("{path}: kernel refused to share: {}", e.desc()));
                false
            }
        }
    }

    fn dest_error(&mut self, id: FileId, msg: &str, kind: &str) {
        let path = self.files.get(&id).map(|c| display_path(&c.path)).unwrap_or_default();
        self.progress.warn(&format!("{path}: {msg}"));
        *self.out.status.errors.entry(kind.to_owned()).or_default() += 1;
    }

    /// Our own byte-for-byte compare, for dry runs.
    fn compare(&mut self, a: &File, a_off: u64, d: &Target<'_>, b_off: u64, len: u64) -> std::io::Result<bool> {
        let mut pos = 0;
        while pos < len {
            let n = ((len - pos) as usize).min(self.buf_a.len());
            a.read_exact_at(&mut self.buf_a[..n], a_off + pos)?;
            d.file.read_exact_at(&mut self.buf_b[..n], b_off + pos)?;
            if self.buf_a[..n] != self.buf_b[..n] {
                return Ok(false);
            }
            pos += n as u64;
        }
        Ok(true)
    }
}

/// Ask the kernel to read `f[off..off+len]` into the page cache now, in
/// large asynchronous requests. `FIDEDUPERANGE` compares page by page and
/// reads a missing page synchronously, without read-ahead: on data that is
/// not cached (`--drop-cache`, or a volume larger than memory) it would wait
/// for the disk once per 4 KiB. On cached data this costs a page-cache
/// lookup per page. Only advice: errors are ignored.
fn prefetch(f: &File, off: u64, len: u64) {
    let _ = posix_fadvise(f, off as i64, len as i64, PosixFadviseAdvice::POSIX_FADV_WILLNEED);
}

/// What FIEMAP says about one planned range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeState {
    /// This many of its bytes do not share the source's extents yet.
    Unshared(u64),
    /// A file's data is inline in metadata (btrfs): it can never be shared.
    Inline,
    /// A file could not be opened or mapped.
    Unknown,
}

/// The state of every range of `plan`, from FIEMAP alone (no data is read).
///
/// The files were recorded by earlier runs from starting paths not known
/// here: each is opened below the top of the mount holding it (no symlink,
/// no `..`, no other mount on the way) and must still be the recorded inode
/// (device and inode number).
pub fn range_states(plan: &Plan, files: &HashMap<FileId, Candidate>, block_size: u64) -> Vec<RangeState> {
    let tree = Tree::over_mounts(files.values().map(|c| c.path.as_path()));
    let map = |id: FileId, off: u64, len: u64| -> Result<Vec<Option<u64>>, RangeState> {
        let c = files.get(&id).ok_or(RangeState::Unknown)?;
        let f = tree.open_file(&c.path).map_err(|_| RangeState::Unknown)?;
        // The recorded inode, not whatever took its name (its content may
        // have changed since: the report measures the extents it has now).
        let m = f.metadata().map_err(|_| RangeState::Unknown)?;
        // `c.dev` is the volume key (btrfs subvolume id), not `st_dev`.
        if !m.is_file() || m.ino() != c.ino || sys::volume_key(f.as_fd()).ok() != Some(c.dev) {
            return Err(RangeState::Unknown);
        }
        let ext = sys::fiemap(f.as_fd(), off, len).map_err(|_| RangeState::Unknown)?;
        if ext.iter().any(|e| e.flags & fiemap_flags::DATA_INLINE != 0) {
            return Err(RangeState::Inline);
        }
        Ok(physical_map(&ext, off, len, block_size))
    };
    plan.ranges
        .iter()
        .map(|r| match (map(r.src, r.src_off, r.len), map(r.dest, r.dest_off, r.len)) {
            (Ok(s), Ok(d)) => RangeState::Unshared(unshared_parts(&s, &d, block_size, r.len).iter().map(|p| p.1).sum()),
            (Err(RangeState::Inline), _) | (_, Err(RangeState::Inline)) => RangeState::Inline,
            _ => RangeState::Unknown,
        })
        .collect()
}

/// The parts of a range (offset, length relative to its start) whose blocks
/// do not already map to the same physical address in source and
/// destination. Unknown addresses count as not shared.
pub fn unshared_parts(src: &[Option<u64>], dst: &[Option<u64>], block: u64, len: u64) -> Vec<(u64, u64)> {
    let mut parts: Vec<(u64, u64)> = Vec::new();
    for (i, (s, d)) in src.iter().zip(dst).enumerate() {
        let shared = s.is_some() && s == d;
        if shared {
            continue;
        }
        let off = i as u64 * block;
        let l = block.min(len - off);
        match parts.last_mut() {
            Some((o, pl)) if *o + *pl == off => *pl += l,
            _ => parts.push((off, l)),
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_merge_and_overlap() {
        let mut s = BTreeMap::new();
        add_span(&mut s, 100, 200);
        add_span(&mut s, 300, 400);
        assert!(!overlaps(&s, 0, 100) && !overlaps(&s, 200, 300) && !overlaps(&s, 400, 500));
        assert!(overlaps(&s, 150, 160) && overlaps(&s, 50, 101) && overlaps(&s, 399, 1000) && overlaps(&s, 0, 1000));
        // A piece inside a wider span, then one bridging two spans.
        add_span(&mut s, 120, 130);
        add_span(&mut s, 150, 350);
        assert_eq!(s.into_iter().collect::<Vec<_>>(), [(100, 400)]);
    }

    #[test]
    fn unshared_parts_skips_shared_blocks() {
        let s = [Some(10), Some(20), Some(30), Some(40)];
        let d = [Some(10), Some(99), None, Some(40)];
        assert_eq!(unshared_parts(&s, &d, 4, 16), vec![(4, 8)]);
        assert_eq!(unshared_parts(&s, &s, 4, 16), vec![]);
        // A partial last block keeps the range's real length.
        let d2 = [Some(10), Some(20), Some(30), Some(41)];
        assert_eq!(unshared_parts(&s, &d2, 4, 14), vec![(12, 2)]);
        let none = [None, None];
        assert_eq!(unshared_parts(&none, &none, 4, 8), vec![(0, 8)]);
    }

    fn r(src: i64, src_off: u64, len: u64, dest: i64) -> Range {
        Range { src: FileId(src), src_off, len, dest: FileId(dest), dest_off: 0 }
    }

    #[test]
    fn units_cover_the_plan_once_keep_groups_whole_and_put_large_first() {
        let mb = 1 << 20;
        let mut ranges = vec![
            // Source 1: two small groups, one unit.
            r(1, 0, 4096, 10),
            r(1, 0, 4096, 11),
            r(1, 8192, 4096, 10),
            // Source 2: 40 groups of 4 MiB with two destinations each
            // (8 MiB per group): cut after 64 MiB, never inside a group.
        ];
        for k in 0..40 {
            ranges.push(r(2, k * 4 * mb, 4 * mb, 20));
            ranges.push(r(2, k * 4 * mb, 4 * mb, 21));
        }
        ranges.push(r(3, 0, 100 * mb, 30));
        ranges.sort_unstable();
        let units = units(&ranges);
        let mut seen = vec![0; ranges.len()];
        for &(s, e) in &units {
            assert!(s < e);
            assert!(ranges[s..e].iter().all(|x| x.src == ranges[s].src), "one source per unit");
            assert!(s == 0 || !same_source(&ranges[s - 1], &ranges[s]), "a group is never cut");
            seen[s..e].iter_mut().for_each(|n| *n += 1);
        }
        assert!(seen.iter().all(|&n| n == 1), "every range exactly once: {seen:?}");
        let bytes: Vec<u64> = units.iter().map(|&(s, e)| ranges[s..e].iter().map(|x| x.len).sum()).collect();
        assert!(bytes.windows(2).all(|w| w[0] >= w[1]), "largest first: {bytes:?}");
        // 320 MiB of source 2: cut at the first group reaching 64 MiB.
        assert_eq!(bytes, vec![100 * mb, 64 * mb, 64 * mb, 64 * mb, 64 * mb, 64 * mb, 3 * 4096]);
    }

    #[test]
    fn used_once_is_one_source_range_or_one_destination_range() {
        let mut ranges = vec![
            // 1 → 2, 3 whole: 1 is one source range, 2 and 3 one dest each.
            r(1, 0, 4096, 2),
            r(1, 0, 4096, 3),
            // 4 is the source of two ranges; 5 a destination of two.
            r(4, 0, 4096, 5),
            r(4, 8192, 4096, 5),
            // 6 is a source and a destination.
            r(6, 0, 4096, 7),
            r(1, 0, 4096, 6),
        ];
        ranges.sort_unstable();
        let once = used_once(&Plan { ranges });
        let mut got: Vec<i64> = once.iter().map(|f| f.0).collect();
        got.sort_unstable();
        assert_eq!(got, vec![1, 2, 3, 7]);
    }

    #[test]
    fn merged_outcomes_add_up() {
        let mut a = Outcome { duplicate_bytes: 1, deduped_bytes: 2, changed_files: 1, ..Default::default() };
        a.status.errors.insert("EIO".into(), 1);
        a.errors.insert("open".into(), 2);
        let mut b = Outcome {
            duplicate_bytes: 10,
            deduped_bytes: 20,
            already_shared_bytes: 5,
            inline_files: 3,
            rewritten_bytes: 7,
            refused: Some("no".into()),
            ..Default::default()
        };
        b.status.same = 4;
        b.status.differs = 1;
        b.status.errors.insert("EIO".into(), 2);
        b.errors.insert("vanished".into(), 1);
        a.merge(b);
        assert_eq!(
            (a.duplicate_bytes, a.deduped_bytes, a.already_shared_bytes, a.changed_files, a.inline_files),
            (11, 22, 5, 1, 3)
        );
        assert_eq!((a.rewritten_bytes, a.status.same, a.status.differs), (7, 4, 1));
        assert_eq!(a.status.errors["EIO"], 3);
        assert_eq!((a.errors["open"], a.errors["vanished"]), (2, 1));
        assert_eq!(a.refused.as_deref(), Some("no"));
    }
}
