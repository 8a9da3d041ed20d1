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
use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

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
const SKIP_REASONS: [&str; 20] = [
    "fifo",
    "socket",
    "device",
    "symlink",
    "empty",
    "mount_point",
    "hardlink",
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
];

/// Render the exposition (text format 0.0.4) at time `now`.
pub fn render(out: &Outcome, history: &[PastRun], now: SystemTime) -> String {
    let mut m =
        Metrics { out: String::new(), base: vec![("fs_uuid", out.fs_uuid.clone()), ("path", out.paths.join(","))] };
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    // The last finished run: this one's report if it finished, else the
    // database's last (a locked or failed run keeps the previous figures).
    let this = out.report.map(|r| serde_json::to_value(r).unwrap_or(Value::Null));
    let last: Value = this.clone().or_else(|| history.last().map(|r| r.report.clone())).unwrap_or(Value::Null);
    let n = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);

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

    // --- Lifetime counters from the history ----------------------------------
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

    // --- The last finished run ------------------------------------------------
    m.single(
        "last_run_dry_run",
        "gauge",
        "1 if the last finished run was a dry run, else 0.",
        flag(last["dry_run"] == true),
    );
    m.single(
        "last_run_interrupted",
        "gauge",
        "1 if the last finished run stopped early (signal or --max-runtime; the next one carries on).",
        flag(last["interrupted"] == true),
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
        ("logical_bytes", "logical_bytes", "Sum of the sizes of the files the last run considered."),
        ("hashed_bytes", "bytes_hashed", "Bytes the last run read and hashed."),
        ("planned_ranges", "ranges_planned", "Duplicate ranges the last run's plan found."),
        ("duplicate_bytes", "duplicate_bytes", "Duplicate bytes the last run found and verified."),
        ("deduped_bytes", "deduped_bytes", "Bytes the kernel confirmed as shared in the last run (0 in a dry run)."),
        ("freed_bytes", "freed_bytes", "Free space the last run gained, measured with statfs (may be negative)."),
        ("errors", "errors", "Problems with individual paths or ranges in the last run."),
    ] {
        m.single(name, "gauge", help, n(&last, key));
    }
    // Current state, as the last run that planned measured it.
    let planned = this
        .iter()
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

    // --- Labelled families of the last run, with stable label sets -------------
    let keys = |field: &str, known: &[&str], skip: &dyn Fn(&str) -> bool| -> BTreeSet<String> {
        let mut set: BTreeSet<String> = known.iter().map(|s| s.to_string()).collect();
        for r in history.iter().map(|r| &r.report).chain(std::iter::once(&last)) {
            let v = field.split('.').fold(r, |v, k| &v[k]);
            if let Some(o) = v.as_object() {
                set.extend(o.keys().filter(|k| !skip(k)).cloned());
            }
        }
        set
    };
    let get = |field: &str, key: &str| field.split('.').fold(&last, |v, k| &v[k])[key].as_f64().unwrap_or(0.0);

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
    m.out
}

/// Render with the history of the database at `db` and write `path`
/// atomically: into a temporary file next to it (named so the textfile
/// collector, which reads only `*.prom`, ignores it), flushed to disk, then
/// renamed over `path`. The file is made world-readable (0644) whatever the
/// umask, because the collector usually runs as another user.
pub fn write_atomic(path: &Path, db: &Path, out: &Outcome) -> io::Result<()> {
    let text = render(out, &load_history(db), SystemTime::now());
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "metrics file path has no file name"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f =
            OpenOptions::new().write(true).create_new(true).mode(0o644).custom_flags(libc::O_CLOEXEC).open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        // Make the rename itself durable; failing to is not worth an error.
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
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
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet, HashSet};
    use std::time::Duration;

    fn sample_report() -> Report {
        let mut r = Report {
            dedupscan_version: "0.1.0".into(),
            command: "run".into(),
            paths: vec!["/srv/a \"quoted\"\\x".into(), "/srv/b\nnewline".into()],
            filesystem: "btrfs".into(),
            filesystem_uuid: "0123-abcd".into(),
            files_scanned: 10,
            bytes_hashed: 1 << 30,
            duplicate_bytes: 4096,
            deduped_bytes: 4096,
            freed_bytes: -8192,
            errors: 3,
            error_kinds: BTreeMap::from([("unreadable".into(), 2), ("vanished".into(), 1)]),
            ..Default::default()
        };
        r.skipped.insert("nodedup".into(), 5);
        r.skipped.insert("mount_point".into(), 1);
        r.dedupe_status.same = 7;
        r.dedupe_status.errors.insert("EPERM".into(), 2);
        r.timings.hash_ms = 1500;
        r.timings.total_ms = 2001;
        r
    }

    /// One sample line of the text format: `name{labels} value`.
    #[derive(Debug)]
    struct Sample {
        name: String,
        labels: BTreeMap<String, String>,
        value: f64,
    }

    /// A strict parser of the subset of the text format `render` may use
    /// (no timestamps); panics with the line on anything else.
    fn parse_sample(line: &str) -> Sample {
        let bad = |why: &str| -> ! { panic!("{why}: {line:?}") };
        let name_end = line.find(['{', ' ']).unwrap_or_else(|| bad("no value"));
        let name = &line[..name_end];
        if !is_metric_name(name) {
            bad("bad metric name");
        }
        let mut rest = &line[name_end..];
        let mut labels = BTreeMap::new();
        if let Some(r) = rest.strip_prefix('{') {
            rest = r;
            loop {
                if let Some(r) = rest.strip_prefix('}') {
                    rest = r;
                    break;
                }
                let eq = rest.find('=').unwrap_or_else(|| bad("label without ="));
                let key = &rest[..eq];
                if !is_label_name(key) {
                    bad("bad label name");
                }
                rest = rest[eq + 1..].strip_prefix('"').unwrap_or_else(|| bad("label value not quoted"));
                let mut value = String::new();
                let mut chars = rest.char_indices();
                let end = loop {
                    match chars.next() {
                        Some((_, '\\')) => match chars.next() {
                            Some((_, '\\')) => value.push('\\'),
                            Some((_, '"')) => value.push('"'),
                            Some((_, 'n')) => value.push('\n'),
                            _ => bad("bad escape in label value"),
                        },
                        Some((i, '"')) => break i,
                        Some((_, '\n')) => bad("raw newline in label value"),
                        Some((_, c)) => value.push(c),
                        None => bad("unterminated label value"),
                    }
                };
                assert!(labels.insert(key.to_owned(), value).is_none(), "duplicate label in {line:?}");
                rest = &rest[end + 1..];
                rest = rest.strip_prefix(',').unwrap_or(rest);
            }
        }
        let value = rest.strip_prefix(' ').unwrap_or_else(|| bad("no space before value"));
        let value: f64 = value.parse().unwrap_or_else(|_| bad("value is not a float"));
        Sample { name: name.to_owned(), labels, value }
    }

    fn is_metric_name(s: &str) -> bool {
        let mut c = s.chars();
        matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_' || f == ':')
            && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':')
    }

    fn is_label_name(s: &str) -> bool {
        let mut c = s.chars();
        matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
            && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
            && !s.starts_with("__")
    }

    /// Every line is a `# HELP`, a `# TYPE` or a sample; every sample's
    /// family was announced (HELP then TYPE) right before its samples, and
    /// no series appears twice.
    fn parse_all(text: &str) -> Vec<Sample> {
        assert!(text.ends_with('\n'), "the text format ends with a newline");
        let mut samples = Vec::new();
        let mut families = HashSet::new();
        let mut series = HashSet::new();
        let mut current: Option<String> = None;
        let mut helped: Option<String> = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("HELP has a text");
                assert!(is_metric_name(name) && !help.is_empty(), "{line:?}");
                helped = Some(name.to_owned());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, ty) = rest.split_once(' ').expect("TYPE has a type");
                // Counters and only counters are named _total.
                assert_eq!(ty == "counter", name.ends_with("_total"), "{line:?}");
                assert!(ty == "counter" || ty == "gauge", "{line:?}");
                assert_eq!(helped.as_deref(), Some(name), "TYPE right after its HELP: {line:?}");
                assert!(families.insert(name.to_owned()), "family {name} announced twice");
                current = Some(name.to_owned());
            } else {
                assert!(!line.starts_with('#') && !line.is_empty(), "unexpected line {line:?}");
                let s = parse_sample(line);
                assert_eq!(current.as_deref(), Some(s.name.as_str()), "sample outside its family: {line:?}");
                assert!(s.name.starts_with("dedupscan_"), "{line:?}");
                assert!(series.insert(format!("{}{:?}", s.name, s.labels)), "series twice: {line:?}");
                samples.push(s);
            }
        }
        samples
    }

    fn value(samples: &[Sample], name: &str, label: Option<(&str, &str)>) -> f64 {
        let found: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.name == name && label.is_none_or(|(k, v)| s.labels.get(k).map(String::as_str) == Some(v)))
            .collect();
        assert_eq!(found.len(), 1, "{name} {label:?}: {found:?}");
        found[0].value
    }

    fn outcome(report: Option<&Report>) -> Outcome<'_> {
        Outcome {
            exit_code: report.map_or(4, |_| 1),
            fs_uuid: "0123-abcd".into(),
            filesystem: "btrfs".into(),
            paths: vec!["/srv/a \"quoted\"\\x".into(), "/srv/b\nnewline".into()],
            report,
        }
    }

    fn past(r: &Report, finished_at: i64) -> PastRun {
        PastRun { finished_at, command: r.command.clone(), report: serde_json::to_value(r).unwrap() }
    }

    const WHEN: u64 = 1_700_000_000_250;

    #[test]
    fn every_line_parses_as_the_text_format() {
        let when = UNIX_EPOCH + Duration::from_millis(WHEN);
        let r = sample_report();
        for (o, h) in [(outcome(None), vec![]), (outcome(Some(&r)), vec![past(&r, 5)])] {
            let samples = parse_all(&render(&o, &h, when));
            assert!(samples.len() > 40);
        }
    }

    #[test]
    fn figures_and_labels_round_trip() {
        let r = sample_report();
        let first = Report {
            command: "run".into(),
            freed_bytes: 1 << 20,
            deduped_bytes: 1 << 20,
            bytes_hashed: 7,
            ..Default::default()
        };
        let h = vec![past(&first, 100), past(&r, 200)];
        let s = parse_all(&render(&outcome(Some(&r)), &h, UNIX_EPOCH + Duration::from_millis(WHEN)));
        assert_eq!(value(&s, "dedupscan_last_run_timestamp_seconds", None), 1_700_000_000.25);
        assert_eq!(value(&s, "dedupscan_last_success_timestamp_seconds", None), 200.0);
        assert_eq!(value(&s, "dedupscan_last_exit_code", None), 1.0);
        assert_eq!(value(&s, "dedupscan_scanned_files", None), 10.0);
        assert_eq!(value(&s, "dedupscan_hashed_bytes", None), (1u64 << 30) as f64);
        assert_eq!(value(&s, "dedupscan_duplicate_bytes", None), 4096.0);
        assert_eq!(value(&s, "dedupscan_deduped_bytes", None), 4096.0);
        assert_eq!(value(&s, "dedupscan_freed_bytes", None), -8192.0);
        assert_eq!(value(&s, "dedupscan_last_run_dry_run", None), 0.0);
        assert_eq!(value(&s, "dedupscan_errors", None), 3.0);
        assert_eq!(value(&s, "dedupscan_errors_by_kind", Some(("kind", "unreadable"))), 2.0);
        assert_eq!(value(&s, "dedupscan_skipped_files", Some(("reason", "nodedup"))), 5.0);
        assert_eq!(value(&s, "dedupscan_skipped_files", Some(("reason", "mount_point"))), 1.0);
        assert_eq!(value(&s, "dedupscan_dedupe_destinations", Some(("status", "same"))), 7.0);
        assert_eq!(value(&s, "dedupscan_dedupe_destinations", Some(("status", "EPERM"))), 2.0);
        assert_eq!(value(&s, "dedupscan_phase_duration_seconds", Some(("phase", "hash"))), 1.5);
        assert_eq!(value(&s, "dedupscan_run_duration_seconds", None), 2.001);
        assert_eq!(value(&s, "dedupscan_info", Some(("version", env!("CARGO_PKG_VERSION")))), 1.0);
        // Lifetime counters over the history: freed and grown kept apart.
        assert_eq!(value(&s, "dedupscan_freed_bytes_total", None), (1 << 20) as f64);
        assert_eq!(value(&s, "dedupscan_grown_bytes_total", None), 8192.0);
        assert_eq!(value(&s, "dedupscan_deduped_bytes_total", None), (4096 + (1 << 20)) as f64);
        assert_eq!(value(&s, "dedupscan_hashed_bytes_total", None), ((1u64 << 30) + 7) as f64);
        assert_eq!(value(&s, "dedupscan_runs_total", Some(("command", "run"))), 2.0);
        assert_eq!(value(&s, "dedupscan_runs_total", Some(("command", "scan"))), 0.0);
        // Current state from the last sharing run.
        assert_eq!(value(&s, "dedupscan_still_duplicate_bytes", None), 0.0);
        // Awkward label values come back unchanged, on every sample.
        for x in &s {
            assert_eq!(x.labels["fs_uuid"], "0123-abcd");
            assert_eq!(x.labels["path"], "/srv/a \"quoted\"\\x,/srv/b\nnewline");
        }
    }

    /// The set of series (name and labels) of a rendering.
    fn series(text: &str) -> BTreeSet<String> {
        parse_all(text).into_iter().map(|s| format!("{}{:?}", s.name, s.labels)).collect()
    }

    #[test]
    fn label_sets_are_stable_and_series_go_to_zero() {
        let r = sample_report();
        let clean = Report { command: "run".into(), ..Default::default() };
        let h1 = vec![past(&r, 1)];
        let h2 = vec![past(&r, 1), past(&clean, 2)];
        let with = render(&outcome(Some(&r)), &h1, UNIX_EPOCH);
        let without = render(&outcome(Some(&clean)), &h2, UNIX_EPOCH);
        // Every series of the first rendering is still there after a run
        // without those errors, skips and errnos...
        let (a, b) = (series(&with), series(&without));
        assert!(a.is_subset(&b), "series vanished: {:?}", a.difference(&b).collect::<Vec<_>>());
        // ...at 0.
        let s = parse_all(&without);
        assert_eq!(value(&s, "dedupscan_dedupe_destinations", Some(("status", "EPERM"))), 0.0);
        assert_eq!(value(&s, "dedupscan_errors_by_kind", Some(("kind", "unreadable"))), 0.0);
        assert_eq!(value(&s, "dedupscan_skipped_files", Some(("reason", "nodedup"))), 0.0);
        // Known values are there before any run reported them.
        let empty_text = render(&outcome(None), &[], UNIX_EPOCH);
        assert!(!empty_text.contains(" -0\n"), "negative zero:\n{empty_text}");
        let empty = parse_all(&empty_text);
        assert_eq!(value(&empty, "dedupscan_skipped_files", Some(("reason", "nocow"))), 0.0);
        assert_eq!(value(&empty, "dedupscan_errors_by_kind", Some(("kind", "vanished"))), 0.0);
    }

    #[test]
    fn a_locked_run_keeps_the_last_figures_and_reports_its_exit_code() {
        let r = sample_report();
        let s = parse_all(&render(&outcome(None), &[past(&r, 42)], UNIX_EPOCH + Duration::from_secs(99)));
        assert_eq!(value(&s, "dedupscan_last_exit_code", None), 4.0);
        assert_eq!(value(&s, "dedupscan_last_run_timestamp_seconds", None), 99.0);
        assert_eq!(value(&s, "dedupscan_last_success_timestamp_seconds", None), 42.0);
        assert_eq!(value(&s, "dedupscan_scanned_files", None), 10.0);
    }

    #[test]
    fn interrupted_runs_are_not_successes() {
        let ok = Report { command: "run".into(), ..Default::default() };
        let cut = Report { command: "run".into(), interrupted: true, ..Default::default() };
        let s = parse_all(&render(&outcome(Some(&cut)), &[past(&ok, 10), past(&cut, 20)], UNIX_EPOCH));
        assert_eq!(value(&s, "dedupscan_last_success_timestamp_seconds", None), 10.0);
        assert_eq!(value(&s, "dedupscan_last_run_interrupted", None), 1.0);
    }

    #[test]
    fn write_atomic_replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dedupscan.prom");
        std::fs::write(&path, "old").unwrap();
        let r = sample_report();
        write_atomic(&path, &dir.path().join("no.sqlite"), &outcome(Some(&r))).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        parse_all(&text);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("dedupscan.prom")]);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
    }

    #[test]
    fn write_atomic_fails_cleanly_in_a_missing_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing/dedupscan.prom");
        assert!(write_atomic(&path, &dir.path().join("no.sqlite"), &outcome(None)).is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
