//! Figures for dashboards as a Prometheus text exposition (`--metrics-file`),
//! for node_exporter's textfile collector.
//!
//! In: how the process ends (exit code, and the run's [`Report`] when it
//! finished) and the database's run history. Out: a `.prom` file written
//! atomically (a temporary file in the same directory, then `rename`), so the
//! collector never reads half a file. Written on every exit path once the
//! configuration is resolved — a locked database (exit 4) and fatal errors
//! included — so `dedupscan_last_exit_code` and the age of
//! `dedupscan_last_success_timestamp_seconds` tell an alert what happened.
//!
//! Three kinds of series, names with their unit last:
//! - lifetime counters (`dedupscan_freed_bytes_total`, …): sums over every
//!   finished run in the database, so they survive restarts and a lost
//!   metrics file, and only grow (a run that costs space adds to
//!   `dedupscan_grown_bytes_total` instead of lowering the freed counter);
//! - the last finished run's figures as gauges (`dedupscan_hashed_bytes`,
//!   …), and the current state as that run measured it
//!   (`dedupscan_shared_bytes`, `dedupscan_still_duplicate_bytes`);
//! - how this invocation ended (`dedupscan_last_exit_code`,
//!   `dedupscan_last_run_timestamp_seconds`).
//!
//! Label sets are stable: a labelled family (skip reasons, error kinds,
//! dedupe outcomes, phases) lists every value the code knows plus every
//! value any run in the database ever reported, at 0 when absent, so series
//! go to 0 instead of vanishing. Every sample carries `fs_uuid` and `path`,
//! so files of several volumes can share one collector directory.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::dedupe::Pending;
use crate::errors::ErrorKind;
use crate::report::Report;

/// One finished run of the database's history.
#[derive(Debug, Clone, Default)]
pub struct PastRun {
    /// Unix seconds.
    pub finished_at: i64,
    /// `run` or `scan`.
    pub command: String,
    /// That run's report as stored (a [`Report`] in JSON).
    pub report: Value,
}

/// Finished runs of the database at `db`, oldest first; empty when there is
/// no readable database (a first run that failed early).
pub fn load_history(db: &Path) -> Vec<PastRun> {
    crate::db::summary::finished_runs_at(db)
        .into_iter()
        .map(|r| PastRun {
            finished_at: r.finished_at.unwrap_or_default(),
            command: r.command,
            report: r.report.and_then(|s| serde_json::from_str(&s).ok()).unwrap_or(Value::Null),
        })
        .collect()
}

/// How this invocation ended, and which volume it was about.
#[derive(Debug, Clone, Default)]
pub struct Outcome<'a> {
    /// The process's exit code.
    pub exit_code: i32,
    /// UUID of the volume.
    pub fs_uuid: String,
    /// `btrfs` or `xfs`.
    pub filesystem: String,
    /// Starting paths, escaped (see [`crate::display::display_path`]).
    pub paths: Vec<String>,
    /// The run's report, when it finished (it is also the last of the
    /// history, as the run stored it).
    pub report: Option<&'a Report>,
}

/// Values the code knows for each labelled family; the history adds more.
const PHASES: [&str; 4] = ["walk", "hash", "plan", "dedupe"];
const STATUSES: [&str; 2] = ["same", "differs"];
/// The commonest [`ErrorKind`]s (a family lists these even before any run
/// counted one).
const ERROR_KINDS: [&str; 2] = [ErrorKind::Unreadable.name(), ErrorKind::Vanished.name()];
const COMMANDS: [&str; 2] = ["run", "scan"];
/// The names of [`crate::policy::SkipReason`].
const SKIP_REASONS: [&str; 24] = [
    "fifo",
    "socket",
    "device",
    "symlink",
    "empty",
    "mount_point",
    "hardlink",
    "hardlink_outside",
    "excluded",
    "nodedup",
    "immutable",
    "append_only",
    "nocow",
    "swapfile",
    "realtime",
    "dax",
    "readonly_snapshot",
    "inline",
    "own_database",
    "changed_during_scan",
    "vanished",
    "leased",
    "moved_during_crawl",
    "too_deep",
];

/// Render the exposition (text format 0.0.4) at time `now`.
pub fn render(out: &Outcome, history: &[PastRun], now: SystemTime) -> String {
    let mut m =
        Metrics { out: String::new(), base: vec![("fs_uuid", out.fs_uuid.clone()), ("path", out.paths.join(","))] };
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    // The last finished run: this one's report if it finished, else the
    // database's last (a locked or failed run keeps the previous figures).
    let this = out.report.map(|r| serde_json::to_value(r.without_list()).unwrap_or(Value::Null));
    let last: Value = this.clone().or_else(|| history.last().map(|r| r.report.clone())).unwrap_or(Value::Null);

    m.family("info", "gauge", "Version and filesystem type (value always 1).");
    m.sample("info", &[("version", env!("CARGO_PKG_VERSION")), ("filesystem", out.filesystem.as_str())], 1.0);

    // --- How this invocation ended -----------------------------------------
    m.single(
        "last_exit_code",
        "gauge",
        "Exit status of the last invocation: 0 ok, 1 per-file errors, 3 fatal, 4 database locked (see dedupscan(1)).",
        out.exit_code as f64,
    );
    m.single("last_run_timestamp_seconds", "gauge", "When the last invocation ended (any exit status).", secs(now));
    let success = history.iter().rev().find(|r| !r.report["interrupted"].as_bool().unwrap_or(false));
    m.single(
        "last_success_timestamp_seconds",
        "gauge",
        "When the last run that went to its end finished (0 if none): alert when too old.",
        success.map_or(0.0, |r| r.finished_at as f64),
    );

    lifetime(&mut m, history);
    last_run(&mut m, &last, this.as_ref(), history);
    freed_includes_others(&mut m, &last);
    labelled(&mut m, &last, history);
    m.out
}

/// Counters over every finished run of the history.
fn lifetime(m: &mut Metrics, history: &[PastRun]) {
    let n = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let sum = |k: &str| history.iter().map(|r| n(&r.report, k)).sum::<f64>();
    let freed: Vec<f64> = history.iter().map(|r| n(&r.report, "freed_bytes")).collect();
    m.family("runs_total", "counter", "Finished runs in the database, by command.");
    for c in COMMANDS {
        m.sample("runs_total", &[("command", c)], history.iter().filter(|r| r.command == c).count() as f64);
    }
    m.single(
        "freed_bytes_total",
        "counter",
        "Free space gained over all runs (statfs after minus before, runs that gained).",
        freed.iter().filter(|f| **f > 0.0).sum(),
    );
    m.single(
        "grown_bytes_total",
        "counter",
        "Used space grown over all runs that lost free space (freed minus grown is the net saving).",
        -freed.iter().filter(|f| **f < 0.0).sum::<f64>(),
    );
    m.single(
        "deduped_bytes_total",
        "counter",
        "Bytes the kernel confirmed as shared, over all runs.",
        sum("deduped_bytes"),
    );
    m.single("hashed_bytes_total", "counter", "Bytes read and hashed, over all runs.", sum("bytes_hashed"));
    m.single("errors_total", "counter", "Problems with individual paths or ranges, over all runs.", sum("errors"));
}

/// Whether another process changed the filesystem while the last run
/// measured what it freed. -1 where it could not watch (see `sys::watch`),
/// or a dry run: 0 would claim nobody else wrote, and a series must not
/// vanish.
fn freed_includes_others(m: &mut Metrics, last: &Value) {
    m.single(
        "freed_includes_others",
        "gauge",
        "1 if another process changed the filesystem while the last run measured freed_bytes (then included), \
         0 if not, -1 if not watched.",
        last["freed_includes_others"].as_bool().map_or(-1.0, |b| if b { 1.0 } else { 0.0 }),
    );
}

/// Gauges of the last finished run (`last`), and the current state as the
/// last planning run measured it.
fn last_run(m: &mut Metrics, last: &Value, this: Option<&Value>, history: &[PastRun]) {
    let n = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    m.single(
        "last_run_dry_run",
        "gauge",
        "1 if the last finished run was a dry run, else 0.",
        flag(last["dry_run"] == true),
    );
    m.single(
        "last_run_interrupted",
        "gauge",
        "1 if the last finished run stopped early (signal, --max-runtime, or the filesystem stopped; the next one carries on).",
        flag(last["interrupted"] == true),
    );
    m.single(
        "last_run_planned_every_file",
        "gauge",
        "1 if the last run planned every file, not only what changed (first run, --rehash, --full-plan-days), else 0.",
        flag(last["planned_every_file"] == true),
    );
    m.single(
        "last_run_sharing_refused",
        "gauge",
        "1 if the last run did not attempt sharing (e.g. unsupported filesystem), else 0.",
        flag(last["sharing_refused"].is_string()),
    );
    for (name, key, help) in [
        ("scanned_files", "files_scanned", "Regular files considered by the last run (after skips)."),
        ("hashed_files", "files_hashed", "Files the last run read and hashed."),
        ("unchanged_files", "files_unchanged", "Known files the last run did not reopen (size and times unchanged)."),
        ("renamed_files", "files_renamed", "Known files the last run found under a new path."),
        ("removed_files", "files_removed", "Files gone since the run before the last."),
        (
            "stale_files",
            "files_stale",
            "Files the last run found changed without a change of size or times (read again next run).",
        ),
        ("logical_bytes", "logical_bytes", "Sum of the sizes of the files the last run considered."),
        ("hashed_bytes", "bytes_hashed", "Bytes the last run read and hashed."),
        ("planned_ranges", "ranges_planned", "Duplicate ranges the last run's plan found."),
        ("duplicate_bytes", "duplicate_bytes", "Duplicate bytes the last run found and verified."),
        ("deduped_bytes", "deduped_bytes", "Bytes the kernel confirmed as shared in the last run (0 in a dry run)."),
        ("freed_bytes", "freed_bytes", "Free space the last run gained, measured with statfs (may be negative)."),
        (
            "rewritten_bytes",
            "rewritten_bytes",
            "btrfs: bytes the last run copied into fresh extents so partly shared extents could be freed.",
        ),
        (
            "pinned_bytes",
            "pinned_bytes",
            "btrfs: bytes the last run shared that free nothing while the rest of their extent stays in use.",
        ),
        ("errors", "errors", "Problems with individual paths or ranges in the last run."),
    ] {
        m.single(name, "gauge", help, n(last, key));
    }
    // Current state, as the last run that planned measured it.
    let planned = this
        .into_iter()
        .chain(history.iter().rev().map(|r| &r.report))
        .find(|r| r["command"] == "run")
        .cloned()
        .unwrap_or(Value::Null);
    let shared_now = n(&planned, "already_shared_bytes") + n(&planned, "deduped_bytes");
    let still = (n(&planned, "duplicate_bytes") - n(&planned, "deduped_bytes")).max(0.0);
    m.single(
        "shared_bytes",
        "gauge",
        "Duplicate bytes sharing one extent, as the last sharing run found them.",
        shared_now,
    );
    m.single(
        "still_duplicate_bytes",
        "gauge",
        "Duplicate bytes not shared, as the last sharing run left them (a dry run's preview counts here).",
        still,
    );
}

/// Labelled families of the last run, with stable label sets: every known
/// value plus every value the history ever reported.
fn labelled(m: &mut Metrics, last: &Value, history: &[PastRun]) {
    let n = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let keys = |field: &str, known: &[&str], skip: &dyn Fn(&str) -> bool| -> BTreeSet<String> {
        let mut set: BTreeSet<String> = known.iter().map(|s| s.to_string()).collect();
        for r in history.iter().map(|r| &r.report).chain(std::iter::once(last)) {
            let v = field.split('.').fold(r, |v, k| &v[k]);
            if let Some(o) = v.as_object() {
                set.extend(o.keys().filter(|k| !skip(k)).cloned());
            }
        }
        set
    };
    let get = |field: &str, key: &str| field.split('.').fold(last, |v, k| &v[k])[key].as_f64().unwrap_or(0.0);

    m.family(
        "dedupe_destinations",
        "gauge",
        "Dedupe destinations of the last run by outcome: same, differs, or an errno.",
    );
    m.sample("dedupe_destinations", &[("status", "same")], n(&last["dedupe_status"], "same"));
    m.sample("dedupe_destinations", &[("status", "differs")], n(&last["dedupe_status"], "differs"));
    for e in keys("dedupe_status.errors", &[], &|k| STATUSES.contains(&k)) {
        m.sample("dedupe_destinations", &[("status", &e)], get("dedupe_status.errors", &e));
    }
    m.family("skipped_files", "gauge", "Paths the last run did not consider, by reason.");
    for r in keys("skipped", &SKIP_REASONS, &|_| false) {
        m.sample("skipped_files", &[("reason", &r)], get("skipped", &r));
    }
    m.family("errors_by_kind", "gauge", "Problems with individual paths or ranges in the last run, by kind.");
    for k in keys("error_kinds", &ERROR_KINDS, &|_| false) {
        m.sample("errors_by_kind", &[("kind", &k)], get("error_kinds", &k));
    }
    m.family(
        "pending_bytes",
        "gauge",
        "Planned bytes the last run left for a later run, by reason (no space, --keep-free, kept by a snapshot).",
    );
    let reasons: Vec<&str> = Pending::ALL.iter().map(|p| p.name()).collect();
    for r in keys("pending", &reasons, &|_| false) {
        m.sample("pending_bytes", &[("reason", &r)], n(&last["pending"][&r], "bytes"));
    }
    m.family("phase_duration_seconds", "gauge", "Time the last run spent in each phase.");
    for p in PHASES {
        m.sample("phase_duration_seconds", &[("phase", p)], n(&last["timings"], &format!("{p}_ms")) / 1e3);
    }
    m.single(
        "run_duration_seconds",
        "gauge",
        "Wall-clock time of the last run.",
        n(&last["timings"], "total_ms") / 1e3,
    );
}

/// Render with the history of the database at `db` and write `path`
/// atomically ([`crate::sys::fs::write_replacing`]: the temporary file's
/// name does not end in `.prom`, so the textfile collector ignores it). The
/// file is made world-readable (0644) whatever the umask, because the
/// collector usually runs as another user.
pub fn write_atomic(path: &Path, db: &Path, out: &Outcome) -> io::Result<()> {
    let text = render(out, &load_history(db), SystemTime::now());
    crate::sys::fs::write_replacing(path, text.as_bytes(), 0o644)
}

struct Metrics {
    out: String,
    base: Vec<(&'static str, String)>,
}

impl Metrics {
    /// `# HELP` and `# TYPE` lines of a family.
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP dedupscan_{name} {help}");
        let _ = writeln!(self.out, "# TYPE dedupscan_{name} {kind}");
    }

    /// One sample, with the base labels plus `labels`.
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let base = self.base.iter().map(|(k, v)| (*k, v.as_str()));
        let all: Vec<String> =
            base.chain(labels.iter().copied()).map(|(k, v)| format!("{k}=\"{}\"", escape_label(v))).collect();
        // An empty f64 sum is -0.0: print it as 0.
        let value = if value == 0.0 { 0.0 } else { value };
        let _ = writeln!(self.out, "dedupscan_{name}{{{}}} {value}", all.join(","));
    }

    /// A family with exactly one sample.
    fn single(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }
}

/// Label values escape backslash, double quote and newline.
fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

#[cfg(test)]
mod tests;
