//! The share phase's worker pool: the plan cut into units of work, the
//! threads that take them, and what they all read.
//!
//! The ranges run on a few worker threads: a `FIDEDUPERANGE` call is mostly
//! kernel CPU (comparing the pages, updating extent and reference-count
//! trees) plus waits on metadata reads and the journal, one call at a time,
//! so one thread leaves the other CPUs idle — one per CPU on cached data,
//! more when the pages to compare come from disk ([`sharing`]).
//! Workers take *units* (the ranges
//! of one source, cut at 64 MiB) largest first, passing over a unit whose
//! source another worker holds ([`Dealer`]); the planner resolved every
//! block to its root, so the order does not matter. Concurrent calls on the
//! same inode are safe: the kernel locks both inodes of a call. Every file a
//! worker finds changed, unopenable or inline is recorded in the
//! [`WorkerContext`] for all workers and counted once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use super::bookend;
use super::executor::Executor;
use super::{Mode, Outcome};
use crate::file::FileFacts;
use crate::file::{FileId, IdSet};
use crate::plan::{Plan, Range};
use crate::progress::Progress;
use crate::sys::beneath::Tree;
use crate::sys::dedupe::MAX_REQUEST_LEN;

/// Most worker threads of the share phase. On cached data the phase is
/// kernel CPU (on XFS four fifths of it inside `FIDEDUPERANGE`), so workers
/// beyond the CPUs only contend for the filesystem's locks: on 2 vCPUs and
/// the 4.3 GiB benchmark corpus, 2 workers took 3.6–4.2 s where 1 took
/// 5.5 s, and 4 workers 4.4–4.9 s. Not measured on more CPUs; the cap keeps
/// the journal and allocation-group locks (and open files) in check there.
pub const MAX_WORKERS: usize = 4;

/// Ranges of one source are cut into units of about this many bytes, so that
/// one large file (a VM image) does not end the phase on one thread.
const UNIT_BYTES: u64 = 64 << 20;

/// Worker threads for this machine: one per CPU, at least 2 (even on cached
/// data a fifth of a single thread's time is spent waiting, on metadata
/// reads and the journal), at most [`MAX_WORKERS`].
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, MAX_WORKERS)
}

/// Worker threads when the pages to compare must come from disk. The
/// kernel's compare inside `FIDEDUPERANGE` reads a missing page on its own,
/// one request at a time per call, and read-ahead does little for it: in a
/// 1 GiB memory cgroup, on the 4.3 GiB benchmark corpus (btrfs, 2 vCPUs),
/// the phase read 3.7 GiB at 230 MB/s with 2 workers, the disk's raw read
/// being about 480 MB/s. More requests in flight: the ranges pass took
/// 14.1–15.5 s with 2 workers, 11.2 s with 4, 9.9 with 8, 10.7 with 12 (a
/// read-ahead thread feeding the 2 workers: 11.4–13 s). On cached data the
/// same 8 workers would only contend for locks (see [`MAX_WORKERS`]).
pub const IO_WORKERS: usize = 8;

/// How the share phase runs: on how many workers, and whether the pages
/// to compare are expected to come from disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sharing {
    /// Worker threads (1: all on the calling thread).
    pub workers: usize,
    /// Each worker reads a request's pages itself (`pread`, into a scratch
    /// buffer) before submitting it. The kernel's compare reads a missing
    /// page synchronously, one at a time, and `POSIX_FADV_WILLNEED` often
    /// gets no room in a memory cgroup at its limit; a `pread` reads the
    /// request's 16 MiB in large requests, reclaiming as it must. FULL/btrfs
    /// in a 1 GiB cgroup: share phase 13.1–13.3 s → 7.8–8.5 s. On cached
    /// data it would only copy every page once more.
    pub from_disk: bool,
    /// From disk: the most bytes one request may have its worker read,
    /// source and destinations together ([`request_len`]).
    pub request_bytes: u64,
    /// Files of different owners may be shared (`--share-across-owners`).
    /// Otherwise a destination owned by another user than its source is
    /// refused: the plan never pairs them (their fingerprints are salted
    /// apart by owner), unless a file changed owner since it was hashed.
    pub across_owners: bool,
    /// Share into destination extents a file outside the run (a read-only
    /// snapshot) keeps too (`--share-snapshotted`), instead of leaving
    /// them pending ([`super::Pending::Pinned`]).
    pub pinned_too: bool,
    /// Ranges whose source `--keep-free` left whole this pass are not
    /// shared either: their destinations wait with it
    /// ([`super::Pending::KeepFree`]), for a later round of the same run
    /// to share them from the source's new extents. Shared from its old
    /// extent, a copy keeps that extent whole for good, duplicate parts
    /// and all, and no later rewrite of the source can free it. Set while
    /// another round may follow (`pipeline::rounds`), in a dry run too
    /// (so that its rounds preview the run's).
    pub wait_for_sources: bool,
    /// btrfs without `--include-nocow`: a file found NOCOW when opened to
    /// be shared is left alone (see `Executor::nocow_now`).
    pub leave_nocow: bool,
}

impl Sharing {
    /// `workers` workers on data expected in the page cache.
    pub const fn cached(workers: usize) -> Sharing {
        Sharing {
            workers,
            from_disk: false,
            request_bytes: u64::MAX,
            across_owners: false,
            pinned_too: false,
            wait_for_sources: false,
            leave_nocow: false,
        }
    }
}

/// How to share a plan comparing about `bytes` bytes (source and
/// destination pages), `drop_cache` telling that the scan dropped what it
/// read from the page cache. From disk when the scan dropped them, or when
/// they cannot all fit in half the memory this process's page cache may
/// hold (RAM, or a memory cgroup such as the systemd unit's
/// `MemoryHigh=`): then on [`IO_WORKERS`] workers (fewer where the
/// open-file limit cannot take a full request per worker), else on
/// [`default_workers`].
pub fn sharing(bytes: u64, drop_cache: bool) -> Sharing {
    sharing_for(
        bytes,
        drop_cache,
        crate::sys::limits::memory_limit(),
        crate::sys::limits::fd_limit(),
        default_workers(),
    )
}

/// [`sharing`], its inputs given.
fn sharing_for(bytes: u64, drop_cache: bool, memory: Option<u64>, fd_limit: u64, cpu_workers: usize) -> Sharing {
    let from_disk = drop_cache || memory.is_some_and(|m| bytes > m / 2);
    if !from_disk {
        return Sharing::cached(cpu_workers);
    }
    // A worker holds a request's destinations and its source open; leave
    // room for the database, the directories held and the standard streams.
    let fit = fd_limit.saturating_sub(64) / (crate::sys::dedupe::MAX_DESTS as u64 + 1);
    let workers = (fit as usize).clamp(cpu_workers.min(IO_WORKERS), IO_WORKERS);
    // What the workers read for their requests (and read ahead for the
    // next ones, as much again) must stay in the page cache until the
    // kernel compares it: together half the memory, as above. In 1 GiB on
    // 8 workers a source and a destination still go 16 MiB at a time.
    let request_bytes = memory.map_or(u64::MAX, |m| m / 4 / workers as u64);
    Sharing { workers, from_disk, request_bytes, ..Sharing::cached(workers) }
}

/// The length of each request of a source range shared into `dests`
/// destinations, `block` aligned: [`MAX_REQUEST_LEN`], or shorter, so that
/// the source's and destinations' pages together (what the worker reads
/// before it submits the request) come to at most `request_bytes`. A file
/// in 40 copies, 16 MiB requests into all of them, read 656 MiB ahead of
/// each compare: in a 1 GiB cgroup the first pages were reclaimed before
/// the kernel compared them, and it read them again a page at a time,
/// on the one worker that holds the source (the layouts corpus: 4.3 s of
/// 4 KiB reads at a queue depth of 0.7).
pub(super) fn request_len(request_bytes: u64, dests: usize, block: u64) -> u64 {
    let block = block.max(1);
    let each = request_bytes / (dests as u64 + 1);
    (each / block * block).clamp(block, MAX_REQUEST_LEN)
}

/// Do `work` on every item, on up to `workers` executors, each on its own
/// thread (one: on the calling thread) taking the next item from one
/// [`Dealer`] until none is left or all must stop; merge what they did.
/// `key` names the file an item locks throughout (a unit's source), if any.
pub(super) fn on_workers<T: Sync>(
    ctx: &WorkerContext<'_>,
    workers: usize,
    items: &[T],
    key: impl Fn(&T) -> Option<FileId> + Sync,
    work: impl Fn(&mut Executor<'_>, &T) + Sync,
) -> Outcome {
    let dealer = Dealer::new(items.len());
    let key_of = |i: usize| key(&items[i]);
    let run = || {
        let mut ex = Executor::new(ctx);
        while !ex.halted() {
            let Some(i) = dealer.take(key_of) else { break };
            work(&mut ex, &items[i]);
            dealer.done(key_of(i));
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
                    ctx.progress.info(&format!("cannot start share worker {k}: {e}"));
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

/// Items a [`Dealer`] looks past a busy one for one whose key is free.
const LOOK_AHEAD: usize = 64;

/// Hands items to workers in order, except that an item whose key another
/// worker holds is passed over (for at most [`LOOK_AHEAD`] items) for one
/// whose key no worker holds. `FIDEDUPERANGE` locks its source inode
/// exclusively, so two workers on units of one source (a VM image's 64 MiB
/// units come one after another, largest first) would take turns, one of
/// them spinning on the lock (FULL/btrfs, plan and share after a separate
/// scan, four rounds: share phase 3.41–3.58 s → 3.26–3.52 s, medians 3.51
/// → 3.35 s). Never waits: when every item in reach is busy, the first is
/// taken anyway.
struct Dealer {
    state: Mutex<DealerState>,
}

struct DealerState {
    taken: Vec<bool>,
    /// No item before it is left.
    head: usize,
    /// The keys of the items being worked on, one entry per worker at most.
    busy: Vec<FileId>,
}

impl Dealer {
    fn new(items: usize) -> Dealer {
        Dealer { state: Mutex::new(DealerState { taken: vec![false; items], head: 0, busy: Vec::new() }) }
    }

    /// The next item to work on, its key marked busy; `None` when all are taken.
    fn take(&self, key: impl Fn(usize) -> Option<FileId>) -> Option<usize> {
        let mut s = locked(&self.state);
        let n = s.taken.len();
        while s.head < n && s.taken[s.head] {
            s.head += 1;
        }
        if s.head == n {
            return None;
        }
        let free = |i: usize| !s.taken[i] && key(i).is_none_or(|k| !s.busy.contains(&k));
        let pick = (s.head..n.min(s.head + LOOK_AHEAD)).find(|&i| free(i)).unwrap_or(s.head);
        s.taken[pick] = true;
        if let Some(k) = key(pick) {
            s.busy.push(k);
        }
        Some(pick)
    }

    /// An item with this key is done.
    fn done(&self, key: Option<FileId>) {
        let mut s = locked(&self.state);
        if let Some(at) = key.and_then(|k| s.busy.iter().position(|&b| b == k)) {
            s.busy.swap_remove(at);
        }
    }
}

/// Files named by exactly one source range (all its destinations) or one
/// destination range of `plan`.
pub(super) fn used_once(plan: &Plan) -> HashSet<FileId> {
    let mut uses: HashMap<FileId, (HashSet<(u64, u64)>, u32)> = HashMap::new();
    for r in &plan.ranges {
        uses.entry(r.src).or_default().0.insert((r.src_off, r.len));
        uses.entry(r.dest).or_default().1 += 1;
    }
    uses.into_iter().filter(|(_, (s, d))| s.len() + *d as usize == 1).map(|(id, _)| id).collect()
}

/// Each destination of `plan` with the union of its planned ranges, in id
/// order.
pub(super) fn dest_coverage(plan: &Plan) -> Vec<(FileId, Vec<(u64, u64)>)> {
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
pub(super) fn units(ranges: &[Range]) -> Vec<(usize, usize)> {
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

/// What every worker reads: the inputs, and the per-file verdicts that
/// must be reached (and counted, and warned about) once.
pub(super) struct WorkerContext<'a> {
    /// The scanned facts of every file of the plan.
    pub(super) files: &'a HashMap<FileId, FileFacts>,
    /// The starting paths: every file is opened below them.
    pub(super) tree: &'a Tree,
    /// Whether the filesystem can share at all, probed at the first refusal.
    pub(super) can_share: OnceLock<bool>,
    /// The filesystem's block size: FIEMAP addresses are compared per block.
    pub(super) block_size: u64,
    /// Share, or only compare (dry run).
    pub(super) mode: Mode,
    /// Where warnings and the bar go.
    pub(super) progress: &'a dyn Progress,
    /// Set by a signal or `--max-runtime`: every worker stops.
    pub(super) stop: &'a AtomicBool,
    /// Files that changed since the scan or could not be opened: never used
    /// again.
    pub(super) bad: Mutex<HashSet<FileId>>,
    /// Of those, the files another process held a lease on: the ranges
    /// planned into them (or from them, into their copies) wait, pending
    /// [`super::Pending::Leased`].
    pub(super) leased: Mutex<HashSet<FileId>>,
    /// Files whose data is inline in metadata.
    pub(super) inline: Mutex<HashSet<FileId>>,
    /// Sources found unreadable (a read error): named once.
    pub(super) unreadable: Mutex<HashSet<FileId>>,
    /// The filesystem refuses to share: every worker stops.
    pub(super) refused: AtomicBool,
    /// Destinations whose bookends could not be rewritten for lack of
    /// space, and why: left whole for a later run (see
    /// [`super::Pending::NoSpaceRewrite`]). Those left whole for
    /// `--keep-free` are, with [`Sharing::wait_for_sources`], not used as
    /// sources either.
    pub(super) deferred: Mutex<HashMap<FileId, super::Pending>>,
    /// [`Sharing::wait_for_sources`].
    pub(super) wait_for_sources: bool,
    /// `(volume key, inode)` of every file in the plan: an extent
    /// referenced by anything else cannot be freed by this run.
    pub(super) in_plan: HashSet<(u64, u64)>,
    /// Files in exactly one range of the plan (as source or destination):
    /// a whole-file group's source and copy may swap roles safely.
    pub(super) used_once: HashSet<FileId>,
    /// Files the scan of this run mapped and found sharing no extent:
    /// as destinations they are not mapped again (see
    /// `Executor::source_group`).
    pub(super) unshared: &'a IdSet,
    /// Disk space (FIEMAP addresses, start → end, overlapping pieces
    /// merged) of extents some FIEMAP of this phase reported not shared: see
    /// [`WorkerContext::seen_solo`].
    pub(super) solo: Mutex<BTreeMap<u64, u64>>,
    /// Read each request's pages before submitting it ([`Sharing::from_disk`]).
    pub(super) from_disk: bool,
    /// [`Sharing::request_bytes`].
    pub(super) request_bytes: u64,
    /// [`Sharing::across_owners`].
    pub(super) across_owners: bool,
    /// [`Sharing::pinned_too`].
    pub(super) pinned_too: bool,
    /// [`Sharing::leave_nocow`].
    pub(super) leave_nocow: bool,
}

impl WorkerContext<'_> {
    /// Remember the disk space of every extent of `extents` that FIEMAP
    /// reports not shared, i.e. referenced by one file of the plan only.
    pub(super) fn note_solo(&self, extents: &[crate::sys::Extent]) {
        let mut solo = locked(&self.solo);
        for e in extents.iter().filter(|e| !e.is_shared() && !e.is_unstable() && e.length > 0) {
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
    pub(super) fn seen_solo(&self, e: &crate::sys::Extent) -> bool {
        if e.is_unstable() || e.length == 0 {
            return false;
        }
        overlaps(&locked(&self.solo), e.physical, e.physical + e.length)
    }
}

/// Add `[start, end)` to a set of disjoint spans (start → end), merging it
/// with every span it overlaps or touches; the bytes of it not in the set
/// before.
pub(crate) fn add_span(spans: &mut BTreeMap<u64, u64>, mut start: u64, mut end: u64) -> u64 {
    let mut new = end.saturating_sub(start);
    let touching: Vec<(u64, u64)> =
        spans.range(..=end).rev().take_while(|&(_, &e)| e >= start).map(|(&s, &e)| (s, e)).collect();
    for (s, e) in touching {
        new -= e.min(end).saturating_sub(s.max(start));
        spans.remove(&s);
        start = start.min(s);
        end = end.max(e);
    }
    spans.insert(start, end);
    new
}

/// Whether `[start, end)` overlaps a span of a set built by [`add_span`].
fn overlaps(spans: &BTreeMap<u64, u64>, start: u64, end: u64) -> bool {
    spans.range(..end).next_back().is_some_and(|(_, &e)| e > start)
}

/// A set behind a mutex; a worker that panicked holding it cannot have left
/// it half updated (one insert), so poisoning is ignored.
pub(super) fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether two ranges belong to one group: the same source range.
pub(super) fn same_source(a: &Range, b: &Range) -> bool {
    (a.src, a.src_off, a.len) == (b.src, b.src_off, b.len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_workers_only_when_the_data_comes_from_disk() {
        let (gib, fds) = (1u64 << 30, 1 << 20);
        let disk = |workers| Sharing { from_disk: true, request_bytes: u64::MAX, ..Sharing::cached(workers) };
        let within = |workers, request_bytes| Sharing { request_bytes, ..disk(workers) };
        // Fits in half the memory: as many as CPUs.
        assert_eq!(sharing_for(4 * gib, false, Some(24 * gib), fds, 2), Sharing::cached(2));
        assert_eq!(sharing_for(4 * gib, false, None, fds, 3), Sharing::cached(3));
        // Larger than half the memory, or dropped by the scan; a request
        // reads at most a quarter of the memory shared out among the
        // workers.
        assert_eq!(sharing_for(4 * gib, false, Some(gib), fds, 2), within(IO_WORKERS, 2 * MAX_REQUEST_LEN));
        assert_eq!(sharing_for(gib, false, Some(gib / 4), fds, 2), within(IO_WORKERS, 8 << 20));
        assert_eq!(sharing_for(gib, true, Some(24 * gib), fds, 2), within(IO_WORKERS, 768 << 20));
        // The open-file limit of a login shell: fewer, never below the CPUs'.
        assert_eq!(sharing_for(gib, true, None, 1024, 2), disk(7));
        assert_eq!(sharing_for(gib, true, None, 256, 2), disk(2));
        assert_eq!(sharing_for(gib, true, None, 0, 4), disk(4));
    }

    #[test]
    fn requests_into_many_destinations_are_shorter_from_disk() {
        let (mib, b) = (1u64 << 20, 4096);
        // Cached: always the kernel's 16 MiB.
        assert_eq!(request_len(u64::MAX, 1, b), MAX_REQUEST_LEN);
        assert_eq!(request_len(u64::MAX, 127, b), MAX_REQUEST_LEN);
        // From disk, 32 MiB a request: one destination as before; 40 share
        // it, in whole blocks; never below one block.
        assert_eq!(request_len(32 * mib, 1, b), MAX_REQUEST_LEN);
        assert_eq!(request_len(32 * mib, 40, b), (32 * mib / 41) / b * b);
        assert!(request_len(32 * mib, 40, b) * 41 <= 32 * mib);
        assert_eq!(request_len(32 * mib, 127, 64 << 10), 256 << 10);
        assert_eq!(request_len(8 << 10, 127, b), b);
    }

    #[test]
    fn spans_merge_and_overlap() {
        let mut s = BTreeMap::new();
        assert_eq!(add_span(&mut s, 100, 200), 100);
        assert_eq!(add_span(&mut s, 200, 300), 100);
        assert_eq!(add_span(&mut s, 350, 450), 100);
        let mut s = BTreeMap::new();
        add_span(&mut s, 100, 200);
        add_span(&mut s, 300, 400);
        assert!(!overlaps(&s, 0, 100) && !overlaps(&s, 200, 300) && !overlaps(&s, 400, 500));
        assert!(overlaps(&s, 150, 160) && overlaps(&s, 50, 101) && overlaps(&s, 399, 1000) && overlaps(&s, 0, 1000));
        // A piece inside a wider span, then one bridging two spans.
        assert_eq!(add_span(&mut s, 120, 130), 0);
        assert_eq!(add_span(&mut s, 150, 350), 100);
        assert_eq!(s.into_iter().collect::<Vec<_>>(), [(100, 400)]);
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
    fn the_dealer_passes_over_a_source_another_worker_holds() {
        // Units of sources 1, 1, 1, 2, 3 (largest first: a large source's
        // units come one after another).
        let keys = [1, 1, 1, 2, 3].map(|k| Some(FileId(k)));
        let key = |i: usize| keys[i];
        let d = Dealer::new(keys.len());
        // Two workers: the second takes source 2, not source 1's next unit.
        assert_eq!(d.take(key), Some(0));
        assert_eq!(d.take(key), Some(3));
        // The second is done; source 1 is still held: source 3 goes first.
        d.done(key(3));
        assert_eq!(d.take(key), Some(4));
        // Nothing else is free: source 1's next unit is taken anyway.
        assert_eq!(d.take(key), Some(1));
        d.done(key(0));
        d.done(key(4));
        assert_eq!(d.take(key), Some(2));
        assert_eq!(d.take(key), None);
        // Without keys, in order.
        let d = Dealer::new(3);
        assert_eq!(
            [d.take(|_| None), d.take(|_| None), d.take(|_| None), d.take(|_| None)],
            [Some(0), Some(1), Some(2), None]
        );
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
}
