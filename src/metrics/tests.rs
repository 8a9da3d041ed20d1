//! Tests of the metrics file: families, label sets, atomic writes.

use super::*;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::os::unix::fs::PermissionsExt;
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
        freed_includes_others: Some(true),
        rewritten_bytes: 16384,
        pinned_bytes: 20480,
        errors: 3,
        error_kinds: BTreeMap::from([("unreadable".into(), 2), ("vanished".into(), 1)]),
        ..Default::default()
    };
    r.skipped.insert("nodedup".into(), 5);
    r.skipped.insert("mount_point".into(), 1);
    r.pending.insert("keep_free".into(), crate::report::PendingWork { files: 2, bytes: 12288 });
    r.pending_bytes = 12288;
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
    assert_eq!(value(&s, "dedupscan_freed_includes_others", None), 1.0);
    // Not watched: -1, rather than a 0 that says nobody wrote.
    let unwatched = Report { freed_includes_others: None, ..r.clone() };
    let u = parse_all(&render(&outcome(Some(&unwatched)), &h, UNIX_EPOCH + Duration::from_millis(WHEN)));
    assert_eq!(value(&u, "dedupscan_freed_includes_others", None), -1.0);
    assert_eq!(value(&s, "dedupscan_pending_bytes", Some(("reason", "keep_free"))), 12288.0);
    assert_eq!(value(&s, "dedupscan_pending_bytes", Some(("reason", "no_space_share"))), 0.0);
    assert_eq!(value(&s, "dedupscan_rewritten_bytes", None), 16384.0);
    assert_eq!(value(&s, "dedupscan_pinned_bytes", None), 20480.0);
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
