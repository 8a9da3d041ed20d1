//! Packaging checks: the systemd units pass `systemd-analyze verify`, the
//! generated man page and completions match the CLI, and the Debian
//! package's assets exist.
//!
//! Tools that may be missing (`systemd-analyze`, `man`, `promtool`) make a test skip
//! loudly; with `DEDUPSCAN_REQUIRE_FS_TESTS=1` (as in CI) a skip is a failure.
//! `packaging/ci-check.sh` installs them.

mod common;
#[path = "../examples/gen_docs/docs.rs"]
mod docs;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use clap::Parser;
use dedupscan::cli::Cli;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Whether `tool` can be run; if not, [`common::skip`] (a failure when the
/// environment requires these tests).
fn have_tool(tool: &str) -> bool {
    if Command::new(tool).arg("--version").output().is_ok() {
        return true;
    }
    common::skip(&format!(
        "{tool} is not installed (apt-get install systemd man-db prometheus, or run packaging/ci-check.sh)"
    ));
    false
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn generated_docs_are_up_to_date() {
    let mut stale = Vec::new();
    for file in docs::generate() {
        let committed = std::fs::read(root().join(&file.path)).unwrap_or_default();
        if committed != file.contents {
            stale.push(file.path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "generated files differ from the CLI definitions: {}\nrun `cargo run --example gen_docs` and commit the result",
        stale.join(", ")
    );
}

#[test]
fn man_page_documents_what_clap_does_not_know() {
    let page = docs::man_page();
    for needle in [
        ".SH \"EXIT STATUS\"",
        ".SH FILES",
        ".SH ENVIRONMENT",
        "user.nodedup",
        "\\fB.nodedup\\fR",
        "/var/lib/dedupscan/<filesystem\\-uuid>.sqlite",
        "<database>.lock",
        "DEDUPSCAN_DB",
        "\\-\\-metrics\\-file",
    ] {
        assert!(page.contains(needle), "man page lacks {needle:?}");
    }
    for code in 0..=6 {
        assert!(page.contains(&format!(".TP\n\\fB{code}\\fR\n")), "man page lacks exit status {code}");
    }
}

#[test]
fn man_page_renders_without_warnings() {
    if !have_tool("man") {
        return;
    }
    let out = Command::new("man")
        .args(["--warnings", "-l"])
        .arg(root().join("man/dedupscan.1"))
        .env("MANWIDTH", "80")
        .env("MAN_KEEP_FORMATTING", "0")
        .output()
        .expect("run man");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "man -l man/dedupscan.1:\n{stderr}");
    let shown = strip_overstrike(&String::from_utf8_lossy(&out.stdout));
    for section in ["SYNOPSIS", "OPTIONS", "COMMANDS", "EXIT STATUS", "EXCLUDING FILES", "FILES", "ENVIRONMENT"] {
        assert!(shown.lines().any(|l| l == section), "rendered page lacks section {section}");
    }
    for text in ["user.nodedup", "       .nodedup", "DEDUPSCAN_DB", "<database>.lock"] {
        assert!(shown.contains(text), "rendered page lacks {text:?}");
    }
}

/// `man` into a pipe still makes bold text as `X\bX`: keep the last of each.
fn strip_overstrike(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '\u{8}' {
            out.pop();
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn bash_completion_is_valid_shell() {
    let out = Command::new("bash").arg("-n").arg(root().join("packaging/completions/dedupscan.bash")).output();
    let out = out.expect("bash is installed");
    assert!(out.status.success(), "bash -n: {}", text(&out));
}

/// `Key=Value` lines of one unit file section (later lines win, as systemd
/// reads them, except for list settings which the caller handles).
fn unit_values(unit: &str, section: &str) -> Vec<(String, String)> {
    let mut current = String::new();
    let mut out = Vec::new();
    for line in unit.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') {
            current = line.to_owned();
        } else if current == format!("[{section}]") {
            let (k, v) = line.split_once('=').unwrap_or_else(|| panic!("not Key=Value: {line}"));
            out.push((k.to_owned(), v.to_owned()));
        }
    }
    out
}

fn get<'a>(values: &'a [(String, String)], key: &str) -> Option<&'a str> {
    values.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

#[test]
fn service_unit_settings() {
    let unit = read("packaging/systemd/dedupscan@.service");
    let s = unit_values(&unit, "Service");
    for (key, want) in [
        ("Type", "oneshot"),
        (
            "ExecStart",
            "/usr/bin/dedupscan %f --incremental --drop-cache --progress never $DEDUPSCAN_OPTIONS $DEDUPSCAN_VOLUME_OPTIONS",
        ),
        // Per-file errors and a locked database are not failures.
        ("SuccessExitStatus", "1 4 5"),
        ("MemoryHigh", "1G"),
        ("StartupCPUWeight", "5"),
        ("StartupIOWeight", "5"),
        ("TimeoutStartSec", "7h"),
        ("IOSchedulingClass", "idle"),
        ("Nice", "19"),
        ("CPUWeight", "20"),
        ("ProtectSystem", "strict"),
        ("StateDirectory", "dedupscan"),
        ("PrivateNetwork", "yes"),
        ("NoNewPrivileges", "yes"),
        ("CapabilityBoundingSet", "CAP_DAC_READ_SEARCH CAP_DAC_OVERRIDE CAP_SYS_ADMIN CAP_FOWNER"),
    ] {
        assert_eq!(get(&s, key), Some(want), "dedupscan@.service: {key}");
    }
    // @privileged is denied, fanotify given back after it (order matters).
    let filters: Vec<&str> = s.iter().filter(|(k, _)| k == "SystemCallFilter").map(|(_, v)| v.as_str()).collect();
    assert_eq!(filters, ["@system-service", "~@privileged @resources", "fanotify_init fanotify_mark"]);
    // ProtectHome=yes/tmpfs would hide a volume under /home, read-only would
    // make sharing fail there with EROFS.
    assert_eq!(get(&s, "ProtectHome"), None, "dedupscan@.service must not set ProtectHome=");
    assert_eq!(get(&unit_values(&unit, "Unit"), "RequiresMountsFor"), Some("%f"));

    // FIDEDUPERANGE needs the destination's mount writable (EROFS
    // otherwise): the volume, and the metrics collector's directory if any.
    let rw: Vec<&str> = s.iter().filter(|(k, _)| k == "ReadWritePaths").map(|(_, v)| v.as_str()).collect();
    assert_eq!(rw, ["%f", "-/var/lib/prometheus/node-exporter"]);
    // Options come from environment files (the first a conffile), not from
    // drop-ins replacing ExecStart.
    let env: Vec<&str> = s.iter().filter(|(k, _)| k == "EnvironmentFile").map(|(_, v)| v.as_str()).collect();
    assert_eq!(env, ["-/etc/default/dedupscan", "-/etc/dedupscan/%i.conf"]);

    // The command line, with the shipped defaults, is one the CLI accepts.
    let defaults = read("packaging/default/dedupscan");
    let options = defaults
        .lines()
        .find_map(|l| l.strip_prefix("DEDUPSCAN_OPTIONS="))
        .expect("/etc/default/dedupscan sets DEDUPSCAN_OPTIONS")
        .trim_matches('"')
        .to_owned();
    let exec = get(&s, "ExecStart")
        .unwrap()
        .replace("%f", "/srv")
        .replace("$DEDUPSCAN_OPTIONS", &options)
        .replace("$DEDUPSCAN_VOLUME_OPTIONS", "");
    let cli = Cli::try_parse_from(exec.split_whitespace()).unwrap_or_else(|e| panic!("ExecStart: {e}"));
    assert!(cli.command.is_none() && cli.run.scan.incremental && !cli.run.dry_run);
    assert_eq!(cli.run.scan.paths, vec![PathBuf::from("/srv")]);
    // A default time cap, inside the unit's own hard cap.
    assert_eq!(cli.run.scan.max_runtime, Some(std::time::Duration::from_secs(6 * 3600)));
}

#[test]
fn timer_unit_settings() {
    let t = unit_values(&read("packaging/systemd/dedupscan@.timer"), "Timer");
    assert_eq!(get(&t, "OnCalendar"), Some("daily"));
    assert_eq!(get(&t, "Persistent"), Some("true"));
    assert_eq!(get(&t, "RandomizedDelaySec"), Some("1h"));
    let i = unit_values(&read("packaging/systemd/dedupscan@.timer"), "Install");
    assert_eq!(get(&i, "WantedBy"), Some("timers.target"));
}

/// Instance name of `path` as `systemd-escape --path` makes it.
fn escape_path(path: &str) -> String {
    let out = Command::new("systemd-escape").args(["--path", path]).output().expect("systemd-escape");
    assert!(out.status.success(), "systemd-escape: {}", text(&out));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn systemd_units_verify() {
    if !have_tool("systemd-analyze") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let instance = escape_path("/srv/data");
    assert_eq!(instance, "srv-data");
    // `verify` checks that ExecStart's binary exists: use the one just built.
    let service = read("packaging/systemd/dedupscan@.service");
    assert!(service.contains("ExecStart=/usr/bin/dedupscan %f "), "ExecStart changed; update this test");
    let service =
        service.replace("ExecStart=/usr/bin/dedupscan", &format!("ExecStart={}", env!("CARGO_BIN_EXE_dedupscan")));
    let timer = read("packaging/systemd/dedupscan@.timer");
    let mut units = Vec::new();
    for (name, body) in [
        (format!("dedupscan@{instance}.service"), &service),
        (format!("dedupscan@{instance}.timer"), &timer),
        ("dedupscan@.service".to_owned(), &service),
    ] {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        units.push(p);
    }
    // `verify` also looks up Documentation=man:dedupscan(1) with man(1):
    // point it at the page from this tree.
    let man1 = dir.path().join("man/man1");
    std::fs::create_dir_all(&man1).unwrap();
    std::fs::copy(root().join("man/dedupscan.1"), man1.join("dedupscan.1")).unwrap();
    let mut cmd = Command::new("systemd-analyze");
    cmd.arg("verify").env("MANPATH", dir.path().join("man")).env("SYSTEMD_LOG_COLOR", "0");
    if Command::new("man").arg("--version").output().is_err() {
        eprintln!("note: man is not installed; verifying without checking Documentation=");
        cmd.arg("--man=no");
    }
    let out = cmd.args(&units).output().expect("run systemd-analyze verify");
    // A clean verify prints nothing. Unknown keys and bad values are only
    // warnings (exit status 0), so any line about our units is a failure;
    // lines about the host's own units are shown but not held against us.
    let report = text(&out);
    let ours: Vec<&str> =
        report.lines().filter(|l| l.contains("dedupscan") || l.contains(dir.path().to_str().unwrap())).collect();
    if !report.trim().is_empty() && ours.is_empty() {
        eprintln!("note: systemd-analyze verify said, about other units:\n{report}");
    }
    assert!(out.status.success() && ours.is_empty(), "systemd-analyze verify found problems:\n{report}");

    // The hardening stays at systemd's "OK" exposure level or better (the
    // units scored 1.5 when written; 2.5 leaves room for systemd's scoring
    // to change). `--offline` needs systemd 250.
    let sec = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--threshold=25", "--no-pager"])
        .arg(&units[0])
        .env("MANPATH", dir.path().join("man"))
        .output()
        .expect("run systemd-analyze security");
    let sec_text = text(&sec);
    if sec_text.contains("unrecognized option") || sec_text.contains("Unknown option") {
        eprintln!("note: this systemd-analyze has no `security --offline`; exposure not checked");
    } else {
        let last = sec_text.lines().rev().find(|l| l.contains("Overall exposure")).unwrap_or("(no score)");
        assert!(sec.status.success(), "dedupscan@.service exposure above 2.5: {last}\n{sec_text}");
    }
}

#[test]
fn debian_assets_exist() {
    let manifest = read("packaging/debian/install");
    let mut dests = Vec::new();
    for line in manifest.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 3, "SOURCE DESTINATION MODE: {line}");
        dests.push(f[1].to_owned());
        if f[0].starts_with("target/release/") {
            continue; // built by build-deb.sh
        }
        assert!(root().join(f[0]).is_file(), "deb asset {} does not exist", f[0]);
    }
    for want in [
        "usr/bin/",
        "lib/systemd/system/",
        "etc/default/dedupscan",
        "usr/share/man/man1/dedupscan.1.gz",
        "usr/share/bash-completion/completions/dedupscan",
        "usr/share/doc/dedupscan/changelog.Debian.gz",
        "usr/share/doc/dedupscan/schema/",
    ] {
        assert!(dests.iter().any(|d| d == want), "the package lacks {want}");
    }
    for script in ["postinst", "prerm", "postrm"] {
        let path = root().join("packaging/debian").join(script);
        let out = Command::new("sh").arg("-n").arg(&path).output().expect("sh");
        assert!(out.status.success(), "{script}: {}", text(&out));
        use std::os::unix::fs::PermissionsExt;
        assert!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o111 != 0, "{script} is not executable");
        // lintian: maintainer scripts use deb-systemd-helper/-invoke, and
        // call systemctl for daemon-reload only.
        for line in read(&format!("packaging/debian/{script}")).lines() {
            let code = line.split('#').next().unwrap();
            assert!(!code.contains("systemctl") || code.contains("daemon-reload"), "{script}: {line}");
        }
    }
    // The Debian changelog names the crate's version.
    let version = env!("CARGO_PKG_VERSION");
    assert!(read("packaging/debian/changelog").starts_with(&format!("dedupscan ({version}-")));
}

#[test]
fn man_page_has_a_date_no_backticks_and_references() {
    let page = read("man/dedupscan.1");
    let th = page.lines().find(|l| l.starts_with(".TH ")).expect(".TH line");
    assert!(th.starts_with(&format!(".TH DEDUPSCAN 1 \"{}\" ", docs::release_date())), "{th}");
    assert!(docs::release_date().len() == 10 && !th.contains("\"\""), "{th}");
    assert!(!page.contains('`'), "literal backticks in the man page");
    let see_also = page.split(".SH \"SEE ALSO\"").nth(1).expect("SEE ALSO");
    for r in ["ioctl_fideduperange", "ioctl_fiemap", "compsize", "duperemove", "systemd.exec", "btrfs", "xfs"] {
        assert!(see_also.contains(&format!("\\fB{r}\\fR(")), "SEE ALSO lacks {r}");
    }
}

/// What bash completion offers for the words `line` (the last one being
/// completed), in a directory holding a file and a subdirectory.
fn complete_bash(line: &[&str]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("afile"), "").unwrap();
    std::fs::create_dir(dir.path().join("adir")).unwrap();
    let words = line.iter().map(|w| format!("'{w}'")).collect::<Vec<_>>().join(" ");
    let script = format!(
        "source {}; COMP_WORDS=({words}); COMP_CWORD={}; COMP_LINE=\"{}\"; COMP_POINT=${{#COMP_LINE}}; _dedupscan dedupscan '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"; complete -p dedupscan",
        root().join("packaging/completions/dedupscan.bash").display(),
        line.len() - 1,
        line.join(" "),
        line[line.len() - 1],
        line[line.len() - 2],
    );
    let out = Command::new("bash").arg("-c").arg(&script).current_dir(dir.path()).output().expect("bash");
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).map(str::to_owned).collect()
}

#[test]
fn bash_completion_offers_no_file_names_for_numbers_and_directories_for_paths() {
    for opt in ["--threads", "--block-size", "--min-range", "--max-runtime", "--rewrite-ratio", "--exclude"] {
        let got = complete_bash(&["dedupscan", opt, "a"]);
        assert!(!got.iter().any(|w| w == "afile" || w == "adir"), "{opt} offers file names: {got:?}");
    }
    for opt in ["--db", "--exclude-from", "--metrics-file"] {
        let got = complete_bash(&["dedupscan", opt, "a"]);
        assert!(got.iter().any(|w| w == "afile"), "{opt} offers no files: {got:?}");
    }
    // Paths: nothing from the function, so bash falls back to directory
    // names (`-o dirnames`), not to every file.
    let got = complete_bash(&["dedupscan", "report", "a"]);
    assert!(got.iter().all(|w| w.starts_with("complete ")), "{got:?}");
    assert!(got.last().unwrap().contains("-o dirnames"), "{got:?}");
}

#[test]
fn promtool_checks_and_tests_the_alert_rules() {
    if !have_tool("promtool") {
        return;
    }
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(root().join("packaging/prometheus-alerts.yml"))
        .output()
        .expect("promtool");
    assert!(out.status.success(), "promtool check rules:\n{}", text(&out));
    // And they fire when they should (and not before): unit tests with
    // synthetic series.
    let out = Command::new("promtool")
        .args(["test", "rules", "prometheus-alerts.test.yml"])
        .current_dir(root().join("packaging"))
        .output()
        .expect("promtool");
    assert!(out.status.success(), "promtool test rules:\n{}", text(&out));
}

/// Every `dedupscan_*` name the dashboard and the alerts use is one the
/// metrics file has.
#[test]
fn dashboard_and_alerts_use_existing_metrics() {
    let outcome = dedupscan::metrics::Outcome::default();
    let exposition = dedupscan::metrics::render(&outcome, &[], std::time::SystemTime::now());
    let known: std::collections::BTreeSet<&str> =
        exposition.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
    let dashboard = read("packaging/grafana-dashboard.json");
    let v: serde_json::Value = serde_json::from_str(&dashboard).expect("dashboard is JSON");
    assert!(v["panels"].as_array().is_some_and(|p| p.len() >= 8));
    for (file, body) in [("dashboard", dashboard), ("alerts", read("packaging/prometheus-alerts.yml"))] {
        let mut used = 0;
        for word in body.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("dedupscan_") && word.len() > "dedupscan_".len() {
                assert!(known.contains(word), "{file} uses {word}, which the metrics file does not have");
                used += 1;
            }
        }
        assert!(used >= 4, "{file} uses only {used} metrics");
    }
}
