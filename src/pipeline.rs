//! The pipeline of one run, phase by phase:
//!
//! ```text
//! 1/3 scan: crawl ══► hash (rayon) ──► db writer   2/3 plan   3/3 share   ──► report
//!        (the crawler thread feeds the hashing pool as it finds files)
//! ```
//!
//! [`run`] reads top to bottom: each phase is a function returning what it
//! found ([`ScanOutcome`], [`PlanOutcome`], [`ShareOutcome`]); the run's
//! [`Report`] is built from those in one place, [`report`]. Each phase
//! reports through [`Progress`] how much work remains.

mod batches;
mod complete;
mod fingerprints;
mod freespace;
mod pending;
mod rounds;
mod scan;
mod zeros;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, Result};

use crate::config::{ScanConfig, ShareConfig};
use crate::db::Db;
use crate::dedupe::{self, Mode};
use crate::display::{display_path, human};
use crate::plan::{Limits, Plan, PlanOptions, PlanStats};
use crate::policy::{Policy, SkipReason};
use crate::progress::Progress;

use crate::file::{FileFacts, FileId, IdSet};
use crate::report::{List, Listed, ListedRange, Report, RewriteWhatIf};
use crate::sys::beneath::Tree;
use crate::sys::FsKind;
use batches::Batches;
use complete::Complete;
use fingerprints::check_fingerprints;
use freespace::{Before, FreeSpace, Freed};
use pending::{set_pending, Pending, PendingRow};
use rounds::Rounds;
use scan::{scan_phase, ScanOutcome};
use zeros::{ZeroPass, ZerosOutcome};

/// Scan `scan.paths` into the database at `db_path`, then, with `share`,
/// plan and share (or verify, in a dry run). `stop` is set by
/// SIGINT/SIGTERM or `--max-runtime`: the run finishes its current batch,
/// commits and reports.
pub fn run(
    db_path: &Path,
    scan: &ScanConfig,
    share: Option<&ShareConfig>,
    progress: &dyn Progress,
    stop: &AtomicBool,
) -> Result<Report> {
    // A database error says which database and what to do about it.
    run_inner(db_path, scan, share, progress, stop).map_err(|e| crate::db::explain::explain_db_error(db_path, e))
}

/// What every phase of one run reads.
struct Job<'a> {
    db_path: &'a Path,
    scan: &'a ScanConfig,
    share: Option<&'a ShareConfig>,
    policy: Policy,
    /// The starting paths, held open for the whole run: every directory
    /// and file below them is opened relative to these (sys::beneath),
    /// never by resolving a full path again.
    tree: Tree,
}

impl Job<'_> {
    /// The starting paths, escaped, for messages and the report.
    fn paths(&self) -> Vec<String> {
        self.scan.paths.iter().map(|p| display_path(p)).collect()
    }

    /// The command, as the report and the run history name it.
    fn command(&self) -> &'static str {
        if self.share.is_some() {
            "run"
        } else {
            "scan"
        }
    }

    /// Whether nothing is to be shared, only verified.
    fn dry_run(&self) -> bool {
        self.share.is_some_and(|s| s.dry_run)
    }
}

/// [`run`], with database errors not yet explained.
fn run_inner(
    db_path: &Path,
    scan: &ScanConfig,
    share: Option<&ShareConfig>,
    progress: &dyn Progress,
    stop: &AtomicBool,
) -> Result<Report> {
    let t0 = Instant::now();
    // Config dropped them; the run goes on as if each was given once.
    for (dropped, covering) in &scan.overlapping {
        progress.warn_run(&if dropped == covering {
            format!("{}: given twice, scanned once", display_path(dropped))
        } else if !dropped.starts_with(covering) {
            format!(
                "{}: the same directory as {} or one inside it, through a bind mount; scanned once as part of it",
                display_path(dropped),
                display_path(covering)
            )
        } else {
            format!("{}: inside {}, scanned once as part of it", display_path(dropped), display_path(covering))
        });
    }
    // The database first: btrfs lists from a directory descriptor only the
    // entries that existed when it was opened, so a database inside the tree
    // is then listed; the policy, built once it is open, knows its directory
    // and leaves its files (those SQLite makes later too) out from run one.
    let db = Db::open(db_path, &scan.fs.uuid)?.on_device(scan.device.as_deref())?;
    let tree = Tree::open(&scan.paths).with_context(|| {
        format!("cannot open {}", scan.paths.iter().map(|p| display_path(p)).collect::<Vec<_>>().join(", "))
    })?;
    let policy = Policy::with_excludes(scan.excludes.clone(), Some(&db.own_files()))
        .including(scan.include_readonly_snapshots, scan.include_nocow);
    let job = Job { db_path, scan, share, policy, tree };
    let run_id = db.begin_run(job.command(), job.dry_run())?;
    check_fingerprints(&job, &db, progress)?;

    let (db, scanned) = scan_phase(&job, db, run_id, progress, stop)?;
    crate::sys::limits::trim_heap();
    let mut planned = None;
    let mut sharing = None;
    if let Some(cfg) = share.filter(|_| !scanned.interrupted) {
        let (mut plan, free_before) = plan_phase(&job, cfg, &db, &scanned, progress)?;
        if let Some(p) = plan.planned.as_mut() {
            let batches = std::mem::take(&mut p.batches);
            sharing = Some(share_phase(
                &job,
                cfg,
                &db,
                run_id,
                (batches, &p.stats, p.fresh.as_ref()),
                (&scanned.seen, &scanned.unshared),
                free_before,
                progress,
                stop,
            )?);
        }
        planned = Some(plan);
    }
    // A real run that went through all of its plan, or found nothing new
    // to plan: what it hashed need not be planned again.
    if let Some(cfg) = share.filter(|_| !job.dry_run() && !scanned.interrupted) {
        let went_through = match (&planned, &sharing) {
            (_, Some(s)) => s.went_through(),
            (Some(p), None) => p.planned.is_none(),
            (None, None) => false,
        };
        if let (true, Some(p)) = (went_through, &planned) {
            complete::record(&db, Complete::new(run_id, &job.scan.paths, plan_settings(cfg), p.base))?;
        }
    }
    let report = report(&job, &scanned, planned.as_ref(), sharing.as_ref(), ms(t0));
    // Without its `--list`: a list is as long as the plan (FULL's: 27 MB).
    db.finish_run(run_id, &serde_json::to_string(&report.without_list())?)?;
    if !report.interrupted {
        db.compact(progress);
    }
    Ok(report)
}

/// The settings a plan depends on beyond the files, as one string: a run
/// with other ones (a lower `--min-range` after a cautious first run) plans
/// every file, not only those new since the last complete run, which was
/// matched under the old settings (see [`complete`]).
fn plan_settings(cfg: &ShareConfig) -> String {
    format!(
        "min_range={} rewrite_ratio={} share_snapshotted={} keep_zeros={}",
        cfg.min_range, cfg.rewrite_ratio, cfg.share_snapshotted, cfg.keep_zeros
    )
}

/// What the plan phase found.
struct PlanOutcome {
    /// Work earlier runs left pending, as the plan started.
    pending: Vec<PendingRow>,
    /// `None` when nothing is new since the last complete run.
    planned: Option<Planned>,
    /// What it built on.
    base: complete::Base,
    plan_ms: u64,
}

/// A plan, in batches (the share phase takes them), and what it came to.
struct Planned {
    batches: Batches,
    stats: PlanStats,
    /// `--list`: every range, named.
    listed: Option<Listed>,
    /// Incremental: the files planned (hashed since the last complete run,
    /// or pending); `None`: every file seen.
    fresh: Option<HashSet<FileId>>,
}

/// Phase 2: plan from the database. Free space before sharing is measured
/// meanwhile, on another thread (returned): the two syncfs calls wait on
/// the disk (~0.2 s on FULL/btrfs) and the plan only reads the database,
/// so nothing we do changes the volume in between.
fn plan_phase(
    job: &Job,
    cfg: &ShareConfig,
    db: &Db,
    scanned: &ScanOutcome,
    progress: &dyn Progress,
) -> Result<(PlanOutcome, Option<FreeSpace>)> {
    let t = Instant::now();
    progress.phase("2/3 plan", None, false);
    // Files of this run, as recorded (the facts they were hashed under).
    let allowed = &scanned.seen;
    // Incremental: everything hashed before the last complete sharing run
    // that saw all this run sees, with its settings, was matched then; plan
    // only the groups that hold a newer file (unless that is old: see there).
    let paths = (&job.scan.paths[..], &plan_settings(cfg)[..]);
    let base = complete::base(db, paths, (job.scan.incremental, cfg.full_plan_days), progress)?;
    // Files an earlier run left pending are planned again, even when
    // nothing changed (see `pending::retried`).
    let pending = db.pending()?;
    let retried = pending::retried(&job.tree, db, &pending)?;
    let fresh = match base.run() {
        Some(last) => Some(
            // Hashed since (this run's files included), by the database.
            (db.hashed_after(last)?.into_iter())
                .chain(retried)
                .filter(|&id| allowed.contains(id))
                .collect::<HashSet<_>>(),
        ),
        None => None,
    };
    if fresh.as_ref().is_some_and(|f| f.is_empty()) {
        progress.finish_phase("2/3 plan: nothing new since the last complete run");
        return Ok((PlanOutcome { pending, planned: None, base, plan_ms: ms(t) }, None));
    }
    let opts = plan_options(job, cfg);
    let root = job.scan.paths.first().expect("a path");
    let free_before = (!cfg.dry_run && job.scan.fs.kind != FsKind::Other).then(|| FreeSpace::start(root.clone()));
    let limits = Limits::for_run();
    let tiny = limits.is_tiny();
    let mut batches = Batches::for_limits(&limits);
    let mut listing = job.share.is_some_and(|s| s.list).then(|| List::for_limits(tiny));
    let stats = crate::plan::from_db_with(db, allowed, fresh.as_ref(), opts, limits, |plan: Plan| -> Result<()> {
        if let Some(listing) = listing.as_mut() {
            for r in listed_ranges(&plan, &db.file_facts(plan.files())?) {
                listing.push(r).context("cannot keep the list of ranges in a temporary file")?;
            }
        }
        batches.push(plan).context("cannot keep the plan in a temporary file")
    })?;
    let listed = listing.map(List::finish).transpose().context("cannot keep the list of ranges")?;
    progress.finish_phase(&format!(
        "2/3 plan: {} ranges, {} duplicate ({} whole-file groups)",
        stats.ranges,
        human(stats.bytes),
        stats.whole_groups
    ));
    if stats.split_components > 0 {
        let n = stats.split_components;
        progress.info(&format!("{n} group(s) of files planned in parts around their largest file, for memory"));
    }
    let planned = Some(Planned { batches, stats, listed, fresh });
    Ok((PlanOutcome { pending, planned, base, plan_ms: ms(t) }, free_before))
}

/// How to plan under `cfg`.
fn plan_options(job: &Job, cfg: &ShareConfig) -> PlanOptions {
    PlanOptions {
        block_size: job.scan.block_size,
        min_blocks: (cfg.min_range / job.scan.block_size).max(1),
        rewrite_ratio: cfg.rewrite_ratio,
        ..Default::default()
    }
}

/// What the share phase did.
enum ShareOutcome {
    /// Not on btrfs or XFS: scanned and reported, nothing shared.
    Refused(String),
    /// The executor went through the plan (or was stopped). Boxed: it is
    /// large and made once per run.
    Executed(Box<Executed>),
}

/// What the executor did, and what the share phase measured around it.
struct Executed {
    /// Totals over the batches; what is per file went to the database.
    out: dedupe::Outcome,
    /// Bytes shared but pinned (btrfs), by reason.
    pinned_by_reason: BTreeMap<dedupe::PinReason, u64>,
    /// Free space after minus before, and who else changed the volume
    /// meanwhile (real runs).
    freed: Option<Freed>,
    /// Pending work after this run (in a dry run, as it would be).
    pending: Vec<PendingRow>,
    /// Stopped while sharing.
    interrupted: bool,
    /// Written zero blocks turned into holes (`None`: `--keep-zeros`, or
    /// sharing stopped before).
    zeros: Option<ZerosOutcome>,
    share_ms: u64,
}

impl ShareOutcome {
    /// Whether the executor went through all of the plan: not stopped, and
    /// the filesystem did not refuse sharing.
    fn went_through(&self) -> bool {
        match self {
            ShareOutcome::Refused(_) => false,
            ShareOutcome::Executed(e) => !e.interrupted && e.out.refused.is_none(),
        }
    }
}

/// Phase 3: share (or, in a dry run, verify) what `planned` found.
/// `unshared`: files the scan found sharing no extent (not mapped again).
#[allow(clippy::too_many_arguments)]
fn share_phase(
    job: &Job,
    cfg: &ShareConfig,
    db: &Db,
    run_id: i64,
    (batches, stats, fresh): (Batches, &PlanStats, Option<&HashSet<FileId>>),
    (allowed, unshared): (&IdSet, &IdSet),
    free_before: Option<FreeSpace>,
    progress: &dyn Progress,
    stop: &AtomicBool,
) -> Result<ShareOutcome> {
    let t = Instant::now();
    let mode = if cfg.dry_run { Mode::DryRun } else { Mode::Share };
    let fs = &job.scan.fs;
    if mode == Mode::Share && fs.kind == FsKind::Other {
        let why = format!(
            "{} is not on btrfs or XFS (filesystem magic {:#x}): scanned and reported, nothing shared",
            job.paths().join(", "),
            fs.magic
        );
        progress.warn_run(&why);
        return Ok(ShareOutcome::Refused(why));
    }
    let before = free_before.map(FreeSpace::wait).transpose()?;
    progress.phase(if cfg.dry_run { "3/3 verify" } else { "3/3 share" }, Some(stats.bytes), true);
    let root = job.scan.paths.first().expect("a path");
    // With --rewrite-ratio 0 the pass still runs: it rewrites nothing but
    // counts what stays pinned.
    let bookends = (fs.kind == FsKind::Btrfs)
        .then(|| dedupe::Bookends::for_volume(cfg.rewrite_ratio, (cfg.keep_free, cfg.keep_zeros), mode, root));
    let (block_size, bookends) = (job.scan.block_size, bookends.as_ref());
    let sharing = sharing(job, stats, progress);
    let pending = Pending::of(db, run_id, cfg.dry_run)?;
    let with = rounds::With { db, tree: &job.tree, block_size, mode, bookends, sharing, progress, stop };
    let mut rounds = Rounds::new(with, pending);
    rounds.share(batches, unshared)?;
    rounds.again(&|waiting| rounds::replan(job, cfg, db, allowed, waiting))?;
    let go_on = rounds.go_on();
    let Rounds { out, pinned_by_reason, mut pending, .. } = rounds;
    // The zero pass's copies see the room the sharing freed, however
    // recently a copy was refused.
    bookends.inspect(|b| b.room.measure_again());
    let zeros = ZeroPass::of(job, cfg, bookends)
        .filter(|_| go_on)
        .map(|z| z.run(db, (allowed, fresh, &out.holed), &mut pending, progress, stop));
    if let Some(r) = &out.refused {
        progress.warn_run(r);
    }
    let freed = before.and_then(|b| measure_freed(b, root, progress));
    progress.finish_phase(&format!(
        "3/3 {}: {} {}",
        if cfg.dry_run { "verify" } else { "share" },
        human(if cfg.dry_run { out.duplicate_bytes } else { out.deduped_bytes }),
        if cfg.dry_run { "verified duplicate" } else { "shared" }
    ));
    Ok(ShareOutcome::Executed(Box::new(Executed {
        out,
        pinned_by_reason,
        freed,
        pending: pending.rows()?,
        interrupted: stop.load(Ordering::Relaxed),
        zeros: zeros.transpose()?,
        share_ms: ms(t),
    })))
}

/// How to run the share phase ([`dedupe::sharing`]); said with `-v` when
/// the data to compare will be read from disk.
fn sharing(job: &Job, stats: &PlanStats, progress: &dyn Progress) -> dedupe::Sharing {
    // Each source range is compared with each destination: up to twice the planned bytes are read.
    let sharing = dedupe::Sharing {
        across_owners: job.scan.share_across_owners,
        pinned_too: job.share.is_some_and(|s| s.share_snapshotted),
        leave_nocow: job.scan.leaves_nocow(),
        ..dedupe::sharing(stats.bytes.saturating_mul(2), job.scan.drop_cache)
    };
    if sharing.from_disk {
        progress.info(&format!(
            "share phase: {} workers, the data to compare is read from disk ({})",
            sharing.workers,
            if job.scan.drop_cache { "--drop-cache" } else { "larger than half the memory for the page cache" }
        ));
    }
    sharing
}

/// The run's report, built from what each phase found.
fn report(
    job: &Job,
    scan: &ScanOutcome,
    plan: Option<&PlanOutcome>,
    share: Option<&ShareOutcome>,
    total_ms: u64,
) -> Report {
    let fs = &job.scan.fs;
    let (changes, hashed) = (&scan.changes, &scan.hashed);
    let mut r = Report {
        report_version: crate::report::REPORT_VERSION,
        dedupscan_version: env!("CARGO_PKG_VERSION").to_owned(),
        command: job.command().to_owned(),
        dry_run: job.dry_run(),
        incremental: job.scan.incremental,
        paths: job.paths(),
        filesystem: fs.kind.name().to_owned(),
        filesystem_uuid: fs.uuid.clone(),
        database: display_path(job.db_path),
        block_size: job.scan.block_size,
        files_scanned: scan.files_scanned(),
        files_hashed: hashed.files,
        bytes_hashed: hashed.bytes_read,
        bytes_reused: hashed.bytes_reused,
        files_unchanged: changes.unchanged,
        files_renamed: changes.renamed,
        files_failed: hashed.errors.values().sum(),
        files_removed: scan.removed,
        logical_bytes: changes.logical_bytes - hashed.left_out_bytes,
        interrupted: scan.interrupted,
        ..Default::default()
    };
    let skipped = scan.walked.skipped.iter().map(|(r, n)| (*r, *n)).chain(hashed.skipped.iter().map(|(r, n)| (*r, *n)));
    for (reason, n) in skipped.chain([(SkipReason::Nodedup, changes.nodedup)]) {
        r.skip(reason, n);
    }
    for (reason, n) in &scan.walked.skipped_dirs {
        *r.skipped_dirs.entry(reason.name().to_owned()).or_default() += *n;
    }
    for (kind, n) in scan.walked.errors.iter().map(|(k, n)| (*k, *n)).chain(hashed.errors.iter().map(|(k, n)| (*k, *n)))
    {
        r.error(kind, n);
    }
    (r.timings.walk_ms, r.timings.hash_ms, r.timings.total_ms) = (scan.walk_ms, scan.scan_ms, total_ms);
    if let Some(plan) = plan {
        (r.timings.plan_ms, r.planned_every_file) = (plan.plan_ms, plan.base == complete::Base::All);
        set_pending(&mut r, &plan.pending);
        if let Some(p) = &plan.planned {
            r.ranges_planned = p.stats.ranges;
            r.ranges = p.listed.clone();
        }
    }
    match share {
        None => {}
        Some(ShareOutcome::Refused(why)) => r.sharing_refused = Some(why.clone()),
        Some(ShareOutcome::Executed(e)) => {
            add_sharing(&mut r, e);
            // What the plan left out as already shared never reached the
            // share phase (see `plan::claims`).
            r.already_shared_bytes += plan.and_then(|p| p.planned.as_ref()).map_or(0, |p| p.stats.already_shared_bytes);
        }
    }
    r
}

/// Measure free space again after sharing: what the share phase freed,
/// and who else changed the filesystem meanwhile. `None`: the volume did
/// not answer (read-only since, or shut down); the report goes out
/// without the figure.
fn measure_freed(before: Before, root: &Path, progress: &dyn Progress) -> Option<Freed> {
    // Flushing the volume can take seconds after much sharing: say so
    // instead of leaving a full bar at "eta 0s".
    progress.finish_phase("");
    progress.phase("3/3 share: measuring freed space", None, false);
    let freed =
        before.after(root).map_err(|e| progress.warn_run(&format!("cannot measure the space freed: {e:#}"))).ok()?;
    // Not a warning: nothing went wrong, and on a root filesystem the
    // journal alone writes every night. The report's freed row says it too.
    if freed.others == Some(true) {
        progress.info(&format!(
            "other processes changed the filesystem of {} while this run measured the space it freed: the \
             freed figure includes their writes and deletions",
            display_path(root)
        ));
    }
    Some(freed)
}

/// The share phase's part of the report.
fn add_sharing(r: &mut Report, e: &Executed) {
    let out = &e.out;
    r.freed_bytes = e.freed.map_or(0, |f| f.bytes);
    r.freed_includes_others = e.freed.and_then(|f| f.others);
    set_pending(r, &e.pending);
    r.duplicate_bytes = out.duplicate_bytes;
    r.deduped_bytes = out.deduped_bytes;
    r.already_shared_bytes = out.already_shared_bytes;
    r.rewritten_bytes = out.rewritten_bytes;
    (r.zeros_to_holes_files, r.zeros_to_holes_bytes) = (out.zeros_to_holes_files, out.zeros_to_holes_bytes);
    r.pinned_bytes = e.pinned_by_reason.values().sum();
    r.pinned_by_reason = e.pinned_by_reason.iter().map(|(k, n)| (k.name().to_owned(), *n)).collect();
    r.sources_swapped = out.swapped_sources;
    r.files_stale = out.stale.len() as u64;
    let what_if = dedupe::bookend::WHAT_IF_RATIOS.iter().zip(out.rewrite_what_if);
    r.rewrite_what_if = what_if
        .filter(|(_, (free, _))| *free > 0)
        .map(|(&rewrite_ratio, (would_free_bytes, would_copy_bytes))| RewriteWhatIf {
            rewrite_ratio,
            would_free_bytes,
            would_copy_bytes,
        })
        .collect();
    // Found only now: these files were considered (and hashed or known
    // unchanged), they stay in files_scanned; they are left out of sharing.
    r.skip(SkipReason::ChangedDuringScan, out.changed_files);
    for (k, n) in &out.skipped {
        r.skip(*k, *n);
    }
    if let Some(z) = &e.zeros {
        (r.zeros_to_holes_files, r.zeros_to_holes_bytes) =
            (r.zeros_to_holes_files + z.files, r.zeros_to_holes_bytes + z.bytes);
        r.rewritten_bytes += z.rewritten;
        r.skip(SkipReason::ChangedDuringScan, z.changed);
        for (k, n) in &z.skipped {
            r.skip(*k, *n);
        }
        for (k, n) in &z.errors {
            r.error(*k, *n);
        }
    }
    r.skip(SkipReason::Inline, out.inline_files);
    for (k, n) in &out.errors {
        r.error(*k, *n);
    }
    for (k, n) in &out.status.errors {
        r.share_error(k, *n);
    }
    r.dedupe_status = out.status.clone();
    r.sharing_refused = out.refused.clone();
    r.interrupted |= e.interrupted;
    r.timings.dedupe_ms = e.share_ms;
}

/// The ranges of `plan`, named from `files`, for `--list`.
fn listed_ranges(plan: &Plan, files: &HashMap<FileId, FileFacts>) -> Vec<ListedRange> {
    let name = |id: &FileId| files.get(id).map(|c| display_path(&c.path)).unwrap_or_default();
    (plan.ranges.iter())
        .map(|r| ListedRange {
            source: name(&r.src),
            source_offset: r.src_off,
            destination: name(&r.dest),
            destination_offset: r.dest_off,
            bytes: r.len,
            state: None,
            unshared_bytes: None,
        })
        .collect()
}

/// Milliseconds since `t`.
fn ms(t: Instant) -> u64 {
    t.elapsed().as_millis() as u64
}
