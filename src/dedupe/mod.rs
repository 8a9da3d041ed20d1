//! The share phase: execute a plan — share its ranges with
//! `FIDEDUPERANGE`, or, in a dry run, compare them byte for byte in user
//! space so the preview is exact.
//!
//! In: a [`Plan`] and the scanned facts of every file it names. Out: an
//! [`Outcome`] with verified, submitted and confirmed bytes and every
//! per-destination status.
//!
//! The bookend pass (btrfs, [`bookend`]) runs first, on the same worker
//! threads as the ranges (one destination at a time each; on the calling
//! thread when there is one worker), and ends before any range is shared.
//! The plan's ranges then run on the workers, a unit (the ranges of one
//! source) at a time. Last (btrfs), the parts the kernel found different
//! from their source are rewritten, so they do not keep their file's old
//! extent on disk ([`bookend`]).
//!
//! One job per file:
//! - `workers.rs`: the worker pool, the units of work, and the
//!   `WorkerContext` every worker reads (inputs, per-file verdicts reached
//!   once);
//! - `executor.rs`: what one worker does with a unit: open each file below
//!   the starting paths and check it, map it (FIEMAP), call
//!   `FIDEDUPERANGE`, and keep the pending (ENOSPC, pinned) accounts;
//! - `pinned.rs`: which shared extents a file outside the plan keeps;
//! - `swap.rs`: which copy a whole-file group is shared from (a copy a
//!   snapshot keeps, or a far less fragmented one, may take the planned
//!   source's role);
//! - `ready.rs`: getting a request's pages into the page cache before the
//!   kernel compares them (read-ahead advice; a read of our own when the
//!   data comes from disk);
//! - `verify.rs`: the dry run's byte compare;
//! - [`extents`]: the FIEMAP view of a range (which blocks already share
//!   the source's extents), also used by the `report` command;
//! - [`bookend`]: rewriting partly covered extents (btrfs);
//! - [`headroom`]: the free space those rewrites must leave.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, OnceLock};

use nix::errno::Errno;
use serde::Serialize;

use crate::errors::ErrorKind;
use crate::file::FileFacts;
use crate::file::{FileId, IdSet};
use crate::plan::Plan;
use crate::policy::SkipReason;
use crate::progress::Progress;
use crate::sys::beneath::Tree;

pub mod bookend;
mod executor;
pub mod extents;
pub mod headroom;
mod pinned;
mod ready;
mod refusal;
mod reopen;
mod swap;
mod unreadable;
mod verify;
mod workers;
pub mod zeros;

pub use bookend::PinReason;
pub(crate) use ready::prefetch_request;
pub use reopen::nocow_left;
pub(crate) use workers::add_span;
pub use workers::{default_workers, sharing, Sharing, IO_WORKERS, MAX_WORKERS};
use workers::{dest_coverage, on_workers, units, used_once, WorkerContext};

/// Whether to share for real.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Compare in user space, share nothing.
    DryRun,
    /// Submit to the kernel.
    Share,
}

/// Written zeros left as holes by the bookend pass, by file: `(offset,
/// length)` runs, sorted.
pub type Holed = BTreeMap<FileId, Vec<(u64, u64)>>;

/// What executing a plan did.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    /// Bytes verified equal (dry run) or submitted to the kernel.
    pub duplicate_bytes: u64,
    /// Bytes the kernel confirmed shared.
    pub deduped_bytes: u64,
    /// Bytes skipped because they already share the source's extents.
    pub already_shared_bytes: u64,
    /// How every request was answered, per destination.
    pub status: DedupeStatuses,
    /// Files that changed since the scan and were left alone.
    pub changed_files: u64,
    /// Files that could not be opened again, by why, when that is no
    /// failure (`SkipReason::of_reopen`: gone, or leased).
    pub skipped: BTreeMap<SkipReason, u64>,
    /// Files whose data is inline in metadata (btrfs): nothing to share.
    pub inline_files: u64,
    /// Whole-file groups shared from one of their copies instead of the
    /// planned source: a copy a file outside the plan (a read-only
    /// snapshot) keeps, or one far less fragmented (see `swap.rs`).
    pub swapped_sources: u64,
    /// Bytes of partly covered extents copied into fresh extents so the old
    /// ones can be freed (btrfs); in a dry run, what would be.
    pub rewritten_bytes: u64,
    /// Of those remainders, written zeros left as holes instead of copied
    /// (btrfs, unless `--keep-zeros`).
    pub zeros_to_holes_bytes: u64,
    /// Files with such zeros.
    pub zeros_to_holes_files: u64,
    /// Those zeros, by file (in a dry run, those that would be): the zero
    /// pass leaves them to this (a dry run's would count them twice).
    pub holed: Holed,
    /// Bytes planned into partly covered extents that stay on disk for
    /// their uncovered rest (btrfs): shared, but freeing nothing; by
    /// destination and why. Only files with such bytes, so it stays small.
    pub pinned: BTreeMap<(FileId, PinReason), u64>,
    /// Of the bytes pinned [`PinReason::BelowRewriteRatio`], what each of
    /// [`bookend::WHAT_IF_RATIOS`] would have freed and copied instead.
    pub rewrite_what_if: bookend::WhatIf,
    /// Parts of destinations, `(file, offset, length)`, the kernel found
    /// different from their source and did not share: two blocks whose
    /// 48-bit fingerprints collide (about N²/2⁴⁹ pairs for N blocks, ~130
    /// at 1 TiB of distinct data; see `blockmap::Fp`), or a file changed
    /// since its scan. On btrfs such a part
    /// keeps its whole old extent on disk once the rest of the file left
    /// it ([`bookend`] then rewrites it).
    pub differs: Vec<(FileId, u64, u64)>,
    /// Files whose recorded fingerprints were found stale: a range planned
    /// from them differed, and not by a fingerprint collision (see
    /// [`verify`]). The next run must read them again.
    pub stale: BTreeSet<FileId>,
    /// Files the kernel shared a range from: their extents now hold
    /// other files' blocks too (recorded: `Db::mark_sources`).
    pub sources: BTreeSet<FileId>,
    /// Destinations whose partly covered extents the bookend pass judged
    /// (rewritten or pinned): the database's account of what they pin is
    /// replaced by this run's.
    pub pin_checked: Vec<FileId>,
    /// Files that could not be opened or rewritten, by kind.
    pub errors: BTreeMap<ErrorKind, u64>,
    /// Set when sharing was stopped because the filesystem refuses it.
    pub refused: Option<String>,
    /// Destinations left for a later run — the filesystem was out of space
    /// (ENOSPC, EDQUOT), or their extents are pinned by a file outside the
    /// plan — with why and the bytes planned into them: the run records
    /// them in the database and the next run, incremental or not, plans
    /// them again.
    pub pending: BTreeMap<FileId, (Pending, u64)>,
    /// Of those, the destinations left whole for `--keep-free` themselves
    /// (not for a source that was): a dry run's later round previews the
    /// ranges into and from them (`pipeline::rounds`).
    pub kept_whole: BTreeSet<FileId>,
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
    /// Its remainders were not rewritten, to keep `--keep-free` of the
    /// volume free ([`headroom`]); as for [`Pending::NoSpaceRewrite`], its
    /// ranges wait too.
    KeepFree,
    /// The run may make no copy for its remainders: it may create files
    /// in none of its starting directories (root without `CAP_DAC_OVERRIDE`
    /// in a directory of another user, an immutable directory:
    /// [`crate::sys::beneath::NoScratch`]). As for
    /// [`Pending::NoSpaceRewrite`], its ranges wait too, for a run that may.
    RewriteNotAllowed,
    /// Its written zeros were not turned into holes: they share an extent
    /// with its data, whose copy would have taken the free space
    /// `--keep-free` keeps (`pipeline::zeros`), or the volume or a quota
    /// was full for the copy or the punch (`ENOSPC`, `EDQUOT`). Tried
    /// again by every run, not only the weekly full plan, until there is
    /// room.
    ZerosKeepFree,
    /// btrfs: its written zeros were not turned into holes because a file
    /// outside the run also holds their extent (a read-only snapshot, a
    /// clone outside the starting paths, excluded or `user.nodedup`), so
    /// letting go of them would free nothing. The newest holder of each
    /// such extent is recorded (`zeros_held`); the next run, incremental
    /// or not, tries the file again once one of them is gone (snapper
    /// deleted the snapshot) or changed, not every night.
    ZerosHeld,
    /// Another process held a lease on it when the zero pass opened it
    /// (see [`Pending::Leased`]): its zeros wait for the next run. Apart
    /// from `Leased`, whose row the pass must not drop when it gets in.
    ZerosLeased,
    /// Its written zeros share their disk space with many files of the run
    /// (a user's thousands of reflinked clones), and as many as a block of
    /// disk may be punched by in one run already let go of them
    /// (`pipeline::zeros::shared`, `may_compare`): each punch has the
    /// kernel compare the file's stretch. Tried again by the next run,
    /// which lets as many more go.
    ZerosManyClones,
    /// Another process held a lease on it, or on the source of its ranges,
    /// when the share phase opened it (a file server's oplock or
    /// delegation): opened `O_NONBLOCK`, it is not waited for.
    Leased,
}

impl Pending {
    /// Every reason (for label sets that must not lose a series).
    pub const ALL: [Pending; 10] = [
        Pending::NoSpaceRewrite,
        Pending::NoSpaceShare,
        Pending::Pinned,
        Pending::KeepFree,
        Pending::RewriteNotAllowed,
        Pending::ZerosKeepFree,
        Pending::ZerosHeld,
        Pending::ZerosLeased,
        Pending::ZerosManyClones,
        Pending::Leased,
    ];

    /// The zero pass's reasons: a file may have a row of one of these
    /// beside its sharing's (schema 15), and each pass replaces only its
    /// own.
    pub const ZEROS: [Pending; 4] =
        [Pending::ZerosKeepFree, Pending::ZerosHeld, Pending::ZerosLeased, Pending::ZerosManyClones];

    /// Name in the database and in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Pending::NoSpaceRewrite => "no_space_rewrite",
            Pending::NoSpaceShare => "no_space_share",
            Pending::Pinned => "referenced_outside_run",
            Pending::KeepFree => "keep_free",
            Pending::RewriteNotAllowed => "rewrite_not_allowed",
            Pending::ZerosKeepFree => "zeros_keep_free",
            Pending::ZerosHeld => "zeros_referenced_outside_run",
            Pending::ZerosLeased => "zeros_leased",
            Pending::ZerosManyClones => "zeros_many_clones",
            Pending::Leased => "leased",
        }
    }

    /// Whether the file waits for room: left whole because its copies had
    /// none (above `--keep-free`, or at all), so a later round of the same
    /// run, after sharing freed some, may share it (`pipeline::rounds`).
    pub const fn waits_for_room(self) -> bool {
        matches!(self, Pending::KeepFree | Pending::NoSpaceRewrite)
    }
}

/// Add `more` to `to`, ratio by ratio.
fn add_what_if(to: &mut bookend::WhatIf, more: &bookend::WhatIf) {
    for (t, m) in to.iter_mut().zip(more) {
        *t = (t.0 + m.0, t.1 + m.1);
    }
}

/// Out of space or quota: worth retrying once there is room.
fn no_space(e: Errno) -> bool {
    matches!(e, Errno::ENOSPC | Errno::EDQUOT)
}

/// How the kernel (or, in a dry run, our own compare) answered.
#[derive(Debug, Default, Clone, Serialize)]
pub struct DedupeStatuses {
    /// Destinations whose bytes were equal.
    pub same: u64,
    /// Destinations whose bytes differed: nothing shared.
    pub differs: u64,
    /// Destinations refused with an errno, by errno name.
    pub errors: BTreeMap<String, u64>,
}

/// Rewriting remainders of partly covered extents (btrfs; see [`bookend`]).
pub struct Bookends {
    /// Rewrite a remainder only when it is at most this many times the
    /// covered part of its extent.
    pub max_ratio: f64,
    /// Rewrite the rest of compressed extents too: only where the copy is
    /// compressed as well (`compress-force`). Elsewhere the copy may be
    /// written plain and take more room than the extent it frees
    /// (measured: 200 files compressed by `defragment -czstd`, 7.2 MiB
    /// lost instead of 6.2 MiB freed).
    pub rewrite_compressed: bool,
    /// What the copies may use of the volume's free space.
    pub room: headroom::Headroom,
    /// Written zeros in a remainder, in runs of at least this many bytes,
    /// are left as holes in the copy instead of copied: sharing the copy
    /// back turns them into holes, as the zero pass would after writing
    /// them once more (`None`: `--keep-zeros`).
    pub zero_holes: Option<u64>,
    /// Said once a run that a copy found no room (`ENOSPC`, `EDQUOT`):
    /// the report counts the files.
    said_no_space: std::sync::Once,
    /// Said once a run that no copy can be made at all
    /// ([`crate::sys::beneath::NoScratch`]), not for every file.
    said_no_scratch: std::sync::Once,
}

impl Bookends {
    /// The bookend pass for the btrfs volume holding `root`, keeping
    /// `keep` of it free (a dry run counts its copies against the same
    /// budget, measured once: see [`headroom`]).
    pub fn for_volume(
        max_ratio: f64,
        (keep, keep_zeros): (headroom::KeepFree, bool),
        mode: Mode,
        root: &std::path::Path,
    ) -> Bookends {
        Bookends {
            max_ratio,
            zero_holes: (!keep_zeros).then_some(zeros::MIN_BYTES),
            rewrite_compressed: crate::sys::mounts::compression_forced(root),
            room: headroom::Headroom::of_volume(root.to_owned(), keep, mode == Mode::DryRun),
            said_no_space: std::sync::Once::new(),
            said_no_scratch: std::sync::Once::new(),
        }
    }
}

/// Execute `plan` as `sharing` says (on how many threads, whether the data
/// comes from disk: see [`sharing`]). `stop` is polled between source ranges.
/// With `bookends`, partly covered destination extents are freed first. The
/// outcome does not depend on the workers: every file is checked, counted and
/// warned about once, whichever worker meets it first.
#[allow(clippy::too_many_arguments)]
pub fn execute(
    plan: &Plan,
    files: &HashMap<FileId, FileFacts>,
    unshared: &IdSet,
    tree: &Tree,
    block_size: u64,
    mode: Mode,
    bookends: Option<&Bookends>,
    progress: &dyn Progress,
    stop: &AtomicBool,
    sharing: Sharing,
) -> Outcome {
    let workers = sharing.workers;
    let ctx = WorkerContext {
        files,
        unshared,
        tree,
        can_share: OnceLock::new(),
        block_size,
        mode,
        progress,
        stop,
        bad: Mutex::new(HashSet::new()),
        leased: Mutex::new(HashSet::new()),
        inline: Mutex::new(HashSet::new()),
        unreadable: Mutex::new(HashSet::new()),
        refused: AtomicBool::new(false),
        deferred: Mutex::new(HashMap::new()),
        wait_for_sources: sharing.wait_for_sources,
        in_plan: files.values().map(|c| (c.key.volume, c.key.ino)).collect(),
        used_once: used_once(plan),
        solo: Mutex::new(BTreeMap::new()),
        from_disk: sharing.from_disk,
        request_bytes: sharing.request_bytes,
        across_owners: sharing.across_owners,
        pinned_too: sharing.pinned_too,
        leave_nocow: sharing.leave_nocow,
    };
    let mut out = Outcome::default();
    if let Some(b) = bookends {
        // Before any range is shared: a rewritten remainder may be the
        // source of other ranges, which must then share its new extent.
        // Destinations are independent of each other, so this pass runs on
        // the workers too.
        let dests = dest_coverage(plan);
        let batches: Vec<_> = dests.chunks(bookend::BATCH).collect();
        out.merge(on_workers(&ctx, workers, &batches, |_| None, |ex, batch| ex.free_bookends(batch, b)));
    }
    let source = |&(start, _): &(usize, usize)| Some(plan.ranges[start].src);
    out.merge(on_workers(&ctx, workers, &units(&plan.ranges), source, |ex, &(start, end)| {
        ex.run_unit(&plan.ranges[start..end])
    }));
    if let (Some(b), Mode::Share) = (bookends, mode) {
        // Parts found different stay in the old extent of their file,
        // which the rest of the file left: free it too.
        let failed = bookend::failed_parts(plan, std::mem::take(&mut out.differs));
        out.merge(on_workers(
            &ctx,
            workers,
            &failed,
            |_| None,
            |ex, (id, parts, covered)| ex.unpin_differing(*id, parts, *covered, b),
        ));
    }
    out
}

impl Outcome {
    /// Count `bytes` of destination `id` as pinned for `why`.
    fn pin(&mut self, id: FileId, why: PinReason, bytes: u64) {
        if bytes > 0 {
            *self.pinned.entry((id, why)).or_default() += bytes;
        }
    }

    /// Bytes shared but freeing nothing (btrfs), all files and reasons.
    pub fn pinned_bytes(&self) -> u64 {
        self.pinned.values().sum()
    }

    /// [`Outcome::pinned_bytes`] by reason.
    pub fn pinned_by_reason(&self) -> BTreeMap<PinReason, u64> {
        let mut out = BTreeMap::new();
        for (&(_, why), &n) in &self.pinned {
            *out.entry(why).or_default() += n;
        }
        out
    }

    /// Add what another worker did.
    pub fn merge(&mut self, o: Outcome) {
        self.duplicate_bytes += o.duplicate_bytes;
        self.deduped_bytes += o.deduped_bytes;
        self.already_shared_bytes += o.already_shared_bytes;
        self.status.same += o.status.same;
        self.status.differs += o.status.differs;
        for (k, n) in o.status.errors {
            *self.status.errors.entry(k).or_default() += n;
        }
        self.changed_files += o.changed_files;
        for (k, n) in o.skipped {
            *self.skipped.entry(k).or_default() += n;
        }
        self.inline_files += o.inline_files;
        self.swapped_sources += o.swapped_sources;
        self.rewritten_bytes += o.rewritten_bytes;
        self.zeros_to_holes_bytes += o.zeros_to_holes_bytes;
        self.zeros_to_holes_files += o.zeros_to_holes_files;
        for (id, h) in o.holed {
            let mine = self.holed.entry(id).or_default();
            mine.extend(h);
            mine.sort_unstable();
        }
        for (k, n) in o.pinned {
            *self.pinned.entry(k).or_default() += n;
        }
        add_what_if(&mut self.rewrite_what_if, &o.rewrite_what_if);
        self.pin_checked.extend(o.pin_checked);
        self.differs.extend(o.differs);
        self.stale.extend(o.stale);
        self.sources.extend(o.sources);
        for (k, n) in o.errors {
            *self.errors.entry(k).or_default() += n;
        }
        if self.refused.is_none() {
            self.refused = o.refused;
        }
        self.kept_whole.extend(o.kept_whole);
        for (id, (why, bytes)) in o.pending {
            let e = self.pending.entry(id).or_insert((why, 0));
            e.0 = e.0.min(why);
            e.1 += bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_outcomes_add_up() {
        let mut a = Outcome { duplicate_bytes: 1, deduped_bytes: 2, changed_files: 1, ..Default::default() };
        a.status.errors.insert("EIO".into(), 1);
        a.errors.insert(ErrorKind::Open, 2);
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
        b.errors.insert(ErrorKind::Read, 1);
        b.skipped.insert(SkipReason::Vanished, 2);
        a.skipped.insert(SkipReason::Vanished, 1);
        a.merge(b);
        assert_eq!(
            (a.duplicate_bytes, a.deduped_bytes, a.already_shared_bytes, a.changed_files, a.inline_files),
            (11, 22, 5, 1, 3)
        );
        assert_eq!((a.rewritten_bytes, a.status.same, a.status.differs), (7, 4, 1));
        assert_eq!(a.status.errors["EIO"], 3);
        assert_eq!((a.errors[&ErrorKind::Open], a.errors[&ErrorKind::Read]), (2, 1));
        assert_eq!(a.skipped[&SkipReason::Vanished], 3);
        assert_eq!(a.refused.as_deref(), Some("no"));
    }
}
