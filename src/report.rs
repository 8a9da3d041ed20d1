//! The run's report: one value, rendered as text for people or as one JSON
//! document (`--json`) for scripts. Its JSON form is described by
//! `schema/report.schema.json`.
//!
//! Every figure called "freed" is measured with `statfs` before and after
//! sharing; nothing here is estimated. Other processes changing the
//! filesystem meanwhile are in that difference, and `freed_includes_others`
//! says whether any was seen (`sys::watch`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

pub mod listed;
pub use listed::{List, Listed};

use crate::dedupe::DedupeStatuses;
use crate::display::{human, human_duration_ms, human_signed};
use crate::errors::ErrorKind;
use crate::policy::SkipReason;

/// Version of the report's JSON layout; bumped on incompatible changes.
/// 2: `files_unchanged` no longer counts moved files, `skipped` counts files
/// only (directories in `skipped_dirs`), `files_scanned` keeps inline files.
pub const REPORT_VERSION: u32 = 2;

/// Time spent per phase, in milliseconds.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Timings {
    /// The crawl alone (it overlaps with hashing).
    pub walk_ms: u64,
    /// The scan phase: crawl and hash, overlapped.
    pub hash_ms: u64,
    /// Planning, from the database.
    pub plan_ms: u64,
    /// Sharing, or in a dry run verifying.
    pub dedupe_ms: u64,
    /// The whole run.
    pub total_ms: u64,
}

/// Work left for a later run, for one reason.
#[derive(Debug, Default, Clone, Serialize)]
pub struct PendingWork {
    /// Destination files.
    pub files: u64,
    /// Duplicate bytes planned into them.
    pub bytes: u64,
}

/// What a larger `--rewrite-ratio` would have done about the bytes this run
/// left pinned below the ratio in use (btrfs): an estimate from the extents
/// the run judged, so an administrator can weigh the copying against the
/// space before choosing a ratio.
#[derive(Debug, Default, Clone, Serialize)]
pub struct RewriteWhatIf {
    /// The `--rewrite-ratio` value.
    pub rewrite_ratio: f64,
    /// Pinned bytes it would have freed.
    pub would_free_bytes: u64,
    /// Remainder bytes it would have copied into fresh extents to do so.
    pub would_copy_bytes: u64,
}

/// Everything one run did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Report {
    /// [`REPORT_VERSION`].
    pub report_version: u32,
    /// The version of the binary that ran.
    pub dedupscan_version: String,
    /// `run` (scan and share) or `scan` (hash only).
    pub command: String,
    /// `--dry-run`: nothing was changed.
    pub dry_run: bool,
    /// Change detection on (known unchanged files were not reread).
    pub incremental: bool,
    /// Starting paths, escaped (see [`crate::display::display_path`]).
    pub paths: Vec<String>,
    /// Filesystem kind (`btrfs`, `xfs`, …).
    pub filesystem: String,
    /// The filesystem's UUID (names the database).
    pub filesystem_uuid: String,
    /// Path of the database, escaped.
    pub database: String,
    /// Bytes per hashed block.
    pub block_size: u64,
    /// Regular files considered (after skips). Always
    /// `files_hashed + files_unchanged + files_renamed + files_failed`.
    pub files_scanned: u64,
    /// Files read and hashed in this run.
    pub files_hashed: u64,
    /// Bytes read from disk to hash them (holes are not read).
    pub bytes_hashed: u64,
    /// Bytes hashed without reading them: they share a physical extent
    /// with blocks hashed earlier in the run (reflinked copies, snapshots,
    /// files already deduplicated).
    pub bytes_reused: u64,
    /// Known files, at their recorded path, whose size and times had not
    /// changed: not reopened.
    pub files_unchanged: u64,
    /// Known files found unchanged under a new path: not reopened.
    pub files_renamed: u64,
    /// Files that could not be read (each counted in `error_kinds` too).
    pub files_failed: u64,
    /// Files whose contents the share phase found changed since they were
    /// hashed although their size and times were not (a write through a
    /// shared memory mapping changes no time): a range planned from their
    /// fingerprints differed. The next run reads them again.
    pub files_stale: u64,
    /// Known files under the starting paths the crawl no longer found
    /// (forgotten by the database).
    pub files_removed: u64,
    /// Sum of the sizes of the files considered.
    pub logical_bytes: u64,
    /// Duplicate ranges the plan found.
    pub ranges_planned: u64,
    /// The plan took every file, not only those new since the last complete
    /// run: a first run, `--rehash`, other paths or settings, or the weekly
    /// full plan (`--full-plan-days`).
    pub planned_every_file: bool,
    /// Bytes found duplicate and verified: byte for byte by our own compare
    /// in a dry run, submitted to the kernel in a real run.
    pub duplicate_bytes: u64,
    /// Bytes the kernel confirmed as shared (0 in a dry run).
    pub deduped_bytes: u64,
    /// Bytes skipped because they already share the source's extents.
    pub already_shared_bytes: u64,
    /// Bytes copied into fresh extents so that partly shared extents could
    /// be freed (btrfs); in a dry run, what would be copied.
    pub rewritten_bytes: u64,
    /// Files with written zero blocks turned into holes
    /// (`dedupe::zeros`); in a dry run, how many would be.
    pub zeros_to_holes_files: u64,
    /// Bytes of written zero blocks turned into holes (freed, counted in
    /// `freed_bytes` too); in a dry run, read back as zeros and would be.
    pub zeros_to_holes_bytes: u64,
    /// btrfs: bytes shared into extents that stay on disk for a part still
    /// in use (a remainder too large to rewrite, or compressed): shared but
    /// not freed, so that `deduped_bytes` = `freed_bytes` + this, give or
    /// take metadata. In a dry run, what would be.
    pub pinned_bytes: u64,
    /// `pinned_bytes` by why (the names of
    /// [`crate::dedupe::PinReason`]): `below_rewrite_ratio`, `compressed`,
    /// `inline`, `not_rewritable`, `rewrite_failed`.
    pub pinned_by_reason: BTreeMap<String, u64>,
    /// Of the bytes pinned `below_rewrite_ratio`, what larger ratios would
    /// free and copy; only ratios that would free something.
    pub rewrite_what_if: Vec<RewriteWhatIf>,
    /// Whole-file groups shared from one of their copies instead of the
    /// planned source, the source becoming one more destination: a copy a
    /// read-only snapshot (a file outside the run) keeps, so the source's
    /// extents are freed now instead of the copy left pending; or a copy
    /// far less fragmented, so no copy ends up as fragmented as the source
    /// was.
    pub sources_swapped: u64,
    /// Free space after minus free space before, from statfs (0 in a dry run).
    pub freed_bytes: i64,
    /// Whether another process was seen changing the filesystem between
    /// the two measurements of `freed_bytes` (`sys::watch`), or deleted
    /// btrfs subvolumes were still being cleaned up: then the figure
    /// includes their writes and deletions. `None`: a dry run, or the
    /// filesystem could not be watched (a btrfs subvolume mounted without
    /// its top level, no `CAP_SYS_ADMIN`).
    pub freed_includes_others: Option<bool>,
    /// How each destination's sharing request was answered.
    pub dedupe_status: DedupeStatuses,
    /// Files left out, by reason, one per file. Most were never considered;
    /// `inline` files and files found changed while sharing were considered
    /// (counted in `files_scanned`) and left out of sharing.
    pub skipped: BTreeMap<String, u64>,
    /// Directories left out with everything below them, by reason.
    pub skipped_dirs: BTreeMap<String, u64>,
    /// Total problems with individual paths or ranges.
    pub errors: u64,
    /// The same problems by kind: the names of [`ErrorKind`], and
    /// `dedupe_<errno>` for destinations the kernel refused (see
    /// [`Report::share_error`]). Strings, so a history written by another
    /// version reads back whatever kinds it had.
    pub error_kinds: BTreeMap<String, u64>,
    /// Duplicate bytes left for a later run after this one, by reason
    /// (`no_space_rewrite`, `no_space_share`: the volume was full;
    /// `keep_free`: a rewrite would have taken the free space `--keep-free`
    /// keeps; `referenced_outside_run`: a read-only snapshot or another
    /// file not in the run keeps the destination's extent, so sharing would
    /// free nothing; `rewrite_not_allowed`: the run may create no file for
    /// a rewrite's copy, see `dedupe::Pending::RewriteNotAllowed`;
    /// `zeros_keep_free`: bytes of written zeros not turned into holes, the
    /// copy of the data sharing their extent having no room above
    /// `--keep-free`, or the volume or a quota being full; `zeros_referenced_outside_run`: bytes of written
    /// zeros a file outside the run also holds, tried again once that
    /// holder is gone; `zeros_leased`: the same, of a file another
    /// process held a lease on; `zeros_many_clones`: the same, of zeros so
    /// many files of the run share that 1,024 let go of them first (each
    /// punch compares them again); `leased`: another process held a lease on the
    /// destination or its source when the share phase opened it): the next
    /// run, incremental or not, tries them again.
    /// In a dry run, what the run would leave.
    pub pending: BTreeMap<String, PendingWork>,
    /// Sum of `pending` bytes.
    pub pending_bytes: u64,
    /// Why sharing was not attempted, when it was not (e.g. unsupported filesystem).
    pub sharing_refused: Option<String>,
    /// Whether the run stopped before the end (signal or time budget).
    pub interrupted: bool,
    /// Time per phase.
    pub timings: Timings,
    /// With `--list`: every planned range (what is, or in a dry run would
    /// be, submitted for sharing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranges: Option<Listed>,
}

/// One planned range, for `--list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ListedRange {
    /// Path of the file the data is kept in, escaped.
    pub source: String,
    /// Byte offset of the range in the source.
    pub source_offset: u64,
    /// Path of the file whose copy is replaced by the source's, escaped.
    pub destination: String,
    /// Byte offset of the range in the destination.
    pub destination_offset: u64,
    /// Length of the range in bytes.
    pub bytes: u64,
    /// `report --list` only: what FIEMAP says now: `shared`, `unshared`,
    /// `partly_shared`, `inline` or `unknown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// `report --list` only: bytes of the range not shared yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unshared_bytes: Option<u64>,
}

/// A text table: a header row, then rows; the first column left-aligned,
/// the others right-aligned, every line indented by two spaces.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
    /// Columns aligned to the left (beyond the first).
    left: Vec<usize>,
}

impl Table {
    /// A table with its header row.
    pub fn new<S: AsRef<str>>(header: &[S]) -> Table {
        Table { rows: vec![header.iter().map(|h| h.as_ref().to_owned()).collect()], left: vec![] }
    }

    /// Align column `i` to the left too (e.g. a path at the end).
    pub fn left(mut self, i: usize) -> Table {
        self.left.push(i);
        self
    }

    /// Add a row (missing cells are blank).
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// Whether there is nothing but the header.
    pub fn is_empty(&self) -> bool {
        self.rows.len() <= 1
    }

    /// The table as lines of text, each ending in a newline.
    pub fn render(&self) -> String {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let width = |i: usize| self.rows.iter().filter_map(|r| r.get(i)).map(|c| c.chars().count()).max().unwrap_or(0);
        let widths: Vec<usize> = (0..cols).map(width).collect();
        let mut out = String::new();
        for r in &self.rows {
            out.push_str(&table_line(r, &widths, &self.left));
        }
        out
    }
}

/// One line of a table: `cells` padded to `widths` (the first column and
/// those in `left` to the left, the others to the right, the last one not
/// padded), two spaces of indent and between columns, a newline.
pub fn table_line<S: AsRef<str>>(cells: &[S], widths: &[usize], left: &[usize]) -> String {
    let cols = widths.len();
    let mut line = String::from("  ");
    for (i, w) in widths.iter().enumerate() {
        let cell = cells.get(i).map_or("", AsRef::as_ref);
        let last = i + 1 == cols;
        if i == 0 || left.contains(&i) {
            if last {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}");
            }
        } else {
            let _ = write!(line, "{cell:>w$}");
        }
        if !last {
            line.push_str("  ");
        }
    }
    let mut line = line.trim_end().to_owned();
    line.push('\n');
    line
}

impl Report {
    /// The report without its `--list` (what the database and the metrics
    /// file keep: numbers, not a list as long as the plan).
    pub fn without_list(&self) -> Report {
        Report { ranges: None, ..self.clone() }
    }

    /// Count `n` files left out for reason `r`.
    pub fn skip(&mut self, r: SkipReason, n: u64) {
        if n == 0 {
            return;
        }
        *self.skipped.entry(r.name().to_owned()).or_default() += n;
    }

    /// Count `n` problems of one kind.
    pub fn error(&mut self, kind: ErrorKind, n: u64) {
        self.count_error(kind.name(), n);
    }

    /// Count `n` destinations the kernel (or, in a dry run, our own
    /// compare) refused to share, by the status name of
    /// [`DedupeStatuses::errors`]: counted as `dedupe_<name>` in lower case
    /// (`dedupe_eopnotsupp`, `dedupe_read`), an open set, one per errno.
    pub fn share_error(&mut self, status: &str, n: u64) {
        self.count_error(&format!("dedupe_{}", status.to_lowercase()), n);
    }

    fn count_error(&mut self, kind: &str, n: u64) {
        if n > 0 {
            *self.error_kinds.entry(kind.to_owned()).or_default() += n;
            self.errors += n;
        }
    }

    /// The report as text: a heading, then a table per section.
    pub fn to_text(&self) -> String {
        let mut s = self.heading();
        let mut tables = vec![self.files_table()];
        if self.command == "run" {
            tables.push(self.duplicates_table());
        }
        if !self.skipped.is_empty() || !self.skipped_dirs.is_empty() {
            tables.push(self.skipped_table());
        }
        if self.errors > 0 {
            let mut t = Table::new(&["errors", "count"]);
            for (k, v) in &self.error_kinds {
                t.row([k.clone(), v.to_string()]);
            }
            tables.push(t);
        }
        tables.push(self.time_table());
        for t in tables {
            s.push('\n');
            s.push_str(&t.render());
        }
        s
    }

    /// The first lines: what ran where, and whatever the reader must know
    /// before the numbers (stopped early, sharing refused, work pending).
    fn heading(&self) -> String {
        let mut s = String::new();
        let mode = if self.dry_run { " (dry run: nothing changed)" } else { "" };
        let _ = writeln!(s, "dedupscan {}{mode} on {} [{}]", self.command, self.paths.join(", "), self.filesystem);
        if self.interrupted {
            let _ = writeln!(s, "  INTERRUPTED before the end: work done is kept, the next run carries on");
        }
        if self.planned_every_file && self.incremental {
            let _ = writeln!(s, "  planned every file, not only what changed since the last complete run");
        }
        if let Some(why) = &self.sharing_refused {
            let _ = writeln!(s, "  sharing refused: {why}");
        }
        if self.pending_bytes > 0 {
            let list: Vec<String> =
                self.pending.iter().map(|(k, w)| format!("{k}: {} in {} files", human(w.bytes), w.files)).collect();
            let left = if self.dry_run { "would be left" } else { "left" };
            let _ =
                writeln!(s, "  pending: {} {left} for the next run ({})", human(self.pending_bytes), list.join(", "));
        }
        s
    }

    /// Files considered, hashed, unchanged, moved, failed, removed.
    fn files_table(&self) -> Table {
        let mut t = Table::new(&["files", "count", "size"]);
        t.row(["considered".to_owned(), self.files_scanned.to_string(), human(self.logical_bytes)]);
        t.row([
            "  hashed".to_owned(),
            self.files_hashed.to_string(),
            if self.bytes_reused > 0 {
                format!("{} read, {} reused from shared extents", human(self.bytes_hashed), human(self.bytes_reused))
            } else {
                format!("{} read", human(self.bytes_hashed))
            },
        ]);
        t.row(["  unchanged".to_owned(), self.files_unchanged.to_string(), String::new()]);
        t.row(["  moved".to_owned(), self.files_renamed.to_string(), String::new()]);
        if self.files_failed > 0 {
            t.row(["  failed".to_owned(), self.files_failed.to_string(), "not hashed; see errors".to_owned()]);
        }
        if self.files_stale > 0 {
            let why = "changed without a change of times; read again next run";
            t.row(["  stale".to_owned(), self.files_stale.to_string(), why.to_owned()]);
        }
        t.row(["removed since last run".to_owned(), self.files_removed.to_string(), String::new()]);
        t
    }

    /// What `run` found duplicate, shared, rewrote and freed.
    fn duplicates_table(&self) -> Table {
        let mut t = Table::new(&["duplicates", "size", ""]);
        let found = if self.dry_run { "would share (verified)" } else { "submitted" };
        t.row([found.to_owned(), human(self.duplicate_bytes), format!("{} ranges", self.ranges_planned)]);
        t.row(["already shared".to_owned(), human(self.already_shared_bytes), String::new()]);
        if self.dry_run {
            if self.rewritten_bytes > 0 {
                t.row(["would rewrite".to_owned(), human(self.rewritten_bytes), "partly shared extents".to_owned()]);
            }
        } else {
            t.row(["shared".to_owned(), human(self.deduped_bytes), "confirmed by the kernel".to_owned()]);
            t.row(["rewritten".to_owned(), human(self.rewritten_bytes), "partly shared extents".to_owned()]);
        }
        // The preview decides as the run does (the same FIEMAP checks and
        // rewrite ratio), so it says what would stay pinned, and what a
        // larger ratio would free: the figure to weigh before a run.
        if self.pinned_bytes > 0 {
            let (label, why) = match self.dry_run {
                true => ("would stay pinned", "shared, not freed: the rest of the extent would stay in use"),
                false => ("pinned", "shared, not freed: the rest of the extent is in use"),
            };
            t.row([label.to_owned(), human(self.pinned_bytes), why.to_owned()]);
            for (reason, n) in &self.pinned_by_reason {
                t.row([format!("  {reason}"), human(*n), String::new()]);
            }
            for w in &self.rewrite_what_if {
                let copy = format!("would be freed by copying {}", human(w.would_copy_bytes));
                t.row([format!("    --rewrite-ratio {}", w.rewrite_ratio), human(w.would_free_bytes), copy]);
            }
        }
        if self.zeros_to_holes_bytes > 0 || self.zeros_to_holes_files > 0 {
            let what = if self.dry_run { "would become holes" } else { "zeros made holes" };
            // Files that let go of zeros shared with others count, the
            // bytes only once freed: none, all still held elsewhere (by
            // files outside the run, or of the run past the bound on
            // punches of one block, `SharedZeros::may_compare`).
            let held = if self.zeros_to_holes_bytes == 0 { "; still held by other files" } else { "" };
            let files = format!("written zero blocks, {} files{held}", self.zeros_to_holes_files);
            t.row([what.to_owned(), human(self.zeros_to_holes_bytes), files]);
        }
        if !self.dry_run {
            let how = match self.freed_includes_others {
                Some(true) => "measured with statfs, with changes by other processes",
                _ => "measured with statfs",
            };
            t.row(["freed".to_owned(), human_signed(self.freed_bytes), how.to_owned()]);
        }
        t.left(2)
    }

    /// Files and directories left out, by reason.
    fn skipped_table(&self) -> Table {
        let mut t = Table::new(&["skipped", "files", "directories"]);
        let reasons: std::collections::BTreeSet<&String> =
            self.skipped.keys().chain(self.skipped_dirs.keys()).collect();
        for r in reasons {
            let n = |m: &BTreeMap<String, u64>| m.get(r).map_or(String::new(), u64::to_string);
            t.row([r.clone(), n(&self.skipped), n(&self.skipped_dirs)]);
        }
        t
    }

    /// Time per phase.
    fn time_table(&self) -> Table {
        let tm = &self.timings;
        let mut t = Table::new(&["time", ""]);
        for (k, v) in [
            ("crawl", tm.walk_ms),
            ("crawl and hash", tm.hash_ms),
            ("plan", tm.plan_ms),
            (if self.dry_run { "verify" } else { "share" }, tm.dedupe_ms),
            ("total", tm.total_ms),
        ] {
            t.row([k.to_owned(), human_duration_ms(v)]);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align() {
        let mut t = Table::new(&["what", "n"]);
        t.row(["a", "1"]);
        t.row(["longer", "100"]);
        assert_eq!(t.render(), "  what      n\n  a         1\n  longer  100\n");
    }

    #[test]
    fn zeros_let_go_of_but_held_elsewhere_are_said_so() {
        let run = || Report { command: "run".to_owned(), ..Report::default() };
        let r = Report { zeros_to_holes_files: 2, ..run() };
        assert!(r.to_text().contains("written zero blocks, 2 files; still held by other files"));
        let r = Report { zeros_to_holes_files: 2, zeros_to_holes_bytes: 1 << 20, ..run() };
        assert!(r.to_text().contains("1.0 MiB") && !r.to_text().contains("still held"), "{}", r.to_text());
        assert!(!run().to_text().contains("zero blocks"));
    }

    #[test]
    fn json_has_the_documented_keys() {
        let v = serde_json::to_value(Report::default()).unwrap();
        for k in [
            "dry_run",
            "files_scanned",
            "files_hashed",
            "bytes_hashed",
            "bytes_reused",
            "duplicate_bytes",
            "deduped_bytes",
            "freed_bytes",
            "skipped",
            "errors",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
    }
}
