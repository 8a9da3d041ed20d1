//! The run's figures as a Prometheus text exposition (`--metrics-file`), for
//! node_exporter's textfile collector.
//!
//! In: a finished [`Report`]. Out: a `.prom` file written atomically (a
//! temporary file in the same directory, then `rename`), so the collector
//! never reads half a file. Runs on the main thread after the report is
//! printed.
//!
//! Every figure is a gauge holding the value of the *last* run (a run does not
//! add to the previous one), so none is named `_total`. Every sample carries
//! `fs_uuid` and `path` labels: one file per volume (e.g. one per
//! `dedupscan@.timer` instance) can then sit in the same collector directory
//! without two files exporting the same series.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::report::Report;

/// Render `report` in the Prometheus text format (version 0.0.4);
/// `finished` becomes `dedupscan_last_run_timestamp_seconds`.
pub fn render(report: &Report, finished: SystemTime) -> String {
    let mut m = Metrics { out: String::new(), base: base_labels(report) };
    let secs = finished.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let flag = |b: bool| if b { 1.0 } else { 0.0 };

    m.family("info", "Version and command of the last run (value always 1).");
    let info = [
        ("version", report.dedupscan_version.as_str()),
        ("command", report.command.as_str()),
        ("filesystem", report.filesystem.as_str()),
    ];
    m.sample("info", &info, 1.0);
    m.single("last_run_timestamp_seconds", "When the last run finished, in seconds since the Unix epoch.", secs);
    m.single("dry_run", "1 if the last run was a dry run (nothing shared), else 0.", flag(report.dry_run));
    m.single("incremental", "1 if the last run only rehashed changed files, else 0.", flag(report.incremental));
    m.single(
        "interrupted",
        "1 if the last run stopped before the end (the next one carries on).",
        flag(report.interrupted),
    );
    m.single(
        "sharing_refused",
        "1 if sharing was not attempted (e.g. unsupported filesystem), else 0.",
        flag(report.sharing_refused.is_some()),
    );

    m.single("files_scanned", "Regular files considered (after skips).", report.files_scanned as f64);
    m.single("files_hashed", "Files read and hashed.", report.files_hashed as f64);
    m.single(
        "files_unchanged",
        "Known files not reopened because size and times were unchanged.",
        report.files_unchanged as f64,
    );
    m.single("files_renamed", "Known files found under a new path.", report.files_renamed as f64);
    m.single("files_removed", "Files gone since the previous run.", report.files_removed as f64);
    m.single("logical_bytes", "Sum of the sizes of the files considered.", report.logical_bytes as f64);
    m.single("bytes_hashed", "Bytes read and hashed.", report.bytes_hashed as f64);
    m.single("ranges_planned", "Duplicate ranges the plan found.", report.ranges_planned as f64);
    m.single(
        "duplicate_bytes",
        "Duplicate bytes found and verified (compared in a dry run, submitted to the kernel otherwise).",
        report.duplicate_bytes as f64,
    );
    m.single("deduped_bytes", "Bytes the kernel confirmed as shared (0 in a dry run).", report.deduped_bytes as f64);
    m.single(
        "already_shared_bytes",
        "Duplicate bytes skipped because they already share the source's extents.",
        report.already_shared_bytes as f64,
    );
    m.single(
        "freed_bytes",
        "Free space after the run minus free space before, measured with statfs (0 in a dry run).",
        report.freed_bytes as f64,
    );

    m.family("dedupe_destinations", "Dedupe destinations by outcome: same (shared), differs, or an errno name.");
    let st = &report.dedupe_status;
    m.sample("dedupe_destinations", &[("status", "same")], st.same as f64);
    m.sample("dedupe_destinations", &[("status", "differs")], st.differs as f64);
    for (errno, n) in &st.errors {
        m.sample("dedupe_destinations", &[("status", errno)], *n as f64);
    }

    m.family("skipped_files", "Paths not considered, by reason.");
    for (reason, n) in &report.skipped {
        m.sample("skipped_files", &[("reason", reason)], *n as f64);
    }

    m.single("errors", "Problems with individual paths or ranges (the run went on).", report.errors as f64);
    m.family("errors_by_kind", "Problems with individual paths or ranges, by kind.");
    for (kind, n) in &report.error_kinds {
        m.sample("errors_by_kind", &[("kind", kind)], *n as f64);
    }

    m.family("phase_duration_seconds", "Time spent in each phase of the last run.");
    let t = &report.timings;
    for (phase, ms) in [("walk", t.walk_ms), ("hash", t.hash_ms), ("plan", t.plan_ms), ("dedupe", t.dedupe_ms)] {
        m.sample("phase_duration_seconds", &[("phase", phase)], ms as f64 / 1e3);
    }
    m.single("run_duration_seconds", "Wall-clock time of the whole last run.", t.total_ms as f64 / 1e3);
    m.out
}

/// Write [`render`]`(report, now)` to `path` atomically: into a temporary
/// file next to it (named so the textfile collector, which reads only
/// `*.prom`, ignores it), flushed to disk, then renamed over `path`. The
/// file is made world-readable (0644) whatever the umask, because the
/// collector usually runs as another user.
pub fn write_atomic(path: &Path, report: &Report) -> io::Result<()> {
    let text = render(report, SystemTime::now());
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

/// Labels every sample carries: which volume the figures are about.
fn base_labels(report: &Report) -> Vec<(&'static str, String)> {
    vec![("fs_uuid", report.filesystem_uuid.clone()), ("path", report.paths.join(","))]
}

struct Metrics {
    out: String,
    base: Vec<(&'static str, String)>,
}

impl Metrics {
    /// `# HELP` and `# TYPE` lines of a gauge family.
    fn family(&mut self, name: &str, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP dedupscan_{name} {help}");
        let _ = writeln!(self.out, "# TYPE dedupscan_{name} gauge");
    }

    /// One sample, with the base labels plus `labels`.
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let base = self.base.iter().map(|(k, v)| (*k, v.as_str()));
        let all: Vec<String> =
            base.chain(labels.iter().copied()).map(|(k, v)| format!("{k}=\"{}\"", escape_label(v))).collect();
        let _ = writeln!(self.out, "dedupscan_{name}{{{}}} {value}", all.join(","));
    }

    /// A family with exactly one sample.
    fn single(&mut self, name: &str, help: &str, value: f64) {
        self.family(name, help);
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
    use std::collections::{BTreeMap, HashSet};
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
                assert_eq!(ty, "gauge", "{line:?}");
                assert_eq!(helped.as_deref(), Some(name), "TYPE right after its HELP: {line:?}");
                assert!(families.insert(name.to_owned()), "family {name} announced twice");
                current = Some(name.to_owned());
            } else {
                assert!(!line.starts_with('#') && !line.is_empty(), "unexpected line {line:?}");
                let s = parse_sample(line);
                assert_eq!(current.as_deref(), Some(s.name.as_str()), "sample outside its family: {line:?}");
                assert!(s.name.starts_with("dedupscan_"), "{line:?}");
                assert!(!s.name.ends_with("_total"), "gauges are not named _total: {line:?}");
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

    #[test]
    fn every_line_parses_as_the_text_format() {
        let when = UNIX_EPOCH + Duration::from_millis(1_700_000_000_250);
        for r in [Report::default(), sample_report()] {
            let samples = parse_all(&render(&r, when));
            assert!(samples.len() > 20);
        }
    }

    #[test]
    fn figures_and_labels_round_trip() {
        let r = sample_report();
        let s = parse_all(&render(&r, UNIX_EPOCH + Duration::from_millis(1_700_000_000_250)));
        assert_eq!(value(&s, "dedupscan_last_run_timestamp_seconds", None), 1_700_000_000.25);
        assert_eq!(value(&s, "dedupscan_files_scanned", None), 10.0);
        assert_eq!(value(&s, "dedupscan_bytes_hashed", None), (1u64 << 30) as f64);
        assert_eq!(value(&s, "dedupscan_duplicate_bytes", None), 4096.0);
        assert_eq!(value(&s, "dedupscan_deduped_bytes", None), 4096.0);
        assert_eq!(value(&s, "dedupscan_freed_bytes", None), -8192.0);
        assert_eq!(value(&s, "dedupscan_dry_run", None), 0.0);
        assert_eq!(value(&s, "dedupscan_errors", None), 3.0);
        assert_eq!(value(&s, "dedupscan_errors_by_kind", Some(("kind", "unreadable"))), 2.0);
        assert_eq!(value(&s, "dedupscan_skipped_files", Some(("reason", "nodedup"))), 5.0);
        assert_eq!(value(&s, "dedupscan_skipped_files", Some(("reason", "mount_point"))), 1.0);
        assert_eq!(value(&s, "dedupscan_dedupe_destinations", Some(("status", "same"))), 7.0);
        assert_eq!(value(&s, "dedupscan_dedupe_destinations", Some(("status", "EPERM"))), 2.0);
        assert_eq!(value(&s, "dedupscan_phase_duration_seconds", Some(("phase", "hash"))), 1.5);
        assert_eq!(value(&s, "dedupscan_run_duration_seconds", None), 2.001);
        assert_eq!(value(&s, "dedupscan_info", Some(("command", "run"))), 1.0);
        // Awkward label values come back unchanged, on every sample.
        for x in &s {
            assert_eq!(x.labels["fs_uuid"], "0123-abcd");
            assert_eq!(x.labels["path"], "/srv/a \"quoted\"\\x,/srv/b\nnewline");
        }
    }

    #[test]
    fn dry_run_flag() {
        let r = Report { dry_run: true, ..Default::default() };
        let s = parse_all(&render(&r, UNIX_EPOCH));
        assert_eq!(value(&s, "dedupscan_dry_run", None), 1.0);
    }

    #[test]
    fn write_atomic_replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dedupscan.prom");
        std::fs::write(&path, "old").unwrap();
        write_atomic(&path, &sample_report()).unwrap();
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
        assert!(write_atomic(&path, &Report::default()).is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
