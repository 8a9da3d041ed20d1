//! Savings you can see. `report --html`: a database with several runs (dry run, real run, scan)
//! and hostile file names on a real btrfs volume, rendered by the real
//! binary. The page must be one self-contained document whose markup no
//! name can change, with every section, SVG that parses, and the figures
//! of `report --json`. And `--metrics-file`: written on every exit path,
//! the locked one included, with stable series and lifetime counters.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

use common::*;
use dedupscan::corpus::Rng;

/// Names a user could give files, each an attempt to become markup.
const HOSTILE: [&str; 4] = [
    // A path, not a name: `/` cannot be in a name. The directory is
    // `<script>alert(1)<`, the file `script>`.
    "<script>alert(1)</script>",
    "\"><img src=x onerror=alert(2)>",
    "' onmouseover='alert(3)",
    "a&amp;b<svg onload=alert(4)>",
];

/// Elements the page may contain; anything else came from a name.
const ALLOWED: [&str; 26] = [
    "html", "head", "meta", "title", "style", "body", "header", "footer", "section", "h1", "h2", "p", "code", "div",
    "b", "span", "table", "thead", "tbody", "tr", "th", "td", "svg", "rect", "line", "text",
];
const ALLOWED_SVG_EXTRA: [&str; 2] = ["polyline", "circle"];

#[test]
fn html_report_is_escaped_complete_and_matches_json() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let data = vol.path("data");
    let payload = Rng::new(16).bytes(512 * 1024);
    let put = |rel: &str, bytes: &[u8]| {
        let p = data.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    };
    put("orig/a.bin", &payload);
    for name in HOSTILE {
        put(&format!("{name}/copy.bin"), &payload);
    }
    // Skipped by reason: a directory marked `.nodedup`.
    put("private/.nodedup", b"");
    put("private/a.bin", &payload);
    let data_s = data.to_str().unwrap();
    run_json(&vol, &[data_s, "--dry-run"]);
    let real = run_json(&vol, &[data_s]);
    assert!(real["freed_bytes"].as_i64().unwrap() > 0, "{real:#}");
    // New copies after the real run, only scanned: duplicates that remain,
    // under hostile names, in the directories and groups tables.
    let second = Rng::new(17).bytes(768 * 1024);
    for name in HOSTILE {
        put(&format!("{name}/new-{name}"), &second);
        put(&format!("more/{name}"), &second);
    }
    let db = vol.db();
    dedupscan().args(["scan", data_s, "--incremental"]).json().db(&db).expect(0).run();

    let json = db_report(&vol);
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("report.html");
    dedupscan().args(["report", "--html"]).arg(&file).db(&db).expect(0).run();
    // A page that cannot be written is an error, not a silent success.
    let bad = out.path().join("missing/report.html");
    let err = dedupscan().args(["report", "--html"]).arg(&bad).db(&db).expect(3).run().stderr;
    assert!(err.contains("cannot write"), "{err}");
    // A name planted as a symlink is replaced, never written through, and
    // the page is readable by its owner only (it names files in
    // directories only root may list).
    let victim = out.path().join("victim");
    std::fs::write(&victim, b"not a report").unwrap();
    let planted = out.path().join("planted.html");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    dedupscan().args(["report", "--html"]).arg(&planted).db(&db).expect(0).run();
    assert_eq!(std::fs::read(&victim).unwrap(), b"not a report", "written through a symlink");
    let m = std::fs::symlink_metadata(&planted).unwrap();
    assert!(m.is_file() && m.permissions().mode() & 0o777 == 0o600, "{m:?}");
    let page = std::fs::read_to_string(&file).unwrap();
    // scripts/screenshot-report.sh takes this page to draw it.
    if let Some(keep) = std::env::var_os("DEDUPSCAN_HTML_OUT") {
        std::fs::copy(&file, keep).unwrap();
    }
    check_page(&page, &json);
}

/// Every check the page must pass, against the `report --json` of the same
/// database.
fn check_page(page: &str, json: &serde_json::Value) {
    // No markup from a name, seen as raw text.
    let lower = page.to_ascii_lowercase();
    for bad in ["<script", "<img", "<svg onload", "<iframe", "javascript:"] {
        assert!(!lower.contains(bad), "page contains {bad:?}");
    }
    // Self-contained: nothing to fetch.
    for bad in ["http://", "https://", "src=\"", "href=\"", "@import", "url("] {
        let allowed_ns = page.matches("xmlns=\"http://www.w3.org/").count();
        let n = page.matches(bad).count();
        let n = if bad == "http://" { n - allowed_ns } else { n };
        assert_eq!(n, 0, "page refers outside itself: {bad:?}");
    }

    // The whole page is well-formed XML: parse it and walk every node.
    let doc = roxmltree::Document::parse_with_options(
        page,
        roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() },
    )
    .unwrap_or_else(|e| panic!("page is not well-formed: {e}"));
    let mut texts = String::new();
    for n in doc.descendants() {
        if n.is_element() {
            let name = n.tag_name().name();
            assert!(
                ALLOWED.contains(&name) || ALLOWED_SVG_EXTRA.contains(&name),
                "unexpected element <{name}> in the page"
            );
            for a in n.attributes() {
                let attr = a.name().to_ascii_lowercase();
                assert!(!attr.starts_with("on"), "event attribute {attr}");
                assert!(!["src", "href", "action", "style"].contains(&attr.as_str()), "attribute {attr}");
            }
        } else if n.is_text() {
            texts.push_str(n.text().unwrap());
            texts.push('\n');
        }
    }
    // The names are shown as text, exactly.
    for name in HOSTILE {
        assert!(texts.contains(name), "name {name:?} not shown as text");
    }

    // A policy that forbids scripts and loads nothing.
    let csp = doc
        .descendants()
        .find(|n| n.has_tag_name("meta") && n.attribute("http-equiv") == Some("Content-Security-Policy"))
        .and_then(|n| n.attribute("content"))
        .expect("a Content-Security-Policy meta");
    for want in ["default-src 'none'", "script-src 'none'", "style-src 'sha256-"] {
        assert!(csp.contains(want), "policy {csp:?} lacks {want:?}");
    }

    // Every section.
    let section = |id: &str| {
        doc.descendants()
            .find(|n| n.has_tag_name("section") && n.attribute("id") == Some(id))
            .unwrap_or_else(|| panic!("section {id} missing"))
    };
    for id in ["headline", "savings", "space", "directories", "groups", "skipped", "errors", "runs"] {
        section(id);
    }

    // Each SVG also parses on its own, as a standalone SVG document.
    let mut rest = page;
    let mut svgs = 0;
    while let Some(start) = rest.find("<svg") {
        let end = rest[start..].find("</svg>").expect("svg closed") + start + "</svg>".len();
        let svg = &rest[start..end];
        let d = roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("SVG does not parse: {e}\n{svg}"));
        assert_eq!(d.root_element().tag_name().namespace(), Some("http://www.w3.org/2000/svg"));
        svgs += 1;
        rest = &rest[end..];
    }
    assert!(svgs > 5, "only {svgs} SVG images");

    // Figures equal `report --json`.
    let mut figures = 0;
    for n in doc.descendants().filter(|n| n.attribute("data-figure").is_some()) {
        let key = n.attribute("data-figure").unwrap();
        let v: i64 = n.attribute("data-value").unwrap().parse().unwrap();
        assert_eq!(Some(v), json[key].as_i64(), "figure {key}");
        figures += 1;
    }
    assert!(figures >= 8, "only {figures} figures");
    assert!(json["unshared_bytes"].as_u64().unwrap() > 0, "the scan left duplicates: {json:#}");

    // Directories and groups: same rows, same order, same names.
    let rows = |id: &str| -> Vec<(String, u64)> {
        section(id)
            .descendants()
            .filter(|n| n.has_tag_name("tr") && n.attribute("data-bytes").is_some())
            .map(|tr| {
                let name = tr.descendants().find(|c| c.attribute("class") == Some("name")).unwrap();
                let text: String = name.descendants().filter(|t| t.is_text()).filter_map(|t| t.text()).collect();
                (text, tr.attribute("data-bytes").unwrap().parse().unwrap())
            })
            .collect()
    };
    let want_dirs: Vec<(String, u64)> = json["top_directories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (format!("{}/", d["directory"].as_str().unwrap()), d["unshared_bytes"].as_u64().unwrap()))
        .collect();
    assert!(!want_dirs.is_empty());
    assert_eq!(rows("directories"), want_dirs);
    let want_groups: Vec<(String, u64)> = json["largest_remaining_groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["source"].as_str().unwrap().to_owned(), g["unshared_bytes"].as_u64().unwrap()))
        .collect();
    assert_eq!(rows("groups"), want_groups);
    let dirs_text: String = want_dirs.iter().map(|d| d.0.as_str()).collect();
    assert!(HOSTILE.iter().any(|h| dirs_text.contains(h)), "no hostile directory among {want_dirs:?}");

    // The savings chart: one bar per finished run, freed and cumulated as
    // the runs' reports say, ending at freed_bytes_total.
    let bars: Vec<(i64, i64, i64)> = section("savings")
        .descendants()
        .filter(|n| n.has_tag_name("rect") && n.attribute("data-run").is_some())
        .map(|n| {
            let a = |k: &str| n.attribute(k).unwrap().parse::<i64>().unwrap();
            (a("data-run"), a("data-freed"), a("data-cumulative"))
        })
        .collect();
    let mut cum = 0;
    let want: Vec<(i64, i64, i64)> = json["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["report"].is_object())
        .map(|r| {
            let f = r["report"]["freed_bytes"].as_i64().unwrap();
            cum += f;
            (r["id"].as_i64().unwrap(), f, cum)
        })
        .collect();
    assert_eq!(want.len(), 3, "dry run, run, scan");
    assert_eq!(bars, want);
    assert_eq!(cum, json["freed_bytes_total"].as_i64().unwrap());

    // Skipped by reason: the last run's counts.
    let last = json["runs"].as_array().unwrap().last().unwrap();
    let skipped: BTreeMap<String, u64> = section("skipped")
        .descendants()
        .filter(|n| n.has_tag_name("tr") && n.attribute("data-count").is_some())
        .map(|tr| {
            let name = tr.descendants().find(|c| c.attribute("class") == Some("name")).unwrap();
            (name.text().unwrap().to_owned(), tr.attribute("data-count").unwrap().parse().unwrap())
        })
        .collect();
    let mut want: BTreeMap<String, u64> =
        serde_json::from_value(last["report"]["skipped"].clone()).expect("skipped is a map of counts");
    let dirs: BTreeMap<String, u64> =
        serde_json::from_value(last["report"]["skipped_dirs"].clone()).expect("skipped_dirs is a map of counts");
    want.extend(dirs.into_iter().map(|(k, v)| (format!("{k} (directories)"), v)));
    assert!(!want.is_empty(), "the .nodedup directory was skipped");
    assert_eq!(skipped, want);
}

/// `name{labels}` → value of every sample in a text exposition.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_owned(), value.parse().unwrap())
        })
        .collect()
}

/// The one sample of `name` (no labels beyond the volume's).
fn single(s: &BTreeMap<String, f64>, name: &str) -> f64 {
    let found: Vec<f64> = s.iter().filter(|(k, _)| k.split('{').next() == Some(name)).map(|(_, v)| *v).collect();
    assert_eq!(found.len(), 1, "{name}: {found:?}");
    found[0]
}

/// `promtool check metrics` on `text`, when promtool is installed (a
/// failure when the environment requires every tool).
fn promtool_check_metrics(text: &str) {
    use std::io::Write as _;
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        return skip("promtool is not installed (apt-get install prometheus): the metrics file is not checked with it");
    };
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics:\n{said}");
}

/// The metrics file survives every exit path: after a locked run (exit 4)
/// it says so, keeps the lifetime counters and the last success time, and
/// has exactly the series of the successful run before it.
#[test]
fn metrics_file_is_written_on_success_and_when_locked() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let data = vol.path("data");
    let payload = Rng::new(18).bytes(512 * 1024);
    std::fs::create_dir_all(&data).unwrap();
    for n in ["a", "b", "c"] {
        std::fs::write(data.join(n), &payload).unwrap();
    }
    let out = tempfile::tempdir().unwrap();
    let prom = out.path().join("dedupscan.prom");
    let db = vol.db();
    let args = [data.to_str().unwrap(), "--metrics-file", prom.to_str().unwrap()];
    dedupscan().args(args).db(&db).expect(0).run();
    let first_text = std::fs::read_to_string(&prom).unwrap();
    promtool_check_metrics(&first_text);
    let first = samples(&first_text);
    assert_eq!(single(&first, "dedupscan_last_exit_code"), 0.0);
    assert!(single(&first, "dedupscan_freed_bytes_total") > 0.0, "{first_text}");
    assert_eq!(single(&first, "dedupscan_deduped_bytes_total"), 2.0 * payload.len() as f64);
    let success = single(&first, "dedupscan_last_success_timestamp_seconds");
    assert!(success > 1e9);

    // Another run holds the lock: exit 4, and the file says so.
    let mut lock_path = db.clone().into_os_string();
    lock_path.push(".lock");
    let lock = std::fs::OpenOptions::new().write(true).open(&lock_path).unwrap();
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100)); // a later timestamp
    dedupscan().args(args).db(&db).expect(4).run();
    let locked_text = std::fs::read_to_string(&prom).unwrap();
    promtool_check_metrics(&locked_text);
    let locked = samples(&locked_text);
    assert_eq!(single(&locked, "dedupscan_last_exit_code"), 4.0);
    assert!(
        single(&locked, "dedupscan_last_run_timestamp_seconds")
            > single(&first, "dedupscan_last_run_timestamp_seconds")
    );
    assert_eq!(single(&locked, "dedupscan_last_success_timestamp_seconds"), success);
    assert_eq!(single(&locked, "dedupscan_freed_bytes_total"), single(&first, "dedupscan_freed_bytes_total"));
    // Same series, none vanished or appeared.
    let keys = |s: &BTreeMap<String, f64>| s.keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&locked), keys(&first));
}
