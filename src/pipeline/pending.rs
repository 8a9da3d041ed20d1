//! The work a run leaves for the next one (the database's `pending` rows),
//! recorded batch by batch with the bytes each destination pins, and shown
//! in the report by reason.
//!
//! A real run records it in the database ([`Db::save_pending`]) and reports
//! the table as it stands after the run. A dry run writes nothing, so it
//! applies the same updates to a copy in memory ([`Pending::Preview`]): its
//! report then says what the run would leave pending (e.g. the files
//! `--keep-free` would make wait), not what an earlier run left.

use std::collections::{BTreeMap, HashSet};
use std::os::fd::AsFd;

use anyhow::Result;

use crate::db::pending::{Holder, ZerosRow};
use crate::db::Db;
use crate::dedupe;
use crate::file::{FileFacts, FileId};
use crate::plan::Plan;
use crate::report::Report;
use crate::sys::beneath::Tree;

/// What the zero pass left of a batch of files.
#[derive(Default)]
pub(super) struct ZerosLeft {
    /// The files it went through.
    pub handled: Vec<FileId>,
    /// Files whose zeros wait for room (above `--keep-free`, or a full
    /// volume), with their bytes of zeros.
    pub waiting: Vec<(FileId, u64)>,
    /// Files whose zeros files outside the run hold: their bytes of
    /// zeros, and the newest holder of each such extent (subvolume id,
    /// inode, state), each once.
    pub held: Vec<(FileId, u64, Vec<Holder>)>,
    /// Files another process held a lease on, with their bytes of zeros.
    pub leased: Vec<(FileId, u64)>,
    /// Files that kept shared zeros many files of the run let go of first
    /// (`SharedZeros::may_compare`), with their bytes of zeros.
    pub many_clones: Vec<(FileId, u64)>,
}

/// A row of the `pending` table: destination, why, planned bytes.
pub(super) type PendingRow = (FileId, String, u64);

/// Where a run's pending work goes.
pub(super) enum Pending<'a> {
    /// The database, in a real run.
    Db(&'a Db, i64),
    /// A dry run's copy of the table (bytes by file and reason), updated
    /// as the run would update it.
    Preview(BTreeMap<(FileId, String), u64>),
}

impl<'a> Pending<'a> {
    /// The database of run `run_id`, or in a dry run a copy of its rows.
    pub(super) fn of(db: &'a Db, run_id: i64, dry_run: bool) -> Result<Pending<'a>> {
        Ok(if dry_run {
            Pending::Preview(db.pending()?.into_iter().map(|(id, why, bytes)| ((id, why), bytes)).collect())
        } else {
            Pending::Db(db, run_id)
        })
    }

    /// Record what sharing `plan` left pending (`o.pending`). The rows of
    /// the destinations it went through are replaced, but not the zero
    /// pass's ([`dedupe::Pending::ZEROS`]); a stopped run may not have
    /// reached every destination of the batch, so then it only adds.
    /// A real run also records the bytes each destination pins (`o.pinned`
    /// of the destinations in `o.pin_checked`), which a dry run does not.
    pub(super) fn batch(&mut self, plan: &Plan, o: &dedupe::Outcome, stopped: bool) -> Result<()> {
        let handled: HashSet<FileId> =
            if stopped { HashSet::new() } else { plan.ranges.iter().map(|r| r.dest).collect() };
        let now = o.pending.iter().map(|(id, (why, b))| (*id, why.name(), *b));
        let zeros = dedupe::Pending::ZEROS.map(|p| p.name());
        match self {
            Pending::Db(db, run_id) => {
                db.save_pending(&handled, zeros, &now.collect::<Vec<_>>(), *run_id)?;
                let pins: Vec<(FileId, &str, u64)> =
                    o.pinned.iter().map(|(&(id, why), &n)| (id, why.name(), n)).collect();
                db.save_pinned(&o.pin_checked, &pins, *run_id)?;
            }
            Pending::Preview(rows) => {
                rows.retain(|(id, why), _| !handled.contains(id) || zeros.contains(&why.as_str()));
                rows.extend(now.map(|(id, why, bytes)| ((id, why.to_owned()), bytes)));
            }
        }
        Ok(())
    }

    /// Record what the zero pass left: rows of its reasons for the files
    /// it went through dropped, then those waiting for room, held by a file
    /// outside the run, leased or past the bound on punches added, beside any sharing row of the file
    /// ([`Db::save_zeros_pending`]).
    pub(super) fn zeros(&mut self, left: &ZerosLeft) -> Result<()> {
        let reasons = dedupe::Pending::ZEROS.map(|p| p.name());
        let [room, held, leased, clones] = reasons;
        let rows: Vec<ZerosRow> = (left.waiting.iter().map(|&(id, b)| (id, room, b, &[][..])))
            .chain(left.held.iter().map(|(id, b, by)| (*id, held, *b, &by[..])))
            .chain(left.leased.iter().map(|&(id, b)| (id, leased, b, &[][..])))
            .chain(left.many_clones.iter().map(|&(id, b)| (id, clones, b, &[][..])))
            .collect();
        match self {
            Pending::Db(db, run_id) => db.save_zeros_pending(&left.handled, reasons, &rows, *run_id)?,
            Pending::Preview(rows_now) => {
                let handled: HashSet<&FileId> = left.handled.iter().collect();
                rows_now.retain(|(id, why), _| !handled.contains(id) || !reasons.contains(&why.as_str()));
                rows_now.extend(rows.into_iter().map(|(id, why, bytes, _)| ((id, why.to_owned()), bytes)));
            }
        }
        Ok(())
    }

    /// The rows after the run (or, in a dry run, as they would be).
    pub(super) fn rows(self) -> Result<Vec<PendingRow>> {
        Ok(match self {
            Pending::Db(db, _) => db.pending()?,
            Pending::Preview(rows) => rows.into_iter().map(|((id, why), bytes)| (id, why, bytes)).collect(),
        })
    }
}

/// The files an earlier run left pending (`rows`) that this run plans
/// again, even when nothing changed: those that ran out of space every
/// time (the space may be back); those whose extents a file outside the
/// plan kept only once FIEMAP no longer flags those extents shared (the
/// snapshot is gone); those whose zeros files outside the run hold only
/// once a holder recorded is gone or changed (its inode item is gone, or
/// its generation or change time differs: rewritten in place, its
/// `user.nodedup` removed, its number taken by a new file). Replanning a
/// still-pinned file's group every night would cost a nightly run as much
/// as the group; looking at a still-held file's zeros every night, a
/// backreference walk of each of its extents.
pub(super) fn retried(tree: &Tree, db: &Db, rows: &[PendingRow]) -> Result<Vec<FileId>> {
    let (pinned, held) = (dedupe::Pending::Pinned.name(), dedupe::Pending::ZerosHeld.name());
    let pinned_facts = db.file_facts(rows.iter().filter(|p| p.1 == pinned).map(|p| p.0))?;
    // Each `zeros_referenced_outside_run` row has its holders recorded
    // (`zeros_held`: the newest of each extent, so a file whose regions
    // two clones outside hold is retried when either lets go), asked
    // here; the row itself is never retried as is.
    let holders = db.zeros_holders()?;
    let volume = tree.root(0).map(|r| r.1);
    // Gone (no inode item, or its subvolume deleted), changed, never read,
    // or not readable now: tried again.
    let moved = |&((root, ino), was): &Holder| {
        volume.is_none_or(
            |fd| !matches!(crate::sys::btrfs_names::stamp(fd, root, ino), Ok(Some(now)) if Some(now) == was),
        )
    };
    let retry = |p: &&PendingRow| match &p.1 {
        w if w == pinned => !still_shared(tree, pinned_facts.get(&p.0)),
        w => w != held,
    };
    let rows = rows.iter().filter(retry).map(|p| p.0);
    Ok(rows.chain(holders.iter().filter(|h| moved(&h.1)).map(|h| h.0)).collect())
}

/// Whether the recorded file `c` still has an extent FIEMAP flags shared
/// (metadata only). A file that cannot be opened or mapped is retried.
fn still_shared(tree: &Tree, c: Option<&FileFacts>) -> bool {
    let Some(c) = c else { return false };
    let Ok(f) = tree.open_file(&c.path) else { return false };
    let mut shared = false;
    let mapped = crate::sys::fiemap::fiemap_each(f.as_fd(), 0, c.size.max(1), |e| {
        shared = e.is_shared();
        !shared
    });
    mapped.is_ok() && shared
}

/// Put the pending work into the report, by reason.
pub(super) fn set_pending(report: &mut Report, rows: &[PendingRow]) {
    report.pending.clear();
    report.pending_bytes = 0;
    for (_, why, bytes) in rows {
        let w = report.pending.entry(why.clone()).or_default();
        w.files += 1;
        w.bytes += bytes;
        report.pending_bytes += bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Range;

    fn row(id: i64, why: &str, bytes: u64) -> PendingRow {
        (FileId(id), why.to_owned(), bytes)
    }

    fn preview(rows: &[PendingRow]) -> Pending<'static> {
        Pending::Preview(rows.iter().map(|(id, why, b)| ((*id, why.clone()), *b)).collect())
    }

    /// A plan with destinations `dests`, and an outcome leaving `left` pending.
    fn batch(dests: &[i64], left: &[(i64, dedupe::Pending, u64)]) -> (Plan, dedupe::Outcome) {
        let r = |dest| Range { src: FileId(1), src_off: 0, len: 4096, dest: FileId(dest), dest_off: 0 };
        let mut o = dedupe::Outcome::default();
        o.pending.extend(left.iter().map(|&(id, why, b)| (FileId(id), (why, b))));
        (Plan { ranges: dests.iter().map(|&d| r(d)).collect() }, o)
    }

    #[test]
    fn a_dry_run_updates_its_copy_of_the_table_as_the_run_would() {
        // 7 and 8 were left pending by an earlier run, 7's zeros too; the
        // batch goes through 7 (shared now, not 8: its zeros' row is the
        // zero pass's to replace) and leaves 9 waiting.
        let z = "zeros_referenced_outside_run";
        let mut p = preview(&[row(7, "keep_free", 100), row(7, z, 8), row(8, "no_space_share", 50)]);
        let (plan, o) = batch(&[7, 9], &[(9, dedupe::Pending::KeepFree, 30)]);
        p.batch(&plan, &o, false).unwrap();
        assert_eq!(p.rows().unwrap(), vec![row(7, z, 8), row(8, "no_space_share", 50), row(9, "keep_free", 30)]);
    }

    #[test]
    fn a_stopped_batch_only_adds() {
        let mut p = preview(&[row(7, "keep_free", 100)]);
        let (plan, o) = batch(&[7, 9], &[(9, dedupe::Pending::KeepFree, 30)]);
        p.batch(&plan, &o, true).unwrap();
        assert_eq!(p.rows().unwrap(), vec![row(7, "keep_free", 100), row(9, "keep_free", 30)]);
    }

    /// The zero pass drops its own rows of the files it went through
    /// (7: freed now), keeps the sharing's (8), adds what waits (9, and 8
    /// beside its sharing row, which the report then counts too) and what
    /// a file outside the run holds (11: waiting for room before), what
    /// was leased (12) and what many clones let go of first (13).
    #[test]
    fn the_zero_pass_replaces_only_its_own_rows() {
        let z = "zeros_keep_free";
        let mut p = preview(&[row(7, z, 100), row(8, "no_space_share", 50), row(10, z, 5), row(11, z, 9)]);
        let left = ZerosLeft {
            handled: vec![FileId(7), FileId(8), FileId(9), FileId(11)],
            waiting: vec![(FileId(8), 20), (FileId(9), 30)],
            held: vec![(FileId(11), 40, vec![((300, 257), None), ((301, 258), None)])],
            leased: vec![(FileId(12), 50)],
            many_clones: vec![(FileId(13), 60)],
        };
        p.zeros(&left).unwrap();
        let held = "zeros_referenced_outside_run";
        assert_eq!(
            p.rows().unwrap(),
            vec![
                row(8, "no_space_share", 50),
                row(8, z, 20),
                row(9, z, 30),
                row(10, z, 5),
                row(11, held, 40),
                row(12, "zeros_leased", 50),
                row(13, "zeros_many_clones", 60)
            ]
        );
    }

    #[test]
    fn the_report_sums_by_reason() {
        let mut r = Report::default();
        set_pending(&mut r, &[row(1, "keep_free", 10), row(2, "keep_free", 5), row(3, "no_space_share", 1)]);
        assert_eq!((r.pending_bytes, r.pending["keep_free"].files, r.pending["keep_free"].bytes), (16, 2, 15));
    }
}
