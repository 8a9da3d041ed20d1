//! `dedupscan report`: what the database knows, without scanning.
//!
//! In: a database path. Out: totals of the files it describes, what is
//! shared and what still is not — the plan rebuilt from the database and
//! every range measured with FIEMAP (metadata only, no data is read) — and
//! the history of runs (each run's own report, as it was measured).
//! Described by `schema/db-report.schema.json`.
//!
//! Space on disk is counted the way `compsize` and `btrfs filesystem du`
//! do: every physical extent once, however many files share it (the sum of
//! `st_blocks` counts a shared block in every file and grows after
//! sharing). Directories are rolled up like `du`: a directory's figure
//! includes everything below it. Text is a table per section, dates are
//! ISO 8601 in UTC, sizes in binary units.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use crate::db::summary::RunRow;
use crate::db::Db;
use crate::dedupe::extents::{range_states, RangeState};
use crate::display::{display_path, human, human_signed, iso_time};
use crate::file::{FileFacts, FileId};
use crate::plan::{Plan, PlanOptions};
use crate::progress::{Progress, Silent};
use crate::report::{List, Listed, ListedRange, Table};

mod disk;
mod pinned;
mod too_large;
use disk::disk_usage;
pub use pinned::{Pinned, PinnedFile};
pub use too_large::TooLargeFile;

/// One past run.
#[derive(Debug, Serialize)]
pub struct RunEntry {
    /// The run's id (runs are numbered in the order they started).
    pub id: i64,
    /// Unix seconds.
    pub started_at: i64,
    /// Unix seconds; `None` if it never recorded an end.
    pub finished_at: Option<i64>,
    /// `started_at` as ISO 8601, UTC.
    pub started: String,
    /// `finished_at` as ISO 8601, UTC.
    pub finished: Option<String>,
    /// `finished`; `interrupted` (stopped by a signal or the time budget,
    /// its work kept); `unfinished` (never recorded an end: killed,
    /// crashed, or still running).
    pub status: String,
    /// `run` or `scan`.
    pub command: String,
    /// Whether it was a dry run.
    pub dry_run: bool,
    /// That run's report (null when it did not finish).
    pub report: Option<serde_json::Value>,
}

/// A source file whose copies still hold unshared duplicate bytes.
#[derive(Debug, Serialize)]
pub struct RemainingGroup {
    /// The source file's path, escaped.
    pub source: String,
    /// Bytes of its ranges not shared yet.
    pub unshared_bytes: u64,
    /// Destination files of those ranges.
    pub destinations: u64,
}

/// A directory holding unshared duplicate bytes (as destinations),
/// everything below it included (like `du`).
#[derive(Debug, Serialize)]
pub struct RemainingDir {
    /// The directory's path, escaped.
    pub directory: String,
    /// Unshared duplicate bytes in it and below it.
    pub unshared_bytes: u64,
}

/// The database summary.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// The database's path, escaped.
    pub database: String,
    /// The filesystem it describes.
    pub filesystem_uuid: Option<String>,
    /// Block size of its fingerprints.
    pub block_size: Option<u64>,
    /// Known files.
    pub files: u64,
    /// Sum of their sizes.
    pub logical_bytes: u64,
    /// Files that are whole copies (size and content) of another known
    /// file, the first of each group not counted.
    pub whole_file_duplicate_files: u64,
    /// Bytes of those files beyond the first copy of each group.
    pub whole_file_duplicate_bytes: u64,
    /// Files the last run that saw them kept out of its plan (another of
    /// their hard links is outside the paths scanned, or left out): the
    /// plan here leaves them out too.
    pub kept_out_files: u64,
    /// Sum of the files' allocated blocks (st_blocks), as they are now;
    /// shared blocks count in every file that uses them.
    pub allocated_bytes: u64,
    /// Space the files take on disk now, each physical extent counted once
    /// however many files share it (FIEMAP; like `compsize`). Falls after
    /// sharing.
    pub on_disk_bytes: u64,
    /// Duplicate bytes the plan finds among the known files now.
    pub duplicate_bytes: u64,
    /// Of those, bytes already sharing one extent (measured with FIEMAP).
    pub shared_bytes: u64,
    /// Of those, bytes not shared yet: what the next run would submit.
    pub unshared_bytes: u64,
    /// Bytes of ranges whose files could not be opened or mapped (gone,
    /// changed, volume not mounted).
    pub unknown_bytes: u64,
    /// Sources with the most unshared duplicate bytes, largest first.
    pub largest_remaining_groups: Vec<RemainingGroup>,
    /// Directories holding the most unshared duplicate bytes.
    pub top_directories: Vec<RemainingDir>,
    /// Duplicate bytes left for a later run, by reason: out of space, or
    /// pinned by a file outside the run (see [`crate::dedupe::Pending`]).
    pub pending: std::collections::BTreeMap<String, crate::report::PendingWork>,
    /// Sum of `pending` bytes.
    pub pending_bytes: u64,
    /// btrfs: shared bytes that freed nothing (their extent stays for an
    /// unshared rest of the file), by reason and by file, as recorded by
    /// the runs that shared them.
    pub pinned: Pinned,
    /// Files refused as too large to hash, refused unread while unchanged.
    pub too_large_files: Vec<TooLargeFile>,
    /// Sum over runs of bytes freed, as measured by statfs.
    pub freed_bytes_total: i64,
    /// Every recorded run, oldest first.
    pub runs: Vec<RunEntry>,
    /// With `--list`: every planned range and its state now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranges: Option<Listed>,
}

/// [`summarize_with`], silently and without the list of ranges.
pub fn summarize(path: &Path) -> Result<Summary> {
    summarize_with(path, &Silent, false)
}

/// Summarize the database at `path`, showing progress (measuring every file
/// and range takes a while on a large volume); `list`: include every range.
pub fn summarize_with(path: &Path, progress: &dyn Progress, list: bool) -> Result<Summary> {
    // Not `exists()`: a dangling symlink at the name is refused by the
    // database's checks, not taken for a missing database.
    if path.symlink_metadata().is_err() {
        anyhow::bail!("no database at {}: run `dedupscan PATH` or `dedupscan scan PATH` first", display_path(path));
    }
    summarize_inner(path, progress, list).map_err(|e| crate::db::explain::explain_db_error(path, e))
}

fn summarize_inner(path: &Path, progress: &dyn Progress, list: bool) -> Result<Summary> {
    let db = Db::open_for_report(path)?;
    let meta = |k: &str| -> Option<String> { db.meta(k).ok().flatten() };
    let block_size: u64 = meta("block_size").and_then(|s| s.parse().ok()).unwrap_or(4096);
    let live = live_status(&db, block_size, progress, list)?;
    let (files, logical) = db.file_totals()?;
    let runs: Vec<RunEntry> = db.runs()?.into_iter().map(run_entry).collect();
    let freed = runs.iter().filter_map(|r| r.report.as_ref()?.get("freed_bytes")?.as_i64()).sum();
    let pending: std::collections::BTreeMap<String, crate::report::PendingWork> = db
        .pending_by_reason()?
        .into_iter()
        .map(|p| (p.reason, crate::report::PendingWork { files: p.files, bytes: p.bytes }))
        .collect();
    let pending_bytes = pending.values().map(|w| w.bytes).sum();
    Ok(Summary {
        database: display_path(path),
        filesystem_uuid: meta("filesystem"),
        block_size: Some(block_size),
        allocated_bytes: live.allocated,
        on_disk_bytes: live.on_disk,
        duplicate_bytes: live.duplicate,
        shared_bytes: live.shared,
        unshared_bytes: live.unshared,
        unknown_bytes: live.unknown,
        largest_remaining_groups: live.groups,
        top_directories: live.dirs,
        files,
        logical_bytes: logical,
        whole_file_duplicate_files: live.whole_dup_files,
        whole_file_duplicate_bytes: live.whole_dup_bytes,
        kept_out_files: live.kept_out,
        pending,
        pending_bytes,
        pinned: pinned::pinned(&db)?,
        too_large_files: too_large::too_large(&db)?,
        freed_bytes_total: freed,
        runs,
        ranges: live.ranges,
    })
}

/// A stored run as the report shows it: its report parsed, its status
/// named.
fn run_entry(r: RunRow) -> RunEntry {
    let report: Option<serde_json::Value> = r.report.and_then(|s| serde_json::from_str(&s).ok());
    let interrupted = report.as_ref().and_then(|v| v.get("interrupted")?.as_bool()).unwrap_or(false);
    let status = match (r.finished_at, interrupted) {
        (None, _) => "unfinished",
        (Some(_), true) => "interrupted",
        (Some(_), false) => "finished",
    };
    RunEntry {
        id: r.id,
        started_at: r.started_at,
        finished_at: r.finished_at,
        started: iso_time(r.started_at),
        finished: r.finished_at.map(iso_time),
        status: status.to_owned(),
        command: r.command,
        dry_run: r.dry_run,
        report,
    }
}

struct Live {
    allocated: u64,
    on_disk: u64,
    duplicate: u64,
    shared: u64,
    unshared: u64,
    unknown: u64,
    whole_dup_files: u64,
    whole_dup_bytes: u64,
    kept_out: u64,
    groups: Vec<RemainingGroup>,
    dirs: Vec<RemainingDir>,
    ranges: Option<Listed>,
}

/// Ranges measured per progress step.
const CHUNK: usize = 1024;

/// Add each directory's bytes to every directory above it, up to `root`
/// (the deepest directory holding all the files), like `du`.
fn roll_up(by_dir: HashMap<PathBuf, u64>, root: &Path) -> HashMap<PathBuf, u64> {
    let mut out: HashMap<PathBuf, u64> = HashMap::new();
    for (dir, n) in by_dir {
        for a in dir.ancestors() {
            *out.entry(a.to_owned()).or_default() += n;
            if a == root || !a.starts_with(root) {
                break;
            }
        }
    }
    out
}

/// The deepest directory containing every directory of `dirs`.
fn common_dir<'a>(mut dirs: impl Iterator<Item = &'a Path>) -> PathBuf {
    let Some(first) = dirs.next() else { return PathBuf::new() };
    let mut root = first.to_owned();
    for p in dirs {
        while !p.starts_with(&root) {
            if !root.pop() {
                return PathBuf::from("/");
            }
        }
    }
    root
}

/// Plan over every known file and measure each range with FIEMAP.
fn live_status(db: &Db, block_size: u64, progress: &dyn Progress, list: bool) -> Result<Live> {
    progress.phase("report: reading the database", None, false);
    // Memory flat in the number of files (issue 14): a bitset of the known
    // ids, the plan in batches (see `plan::from_db`) with the recorded
    // facts of one batch's files at a time, and the space on disk measured
    // from rows streamed from the database.
    let mut allowed = db.all_ids()?;
    let kept_out = db.for_each_kept_out(|id| allowed.remove(id))?;
    // The deepest directory holding every known file (dirs hold files).
    let dirs = db.dir_paths()?;
    let root = common_dir(dirs.iter().map(|d| d.as_path()));
    let (on_disk, allocated) = disk_usage(db, dirs, progress)?;
    let mut live = Live {
        allocated,
        on_disk,
        duplicate: 0,
        shared: 0,
        unshared: 0,
        unknown: 0,
        whole_dup_files: 0,
        whole_dup_bytes: 0,
        kept_out,
        groups: vec![],
        dirs: vec![],
        ranges: None,
    };
    let mut by_dir: HashMap<PathBuf, u64> = HashMap::new();
    let opts = PlanOptions { block_size, ..Default::default() };
    progress.phase("report: planning and measuring ranges", None, false);
    let limits = crate::plan::Limits::for_run();
    let mut listing = list.then(|| List::for_limits(limits.is_tiny()));
    let stats = crate::plan::from_db_with(db, &allowed, None, opts, limits, |plan: Plan| -> Result<()> {
        let files = db.file_facts(plan.files())?;
        let status = measure_ranges(&plan, &files, block_size, progress);
        if let Some(listing) = listing.as_mut() {
            for r in listed_ranges(&plan, &status, &files) {
                listing.push(r).map_err(|e| anyhow::anyhow!("keeping the list of ranges: {e}"))?;
            }
        }
        tally(&mut live, &mut by_dir, &plan, status, &files);
        Ok(())
    })?;
    progress.finish_phase("");
    live.ranges =
        listing.map(List::finish).transpose().map_err(|e| anyhow::anyhow!("keeping the list of ranges: {e}"))?;
    // Blocks the plan left out because another file holds them in the same
    // place on disk (FIEMAP when they were hashed; see `plan::claims`).
    live.duplicate += stats.already_shared_bytes;
    live.shared += stats.already_shared_bytes;
    live.whole_dup_files = stats.whole_copies;
    live.whole_dup_bytes = stats.whole_copy_bytes;
    live.dirs = top_dirs(by_dir, &root);
    Ok(live)
}

/// The state of every range of `plan` now (FIEMAP, on every CPU).
fn measure_ranges(
    plan: &Plan,
    files: &HashMap<FileId, FileFacts>,
    block_size: u64,
    progress: &dyn Progress,
) -> Vec<RangeState> {
    use rayon::prelude::*;
    // Once per batch, not once per chunk: finding the mounts reads the
    // mount table and looks up every file's directory.
    let tree = crate::sys::beneath::Tree::over_mounts(files.values().map(|c| c.path.as_path()));
    let parts: Vec<Vec<RangeState>> = plan
        .ranges
        .par_chunks(CHUNK)
        .map(|chunk| {
            let st = range_states(chunk, files, &tree, block_size);
            progress.inc(chunk.len() as u64);
            st
        })
        .collect();
    parts.into_iter().flatten().collect()
}

/// `--list`: every range with its state.
fn listed_ranges(plan: &Plan, status: &[RangeState], files: &HashMap<FileId, FileFacts>) -> Vec<ListedRange> {
    plan.ranges
        .iter()
        .zip(status)
        .map(|(r, st)| {
            let (state, unshared) = match *st {
                RangeState::Inline => ("inline", None),
                RangeState::Unknown => ("unknown", None),
                RangeState::Unshared(0) => ("shared", Some(0)),
                RangeState::Unshared(u) if u >= r.len => ("unshared", Some(u)),
                RangeState::Unshared(u) => ("partly_shared", Some(u)),
            };
            ListedRange {
                source: display_path(&files[&r.src].path),
                source_offset: r.src_off,
                destination: display_path(&files[&r.dest].path),
                destination_offset: r.dest_off,
                bytes: r.len,
                state: Some(state.to_owned()),
                unshared_bytes: unshared,
            }
        })
        .collect()
}

/// Add up the states of one batch's ranges into `live`: byte totals, the
/// sources with the most unshared bytes (a source's ranges are in one
/// batch, or a split component's parts: merged by source), and the
/// unshared bytes of each directory into `by_dir`.
fn tally(
    live: &mut Live,
    by_dir: &mut HashMap<PathBuf, u64>,
    plan: &Plan,
    status: Vec<RangeState>,
    files: &HashMap<FileId, FileFacts>,
) {
    let mut by_src: HashMap<FileId, (u64, HashSet<FileId>)> = HashMap::new();
    for (r, st) in plan.ranges.iter().zip(status) {
        if st != RangeState::Inline {
            live.duplicate += r.len;
        }
        match st {
            RangeState::Inline => {}
            RangeState::Unknown => live.unknown += r.len,
            RangeState::Unshared(u) => {
                live.unshared += u;
                live.shared += r.len - u;
                if u > 0 {
                    let e = by_src.entry(r.src).or_default();
                    e.0 += u;
                    e.1.insert(r.dest);
                    let dir = files[&r.dest].path.parent().map(Path::to_owned).unwrap_or_default();
                    *by_dir.entry(dir).or_default() += u;
                }
            }
        }
    }
    let groups = &mut live.groups;
    for (id, (bytes, dests)) in by_src {
        let source = display_path(&files[&id].path);
        let at = groups.iter().position(|g| g.source == source).unwrap_or_else(|| {
            groups.push(RemainingGroup { source, unshared_bytes: 0, destinations: 0 });
            groups.len() - 1
        });
        groups[at].unshared_bytes += bytes;
        groups[at].destinations += dests.len() as u64;
    }
    groups.sort_by(|a, b| b.unshared_bytes.cmp(&a.unshared_bytes).then_with(|| a.source.cmp(&b.source)));
    groups.truncate(TOP);
}

/// The [`TOP`] directories holding the most unshared bytes, everything
/// below each counted (like `du`).
fn top_dirs(by_dir: HashMap<PathBuf, u64>, root: &Path) -> Vec<RemainingDir> {
    let mut dirs: Vec<RemainingDir> = roll_up(by_dir, root)
        .into_iter()
        .map(|(d, bytes)| RemainingDir { directory: display_path(&d), unshared_bytes: bytes })
        .collect();
    // Largest first; on a tie the deeper directory first: it says more
    // precisely where the bytes are (its parent holds the same).
    let depth = |d: &RemainingDir| d.directory.matches('/').count();
    dirs.sort_by(|a, b| {
        (b.unshared_bytes.cmp(&a.unshared_bytes))
            .then_with(|| depth(b).cmp(&depth(a)))
            .then_with(|| a.directory.cmp(&b.directory))
    });
    dirs.truncate(TOP);
    dirs
}

/// How many groups and directories the report lists.
const TOP: usize = 10;

impl Summary {
    /// The summary as one self-contained HTML page (see [`crate::html`]).
    pub fn to_html(&self) -> String {
        crate::html::render(self)
    }

    /// The summary as text: a heading, then a table per section.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "database {}\n  filesystem {}, block size {}\n",
            self.database,
            self.filesystem_uuid.as_deref().unwrap_or("?"),
            self.block_size.map_or("?".to_owned(), human)
        );
        let mut t = Table::new(&["files", "count", "size"]);
        t.row(["known".to_owned(), self.files.to_string(), human(self.logical_bytes)]);
        t.row([
            "whole-file duplicates (copies)".to_owned(),
            self.whole_file_duplicate_files.to_string(),
            human(self.whole_file_duplicate_bytes),
        ]);
        if self.kept_out_files > 0 {
            t.row([
                "kept out (hard links)".to_owned(),
                self.kept_out_files.to_string(),
                "another name outside the paths scanned or left out".to_owned(),
            ]);
        }
        s.push('\n');
        s.push_str(&t.render());
        s.push('\n');
        s.push_str(&self.space_table().render());

        if !self.largest_remaining_groups.is_empty() {
            let mut t = Table::new(&["not yet shared", "copies", "source"]).left(2);
            for g in &self.largest_remaining_groups {
                t.row([human(g.unshared_bytes), g.destinations.to_string(), g.source.clone()]);
            }
            s.push('\n');
            s.push_str(&t.render());
        }
        for t in [self.pinned.files_text(), too_large::text(&self.too_large_files)].into_iter().flatten() {
            s.push('\n');
            s.push_str(&t);
        }
        if !self.top_directories.is_empty() {
            let mut t = Table::new(&["not yet shared", "directory (with everything below, like du)"]).left(1);
            for d in &self.top_directories {
                t.row([human(d.unshared_bytes), format!("{}/", d.directory.trim_end_matches('/'))]);
            }
            s.push('\n');
            s.push_str(&t.render());
        }
        if !self.runs.is_empty() {
            let shown = self.runs.len().min(RUNS_SHOWN);
            s.push('\n');
            if shown < self.runs.len() {
                let _ = std::fmt::Write::write_fmt(
                    &mut s,
                    format_args!("  last {shown} of {} runs (all of them with --json):\n", self.runs.len()),
                );
            }
            s.push_str(&self.runs_table().render());
        }
        s
    }

    /// The "space" table of [`Summary::to_text`].
    fn space_table(&self) -> Table {
        let mut t = Table::new(&["space", "size", ""]).left(2);
        t.row(["logical (file sizes)".to_owned(), human(self.logical_bytes), String::new()]);
        t.row(["on disk".to_owned(), human(self.on_disk_bytes), "each extent once, like compsize".to_owned()]);
        t.row([
            "allocated per file".to_owned(),
            human(self.allocated_bytes),
            "st_blocks summed; shared blocks counted per file".to_owned(),
        ]);
        t.row(["duplicate".to_owned(), human(self.duplicate_bytes), "found by the plan now".to_owned()]);
        t.row(["  shared".to_owned(), human(self.shared_bytes), "same extents already (FIEMAP)".to_owned()]);
        t.row(["  not yet shared".to_owned(), human(self.unshared_bytes), "what the next run would submit".to_owned()]);
        if self.unknown_bytes > 0 {
            t.row(["  unknown".to_owned(), human(self.unknown_bytes), "files gone or changed".to_owned()]);
        }
        if self.pending_bytes > 0 {
            let list: Vec<String> =
                self.pending.iter().map(|(k, w)| format!("{k}: {} in {} files", human(w.bytes), w.files)).collect();
            t.row([
                "  pending".to_owned(),
                human(self.pending_bytes),
                format!("left for the next run ({})", list.join(", ")),
            ]);
        }
        if self.pinned.bytes > 0 {
            t.row([
                "  pinned".to_owned(),
                human(self.pinned.bytes),
                format!("shared, not freed: the rest of the extent is in use ({})", self.pinned.reasons()),
            ]);
        }
        let runs = self.runs.len();
        let mut how = format!("measured with statfs over {runs} run{}", if runs == 1 { "" } else { "s" });
        // Runs whose figure holds others' writes and deletions too.
        let disturbed =
            self.runs.iter().filter(|r| r.report.as_ref().is_some_and(|j| j["freed_includes_others"] == true)).count();
        if disturbed > 0 {
            how += &format!(", {disturbed} of them with changes by other processes");
        }
        t.row(["freed so far".to_owned(), human_signed(self.freed_bytes_total), how]);
        t
    }

    /// The table of the last [`RUNS_SHOWN`] runs, newest first.
    fn runs_table(&self) -> Table {
        let mut t = Table::new(&[
            "run",
            "started (UTC)",
            "took",
            "command",
            "status",
            "hashed",
            "duplicate",
            "shared",
            "freed",
        ])
        .left(1)
        .left(3)
        .left(4);
        for r in self.runs.iter().rev().take(RUNS_SHOWN) {
            let get = |k: &str| r.report.as_ref().and_then(|v| v.get(k)).and_then(|v| v.as_i64()).unwrap_or(0);
            let took = r
                .finished_at
                .map_or(String::new(), |f| crate::display::human_duration_ms((f - r.started_at).max(0) as u64 * 1000));
            let command = if r.dry_run { format!("{} --dry-run", r.command) } else { r.command.clone() };
            let status = if r.status == "finished" { String::new() } else { r.status.to_uppercase() };
            t.row([
                r.id.to_string(),
                r.started.clone(),
                took,
                command,
                status,
                human(get("bytes_hashed") as u64),
                human(get("duplicate_bytes") as u64),
                human(get("deduped_bytes") as u64),
                human_signed(get("freed_bytes")),
            ]);
        }
        t
    }
}

/// How many runs the text lists (newest first).
const RUNS_SHOWN: usize = 10;

#[cfg(test)]
mod tests;
