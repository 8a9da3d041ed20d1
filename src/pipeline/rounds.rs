//! The share phase's batches, one after another, and once more for the
//! files `--keep-free` made wait, when sharing has freed room for them.
//!
//! A batch's bookend pass copies before its ranges are shared, and only
//! those ranges (then a commit) release the old extents. On a nearly full
//! volume the copies of a batch are therefore limited to what was free
//! above the reserve when it began, though sharing the batch then frees far
//! more (the whole-file copies, the extents its rewrites moved out of).
//! The files refused ([`dedupe::Pending::KeepFree`]) are planned again with
//! their groups, as the next run would plan them, and shared once more with
//! the budget measured anew ([`dedupe::headroom::Headroom::measure_again`]):
//! a round at a time, while the last one shared something, at most
//! [`MAX_ROUNDS`]. Files already shared by then are found so (FIEMAP) and
//! skipped, as by the next run. Until the last round, ranges whose source
//! was left whole wait with it (`dedupe::Sharing::wait_for_sources`):
//! shared from its old extent, a copy would keep that extent for good. The
//! last round (no room came of the one before, or [`MAX_ROUNDS`] reached)
//! shares them from it after all, as every run did before. A dry run measures its budget once, so it
//! has no second round: a run can do more than its preview said.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};

use super::batches::Batches;
use super::pending::Pending;
use super::Job;
use crate::config::ShareConfig;
use crate::db::Db;
use crate::dedupe::{self, Mode};
use crate::file::{FileId, IdSet};
use crate::plan::{Limits, PlanStats};
use crate::progress::Progress;
use crate::sys::beneath::Tree;

/// Rounds after the first, at most: each needs a plan of the files still
/// waiting and frees less room than the one before (its copies are taken
/// from what the last freed).
pub(super) const MAX_ROUNDS: usize = 4;

/// Plans the files that waited again: their batches and totals.
pub(super) type Replan<'a> = dyn Fn(&HashSet<FileId>) -> Result<(Batches, PlanStats)> + 'a;

/// What every batch is shared with.
pub(super) struct With<'a> {
    pub db: &'a Db,
    pub tree: &'a Tree,
    pub block_size: u64,
    pub mode: Mode,
    pub bookends: Option<&'a dedupe::Bookends>,
    pub sharing: dedupe::Sharing,
    pub progress: &'a dyn Progress,
    pub stop: &'a AtomicBool,
}

/// The batches shared so far, and what they did.
pub(super) struct Rounds<'a> {
    with: With<'a>,
    /// Where each batch's pending work and pinned bytes are recorded.
    pub pending: Pending<'a>,
    /// Totals over the batches; what is per file went to `pending`.
    pub out: dedupe::Outcome,
    /// Bytes shared but pinned (btrfs), by reason.
    pub pinned_by_reason: BTreeMap<dedupe::PinReason, u64>,
    /// Destinations the last round left waiting for `--keep-free`.
    waiting: HashSet<FileId>,
}

impl<'a> Rounds<'a> {
    /// Nothing shared yet; pending work recorded to `pending`.
    pub(super) fn new(mut with: With<'a>, pending: Pending<'a>) -> Rounds<'a> {
        // While another round may follow ([`Rounds::again`]).
        with.sharing.wait_for_sources = with.mode == Mode::Share && with.bookends.is_some();
        let (out, pinned_by_reason, waiting) = Default::default();
        Rounds { with, pending, out, pinned_by_reason, waiting }
    }

    /// Whether to go on: not stopped, and the filesystem did not refuse.
    pub(super) fn go_on(&self) -> bool {
        !self.with.stop.load(Ordering::Relaxed) && self.out.refused.is_none()
    }

    /// Share (or verify) `batches`, batch by batch: each batch's files are
    /// independent of the others' (see `plan::from_db`), and only one
    /// batch's facts are in memory. `unshared`: files the scan found
    /// sharing no extent (not mapped again).
    pub(super) fn share(&mut self, batches: Batches, unshared: &IdSet) -> Result<()> {
        batches.for_each(|plan| {
            let w = &self.with;
            let files = w.db.file_facts(plan.files())?;
            let mut o = dedupe::execute(
                plan,
                &files,
                unshared,
                w.tree,
                w.block_size,
                w.mode,
                w.bookends,
                w.progress,
                w.stop,
                w.sharing,
            );
            // Found stale: the next run reads them again (a dry run too).
            w.db.distrust(&o.stale)?;
            self.pending.batch(plan, &o, w.stop.load(Ordering::Relaxed))?;
            // What is per file is recorded now; the report needs totals.
            for (why, n) in o.pinned_by_reason() {
                *self.pinned_by_reason.entry(why).or_default() += n;
            }
            let kept_free = o.pending.iter().filter(|(_, (why, _))| *why == dedupe::Pending::KeepFree);
            self.waiting.extend(kept_free.map(|(id, _)| *id));
            (o.pinned, o.pending, o.pin_checked) = Default::default();
            self.out.merge(o);
            Ok(self.go_on())
        })
    }

    /// The rounds after the first (see the module doc): the files left
    /// waiting are planned by `replan` and shared again, while the last
    /// round shared something.
    pub(super) fn again(&mut self, replan: &Replan<'_>) -> Result<()> {
        let Some(b) = self.with.bookends.filter(|_| self.with.mode == Mode::Share) else { return Ok(()) };
        // What a round finds already shared is what the rounds before it
        // shared (a waiting file's ranges were not submitted): not counted
        // twice.
        let already = self.out.already_shared_bytes;
        let mut shared_before = 0;
        for round in 0..=MAX_ROUNDS {
            let waiting = std::mem::take(&mut self.waiting);
            if waiting.is_empty() || !self.go_on() {
                break;
            }
            if self.out.deduped_bytes == shared_before || round == MAX_ROUNDS {
                // No room came of the last round, or this is the last: the
                // copies that waited for a source left whole are shared
                // from its old extent after all (`Sharing::wait_for_sources`).
                if !self.with.sharing.wait_for_sources {
                    break;
                }
                self.with.sharing.wait_for_sources = false;
            }
            shared_before = self.out.deduped_bytes;
            let (batches, stats) = replan(&waiting)?;
            self.with.progress.finish_phase("");
            let what = format!("3/3 share: again, {} files --keep-free made wait", waiting.len());
            self.with.progress.phase(&what, Some(stats.bytes), true);
            b.room.measure_again();
            // Mapped whatever the scan found: this run shared some since.
            self.share(batches, &IdSet::new())?;
        }
        self.out.already_shared_bytes = already;
        Ok(())
    }
}

/// Plan the files in `waiting` again, with their groups, as an incremental
/// run plans the files an earlier run left pending.
pub(super) fn replan(
    job: &Job,
    cfg: &ShareConfig,
    db: &Db,
    allowed: &IdSet,
    waiting: &HashSet<FileId>,
) -> Result<(Batches, PlanStats)> {
    let limits = Limits::for_run();
    let mut batches = Batches::for_limits(&limits);
    let stats = crate::plan::from_db_with(db, allowed, Some(waiting), super::plan_options(job, cfg), limits, |plan| {
        batches.push(plan).context("cannot keep the plan in a temporary file")
    })?;
    Ok((batches, stats))
}
