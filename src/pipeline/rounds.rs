//! The share phase's batches, one after another, and once more for the
//! files that waited for room (`--keep-free`, or a full volume or quota:
//! [`dedupe::Pending::waits_for_room`]), when sharing has freed some.
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
//! was left whole wait with it (`dedupe::Sharing::wait_for_sources`, in a
//! dry run too):
//! shared from its old extent, a copy would keep that extent for good. The
//! last round (no room came of the one before, or [`MAX_ROUNDS`] reached)
//! shares them from it after all, as every run did before.
//!
//! A dry run has the same rounds, so that it previews what the run would
//! do: its budget, measured once, is credited after each batch with what
//! sharing the batch would free ([`dedupe::headroom::Headroom::credit`]),
//! and a later round verifies only the ranges into or from the files left
//! whole in the round before (`Outcome::kept_whole`): those are the ranges
//! that waited; nothing was shared, so FIEMAP would not tell the others
//! apart. Where no room comes, the run's last round shares copies into the
//! old extent of a file left whole, and the round after finds that extent
//! shared and the file's own repeats free to share into it (freeing
//! nothing); the preview, which changed nothing, has the file wait.

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
use crate::plan::{Limits, Plan, PlanStats};
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
    /// Of those, the ones left whole themselves, not for their source.
    kept_whole: HashSet<FileId>,
}

impl<'a> Rounds<'a> {
    /// Nothing shared yet; pending work recorded to `pending`.
    pub(super) fn new(mut with: With<'a>, pending: Pending<'a>) -> Rounds<'a> {
        // While another round may follow ([`Rounds::again`]).
        with.sharing.wait_for_sources = with.bookends.is_some();
        let (out, pinned_by_reason, waiting, kept_whole) = Default::default();
        Rounds { with, pending, out, pinned_by_reason, waiting, kept_whole }
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
        self.share_only(batches, unshared, None)
    }

    /// [`Rounds::share`], or, given what waited in a dry run's round
    /// before, of only the ranges that waited: the rest was previewed.
    fn share_only(&mut self, batches: Batches, unshared: &IdSet, waited: Option<&Waited<'_>>) -> Result<()> {
        batches.for_each(|plan| {
            match waited {
                None => self.share_plan(plan, unshared, true)?,
                Some(waited) => {
                    let (into, from) = waited.split(plan);
                    self.share_plan(&into, unshared, true)?;
                    // Their destinations' extents were judged before.
                    if self.go_on() {
                        self.share_plan(&from, unshared, false)?;
                    }
                }
            }
            Ok(self.go_on())
        })
    }

    /// Share (or verify) one batch's `plan`; with `judge`, its
    /// destinations' partly covered extents too (the bookend pass).
    fn share_plan(&mut self, plan: &Plan, unshared: &IdSet, judge: bool) -> Result<()> {
        if plan.ranges.is_empty() {
            return Ok(());
        }
        let w = &self.with;
        let files = w.db.file_facts(plan.files())?;
        let bookends = w.bookends.filter(|_| judge);
        let mut o = dedupe::execute(
            plan,
            &files,
            unshared,
            w.tree,
            w.block_size,
            w.mode,
            bookends,
            w.progress,
            w.stop,
            w.sharing,
        );
        // Found stale: the next run reads them again (a dry run too).
        w.db.distrust(&o.stale)?;
        w.db.mark_sources(&std::mem::take(&mut o.sources))?;
        self.pending.batch(plan, &o, w.stop.load(Ordering::Relaxed))?;
        // What is per file is recorded now; the report needs totals.
        for (why, n) in o.pinned_by_reason() {
            *self.pinned_by_reason.entry(why).or_default() += n;
        }
        let for_room = o.pending.iter().filter(|(_, (why, _))| why.waits_for_room());
        self.waiting.extend(for_room.map(|(id, _)| *id));
        self.kept_whole.extend(std::mem::take(&mut o.kept_whole));
        if let (Some(b), Mode::DryRun) = (w.bookends, w.mode) {
            b.room.credit(would_free(&o));
        }
        (o.pinned, o.pending, o.pin_checked) = Default::default();
        self.out.merge(o);
        Ok(())
    }

    /// The rounds after the first (see the module doc): the files left
    /// waiting are planned by `replan` and shared again, while the last
    /// round shared something.
    pub(super) fn again(&mut self, replan: &Replan<'_>) -> Result<()> {
        let Some(b) = self.with.bookends else { return Ok(()) };
        let dry = self.with.mode == Mode::DryRun;
        // What a round finds already shared is what the rounds before it
        // shared (a waiting file's ranges were not submitted): not counted
        // twice. A dry run's later rounds verify only the waiting files.
        let already = self.out.already_shared_bytes;
        let shared = |o: &dedupe::Outcome| if dry { o.duplicate_bytes } else { o.deduped_bytes };
        let mut shared_before = 0;
        for round in 0..=MAX_ROUNDS {
            let waiting = std::mem::take(&mut self.waiting);
            let kept_whole = std::mem::take(&mut self.kept_whole);
            if waiting.is_empty() || !self.go_on() {
                break;
            }
            // Whether the round before left the copies of files left whole
            // waiting too (a dry run previews them now).
            let copies_waited = self.with.sharing.wait_for_sources;
            if shared(&self.out) == shared_before || round == MAX_ROUNDS {
                // No room came of the last round, or this is the last: the
                // copies that waited for a source left whole are shared
                // from its old extent after all (`Sharing::wait_for_sources`).
                if !self.with.sharing.wait_for_sources {
                    break;
                }
                self.with.sharing.wait_for_sources = false;
            }
            shared_before = shared(&self.out);
            let (batches, stats) = replan(&waiting)?;
            self.with.progress.finish_phase("");
            let verb = if dry { "verify" } else { "share" };
            let what = format!("3/3 {verb}: again, {} files that waited for room", waiting.len());
            self.with.progress.phase(&what, Some(stats.bytes), true);
            b.room.measure_again();
            if !dry {
                // What the rounds before freed is free after a commit (the
                // budget's measurement commits too, but `--keep-free 0` has
                // none).
                if let Some((_, fd, _)) = self.with.tree.root(0) {
                    let _ = crate::sys::commit(fd);
                }
            }
            let waited = Waited { kept_whole: &kept_whole, copies_too: copies_waited };
            // Mapped whatever the scan found: this run shared some since.
            self.share_only(batches, &IdSet::new(), dry.then_some(&waited))?;
        }
        if !dry {
            self.out.already_shared_bytes = already;
        }
        Ok(())
    }
}

/// What waited in a dry run's round, to preview in the next.
struct Waited<'a> {
    /// The destinations left whole themselves (`Outcome::kept_whole`).
    kept_whole: &'a HashSet<FileId>,
    /// Whether the ranges from them waited too
    /// (`dedupe::Sharing::wait_for_sources`).
    copies_too: bool,
}

impl Waited<'_> {
    /// Of `plan`, the ranges into the files left whole, and those from
    /// them into others (when they waited too).
    fn split(&self, plan: &Plan) -> (Plan, Plan) {
        let (mut into, mut from) = (Plan::default(), Plan::default());
        for r in &plan.ranges {
            if self.kept_whole.contains(&r.dest) {
                into.ranges.push(*r);
            } else if self.copies_too && self.kept_whole.contains(&r.src) {
                from.ranges.push(*r);
            }
        }
        (into, from)
    }
}

/// What sharing the ranges a dry run verified would free (btrfs), as the
/// run's next measurement would find it: the destinations' extents that
/// no part stays in, the rewritten remainders' included; not the bytes
/// shared into extents that stay (pinned). Logical bytes.
fn would_free(o: &dedupe::Outcome) -> u64 {
    (o.duplicate_bytes + o.rewritten_bytes + o.zeros_to_holes_bytes).saturating_sub(o.pinned_bytes())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Range;

    fn range(src: i64, dest: i64) -> Range {
        Range { src: FileId(src), src_off: 0, len: 4096, dest: FileId(dest), dest_off: 0 }
    }

    #[test]
    fn a_dry_runs_later_round_previews_only_what_waited() {
        // 1 was left whole; 3 was shared from 2 in the round before.
        let plan = Plan { ranges: vec![range(1, 1), range(1, 3), range(2, 1), range(2, 3)] };
        let kept_whole: HashSet<FileId> = [FileId(1)].into();
        let (into, from) = Waited { kept_whole: &kept_whole, copies_too: true }.split(&plan);
        assert_eq!(into.ranges, vec![range(1, 1), range(2, 1)]);
        // 3 was judged before: its range from 1 is verified, not judged again.
        assert_eq!(from.ranges, vec![range(1, 3)]);
        // The last round shared copies from files left whole: none waited.
        let (into, from) = Waited { kept_whole: &kept_whole, copies_too: false }.split(&plan);
        assert_eq!((into.ranges.len(), from.ranges.len()), (2, 0));
    }

    #[test]
    fn a_batch_would_free_what_it_shares_and_moves_out_but_not_what_stays() {
        let mut o = dedupe::Outcome { duplicate_bytes: 100, rewritten_bytes: 30, ..Default::default() };
        assert_eq!(would_free(&o), 130);
        o.pinned.insert((FileId(1), dedupe::PinReason::BelowRewriteRatio), 40);
        assert_eq!(would_free(&o), 90);
    }
}
