//! What a person reads: counts that add up, the report's text and JSON
//! (dates, units, tables, on-disk usage counted once per extent, directories
//! rolled up, interrupted runs, `--list`), progress lines with units, one
//! message style, each errno once, database errors with path and advice,
//! and journal priorities. All on the real binary over real volumes.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use dedupscan::corpus::Rng;

/// `report --json` on the volume's database plus `extra`, validated.
fn report_json(vol: &Volume, extra: &[&str]) -> serde_json::Value {
    let json = dedupscan().arg("report").json().db(vol.db()).args(extra).expect(0).run().json;
    validate_db_report(&json);
    json
}

/// `report` as text on the volume's database plus `extra`: (stdout, stderr).
fn report_text(vol: &Volume, extra: &[&str]) -> (String, String) {
    let out = dedupscan().arg("report").db(vol.db()).args(extra).expect(0).run();
    (out.stdout, out.stderr)
}

/// considered = hashed + unchanged + moved + unreadable, every run.
fn assert_identity(r: &serde_json::Value) {
    let sum = num(r, "files_hashed") + num(r, "files_unchanged") + num(r, "files_renamed") + num(r, "files_failed");
    assert_eq!(num(r, "files_scanned"), sum, "considered != hashed + unchanged + moved + failed: {r:#}");
}

/// A tree with large duplicates, small duplicates (inline on btrfs), hard
/// links met in varying order by the parallel crawl, a directory marked
/// nodedup holding several files, and one file marked nodedup.
fn counting_tree(root: &Path) {
    let mut rng = Rng::new(77);
    let big = rng.bytes(256 * 1024);
    for d in ["a", "b", "c"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
        std::fs::write(root.join(d).join("big.bin"), &big).unwrap();
    }
    let small = rng.bytes(900);
    for i in 0..6 {
        std::fs::write(root.join(format!("a/small{i}.txt")), &small).unwrap();
    }
    // 40 inodes with two names each, in different directories.
    std::fs::create_dir_all(root.join("links1")).unwrap();
    std::fs::create_dir_all(root.join("links2")).unwrap();
    for i in 0..40 {
        let p = root.join(format!("links1/f{i}"));
        std::fs::write(&p, rng.bytes(5000 + i)).unwrap();
        std::fs::hard_link(&p, root.join(format!("links2/f{i}"))).unwrap();
    }
    let prot = root.join("protected");
    std::fs::create_dir_all(&prot).unwrap();
    for i in 0..3 {
        std::fs::write(prot.join(format!("p{i}")), &big).unwrap();
    }
    set_nodedup(&prot);
    std::fs::write(root.join("c/marked.bin"), &big).unwrap();
    set_nodedup(&root.join("c/marked.bin"));
}

#[test]
fn counts_add_up_on_every_run() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let d = vol.path("d");
    counting_tree(&d);
    let before = Snapshot::take(&d);

    let first = run_json(&vol, &[s(&d)]);
    assert_identity(&first);
    // 3 big + 6 small + 40 linked inodes (once each); the marked file and
    // the marked directory's 3 files are not considered.
    assert_eq!(num(&first, "files_scanned"), 49, "{first:#}");
    assert_eq!(num(&first, "files_hashed"), 49, "{first:#}");
    let sizes = 3 * 256 * 1024 + 6 * 900 + (0..40).map(|i| 5000 + i).sum::<u64>();
    assert_eq!(num(&first, "logical_bytes"), sizes, "the sizes of the files considered: {first:#}");
    assert_eq!(first["skipped"]["nodedup"].as_u64(), Some(1), "one file marked: {first:#}");
    assert_eq!(first["skipped_dirs"]["nodedup"].as_u64(), Some(1), "one directory marked: {first:#}");
    assert_eq!(first["skipped"]["hardlink"].as_u64(), Some(40), "{first:#}");

    before.assert_same(&Snapshot::take(&d));
    std::fs::rename(d.join("b/big.bin"), d.join("b/moved.bin")).unwrap();
    let before = Snapshot::take(&d);
    let mut inline = Vec::new();
    for run in 2..=4 {
        let r = run_json(&vol, &[s(&d), "--incremental"]);
        assert_identity(&r);
        assert_eq!(num(&r, "files_scanned"), 49, "run {run}: {r:#}");
        assert!(num(&r, "files_unchanged") <= num(&r, "files_scanned"), "run {run}: {r:#}");
        let moved = if run == 2 { 1 } else { 0 };
        assert_eq!(num(&r, "files_renamed"), moved, "run {run}: hard links are not moves: {r:#}");
        assert_eq!(num(&r, "files_unchanged"), 49 - moved, "run {run}: {r:#}");
        inline.push(r["skipped"]["inline"].as_u64().unwrap_or(0));
    }
    // Full (not incremental) reruns: everything hashed again, same counts.
    for run in 5..=6 {
        let r = run_json(&vol, &[s(&d)]);
        assert_identity(&r);
        assert_eq!(num(&r, "files_scanned"), 49, "run {run}: {r:#}");
        inline.push(r["skipped"]["inline"].as_u64().unwrap_or(0));
    }
    assert_eq!(inline[inline.len() - 1], inline[inline.len() - 2], "inline count changed between full reruns");
    before.assert_same(&Snapshot::take(&d));
}

/// Seconds since the epoch as text would be a run of 10 digits.
fn has_epoch_seconds(text: &str) -> bool {
    text.split(|c: char| !c.is_ascii_digit()).any(|w| w.len() == 10 && w.starts_with('1'))
}

fn is_iso_utc(s: &str) -> bool {
    let b = s.as_bytes();
    s.len() == 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'Z'
        && s.chars().filter(char::is_ascii_digit).count() == 14
}

#[test]
fn the_report_reads_at_a_glance_and_counts_each_extent_once() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let d = vol.path("d");
    let mut rng = Rng::new(9);
    let payload = rng.bytes(2 << 20);
    for sub in ["x/one", "x/two", "y"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    for (i, f) in ["x/one/a", "x/one/b", "x/two/c", "y/d"].iter().enumerate() {
        let _ = i;
        std::fs::write(d.join(f), &payload).unwrap();
    }
    std::fs::write(d.join("y/unique"), rng.bytes(1 << 20)).unwrap();
    let before = Snapshot::take(&d);

    // Before sharing: four copies on disk, each counted.
    run_json(&vol, &["scan", s(&d)]);
    let pre = report_json(&vol, &[]);
    let copy = payload.len() as u64;
    assert_eq!(num(&pre, "on_disk_bytes"), 4 * copy + (1 << 20), "{pre:#}");
    assert_eq!(num(&pre, "unshared_bytes"), 3 * copy, "{pre:#}");
    // Rolled up like du: x holds x/one and x/two; the root holds all.
    let dirs: Vec<(String, u64)> = pre["top_directories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["directory"].as_str().unwrap().to_owned(), e["unshared_bytes"].as_u64().unwrap()))
        .collect();
    let of = |p: &Path| dirs.iter().find(|(k, _)| k == s(p)).map(|(_, v)| *v);
    assert_eq!(of(&d), Some(3 * copy), "{dirs:?}");
    assert_eq!(of(&d.join("x")), Some(2 * copy), "{dirs:?}");
    assert_eq!(of(&d.join("x/one")), Some(copy), "{dirs:?}");
    assert_eq!(of(&d.join("y")), Some(copy), "{dirs:?}");

    // After sharing: the copies use one extent; on disk falls by what
    // statfs says was freed, while st_blocks summed per file does not.
    let run = run_json(&vol, &[s(&d)]);
    let post = report_json(&vol, &[]);
    before.assert_same(&Snapshot::take(&d));
    assert_eq!(num(&post, "on_disk_bytes"), copy + (1 << 20), "{post:#}");
    assert!(num(&post, "allocated_bytes") >= 4 * copy, "st_blocks count shared blocks per file: {post:#}");
    let freed = run["freed_bytes"].as_i64().unwrap();
    let fell = num(&pre, "on_disk_bytes") as i64 - num(&post, "on_disk_bytes") as i64;
    assert!((fell - freed).abs() <= 1 << 20, "on disk fell by {fell}, statfs freed {freed}");
    assert_eq!(num(&post, "unshared_bytes"), 0, "{post:#}");

    // Runs carry ISO dates and a status.
    let runs = post["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for r in runs {
        assert!(is_iso_utc(r["started"].as_str().unwrap()), "{r:#}");
        assert!(is_iso_utc(r["finished"].as_str().unwrap()), "{r:#}");
        assert_eq!(r["status"], "finished");
    }

    // The text: a table per section, units everywhere, ISO dates, no epoch.
    let (text, _) = report_text(&vol, &[]);
    for want in ["  files ", "  space ", "on disk", "not yet shared", "  run ", "started (UTC)", "freed so far"] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }
    assert!(!has_epoch_seconds(&text), "epoch seconds in:\n{text}");
    assert!(text.contains(runs[1]["started"].as_str().unwrap()), "{text}");
    // The run's freed figure is shown with a unit, not in raw bytes.
    let run_line = text.lines().find(|l| l.trim_start().starts_with("2 ")).unwrap_or_else(|| panic!("{text}"));
    assert!(run_line.contains(" MiB") && !run_line.contains(&freed.to_string()), "{run_line}");
    // Every byte figure of the text has a unit: no bare number of 4+ digits
    // outside dates, ids and UUIDs.
    for line in text.lines().filter(|l| !l.contains("filesystem") && !l.contains('T')) {
        let bare = line.split_whitespace().any(|w| w.len() >= 4 && w.chars().all(|c| c.is_ascii_digit()));
        assert!(!bare, "a number without a unit: {line:?}\n{text}");
    }
    // Tables line up: the header's last column ends where the values end.
    let head = text.lines().find(|l| l.starts_with("  files ")).unwrap();
    let known = text.lines().find(|l| l.starts_with("  known ")).unwrap();
    assert_eq!(head.len(), known.len(), "columns do not line up:\n{head}\n{known}");
}

#[test]
fn interrupted_runs_are_marked_in_the_history() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(3);
    for i in 0..200 {
        std::fs::write(d.join(format!("f{i}")), rng.bytes(20_000)).unwrap();
    }
    let db = vol.db();
    let out = dedupscan().arg(&d).args(["--max-runtime", "1ns"]).json().db(&db).run();
    let (json, err) = (out.json, out.stderr);
    assert_eq!(json["interrupted"], true, "{err}");
    assert_identity(&json);
    let r = report_json(&vol, &[]);
    assert_eq!(r["runs"][0]["status"], "interrupted", "{r:#}");
    let (text, _) = report_text(&vol, &[]);
    assert!(text.contains("INTERRUPTED"), "{text}");
}

#[test]
fn list_shows_what_would_be_and_what_was_shared() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let payload = Rng::new(12).bytes(300 * 1024);
    std::fs::write(d.join("orig"), &payload).unwrap();
    std::fs::write(d.join("copy"), &payload).unwrap();
    // The same bytes at offset 8 KiB of a bigger file.
    let mut shifted = Rng::new(13).bytes(8192);
    shifted.extend_from_slice(&payload);
    std::fs::write(d.join("shifted"), &shifted).unwrap();
    let before = Snapshot::take(&d);

    let dry = run_json(&vol, &[s(&d), "--dry-run", "--list"]);
    let ranges = dry["ranges"].as_array().unwrap_or_else(|| panic!("no ranges: {dry:#}"));
    assert!(!ranges.is_empty());
    let total: u64 = ranges.iter().map(|r| r["bytes"].as_u64().unwrap()).sum();
    assert_eq!(total, num(&dry, "duplicate_bytes"), "{dry:#}");
    let shifted_s = s(&d.join("shifted")).to_owned();
    assert!(
        ranges.iter().any(|r| r["destination"] == shifted_s.as_str() && r["destination_offset"] == 8192)
            || ranges.iter().any(|r| r["source"] == shifted_s.as_str() && r["source_offset"] == 8192),
        "the shifted copy at offset 8 KiB is listed: {ranges:#?}"
    );
    // The text lists the same, one row per range.
    let db = vol.db();
    let out = dedupscan().arg(&d).args(["--dry-run", "--list"]).db(&db).expect(0).run().stdout;
    assert!(out.contains(&format!("{} ranges:", ranges.len())), "{out}");
    assert!(out.contains(&shifted_s) && out.contains("8192"), "{out}");
    // Read back from the temporary file a long list waits in (tiny limits:
    // one entry in memory), the same list, as JSON and as text.
    let small = |json: bool| {
        let c = dedupscan().arg(&d).args(["--dry-run", "--list"]).db(&db).env("DEDUPSCAN_TEST_SMALL_BATCHES", "1");
        if json { c.json() } else { c }.expect(0).run().stdout
    };
    let sorted = |v: &serde_json::Value| {
        let mut r: Vec<String> = v.as_array().unwrap().iter().map(|r| r.to_string()).collect();
        r.sort();
        r
    };
    let spilled: serde_json::Value = serde_json::from_str(&small(true)).unwrap();
    assert_eq!(sorted(&spilled["ranges"]), sorted(&dry["ranges"]), "{spilled:#}");
    let text = small(false);
    assert_eq!(
        text.lines().filter(|l| l.contains(&shifted_s)).count(),
        out.lines().filter(|l| l.contains(&shifted_s)).count()
    );
    assert!(text.contains(&format!("{} ranges:", ranges.len())), "{text}");
    // The database's history keeps each run's numbers, never its list (as
    // long as the plan: FULL's made one row 27 MB).
    let c = rusqlite::Connection::open(&db).unwrap();
    let stored: Vec<String> = c
        .prepare("SELECT report FROM runs")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(
        stored.len() >= 3 && stored.iter().all(|r| !r.contains("\"ranges\"") && r.contains("ranges_planned")),
        "{stored:?}"
    );
    before.assert_same(&Snapshot::take(&d));
    // Without --list, no list.
    assert!(run_json(&vol, &[s(&d), "--dry-run"]).get("ranges").is_none());

    // After sharing, report --list says each range is shared now.
    run_json(&vol, &[s(&d)]);
    let r = report_json(&vol, &["--list"]);
    let listed = r["ranges"].as_array().unwrap();
    assert!(!listed.is_empty());
    for l in listed {
        assert_eq!(l["state"], "shared", "{l:#}");
        assert_eq!(l["unshared_bytes"], 0, "{l:#}");
    }
    let (text, _) = report_text(&vol, &["--list"]);
    assert!(text.contains(&format!("{} ranges:", listed.len())) && text.contains(" shared"), "{text}");
    before.assert_same(&Snapshot::take(&d));
}

#[test]
fn progress_lines_without_a_terminal_have_units_totals_and_eta() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(5);
    for i in 0..30 {
        std::fs::write(d.join(format!("f{i}")), rng.bytes(1 << 20)).unwrap();
    }
    let db = vol.db();
    let every_step = || dedupscan().env("DEDUPSCAN_PROGRESS_INTERVAL", "0");
    let err = every_step().arg("scan").arg(&d).db(&db).expect(0).run().stderr;
    let scan: Vec<&str> = err.lines().filter(|l| l.starts_with("1/3 scan: ")).collect();
    assert!(scan.iter().any(|l| l.contains("30.0 MiB in 30 files to go through")), "no total once crawled:\n{err}");
    let with_total: Vec<&&str> = scan.iter().filter(|l| l.contains(" of 30.0 MiB (")).collect();
    assert!(!with_total.is_empty(), "no status line with the total:\n{err}");
    assert!(with_total.iter().all(|l| l.contains(" of 30 files") && l.contains("/s")), "{with_total:#?}");
    // No raw byte counts: every amount has a unit.
    for l in &scan {
        let mut words = l["1/3 scan: ".len()..].split(' ');
        let (amount, unit) = (words.next().unwrap(), words.next().unwrap_or(""));
        assert!(amount.parse::<u64>().is_err() || unit == "B" || unit.starts_with("files"), "raw number: {l}");
    }
    assert!(!err.contains('\r') && !err.contains('\x1b'), "{err:?}");

    // The report shows progress too while it measures files and ranges.
    let err = every_step().arg("report").db(&db).expect(0).run().stderr;
    assert!(err.lines().any(|l| l.starts_with("report: measuring files: ") && l.contains(" of 30 ")), "{err}");
}

#[test]
fn warnings_have_one_shape_and_go_to_the_journal_with_their_priority() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let d = vol.path("d");
    std::fs::create_dir_all(d.join("sub")).unwrap();
    std::fs::write(d.join("sub/f"), b"data").unwrap();
    set_nodedup(&d);
    let db = vol.db();
    let sub = d.join("sub");
    let scan = dedupscan().arg("scan").arg(&sub).db(&db);
    let err = scan.clone().expect(0).expect(1).run().stderr;
    let warn = format!("dedupscan: warning: {}: skipped, a directory above it is marked nodedup", s(&sub));
    assert!(err.lines().any(|l| l == warn), "want {warn:?} in:\n{err}");

    // stderr is a file; JOURNAL_STREAM names it as systemd would.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr");
    let file = std::fs::File::create(&log).unwrap();
    let st = file.metadata().unwrap();
    let journal = format!("{}:{}", st.dev(), st.ino());
    let run = |journal: &str| -> String {
        let f = std::fs::File::create(&log).unwrap();
        let status = scan
            .clone()
            .env("JOURNAL_STREAM", journal)
            .command()
            .stderr(f)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.code().is_some());
        std::fs::read_to_string(&log).unwrap()
    };
    let err = run(&journal);
    assert!(err.lines().any(|l| l == format!("<4>{warn}")), "no <4> warning in:\n{err}");
    for l in err.lines() {
        assert!(l.starts_with("<3>") || l.starts_with("<4>") || l.starts_with("<6>"), "line without priority: {l:?}");
    }
    // A JOURNAL_STREAM naming another stream (stderr redirected) means no prefix.
    let err = run(&format!("{}:{}", st.dev(), st.ino() + 1));
    assert!(err.lines().any(|l| l == warn), "{err}");
    assert!(!err.contains("<4>"), "{err}");
    drop(file);

    // A fatal error is `<3>` in the journal.
    let missing = d.join("missing");
    let f = std::fs::File::create(&log).unwrap();
    let status =
        dedupscan().arg("report").db(&missing).env("JOURNAL_STREAM", &journal).command().stderr(f).status().unwrap();
    assert_eq!(status.code(), Some(3));
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(err.starts_with("<3>dedupscan: error: no database at "), "{err}");
}

#[test]
fn each_errno_is_said_once_and_database_errors_say_where_and_what_to_do() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let payload = Rng::new(2).bytes(200_000);
    for f in ["a", "b"] {
        std::fs::write(d.join(f), &payload).unwrap();
    }
    // A database on a read-only filesystem.
    let ro = Tmpfs::new("ro,size=1m");
    let ro_db: PathBuf = ro.path().join("sub/db.sqlite");
    let err = dedupscan().arg("scan").arg(&d).db(&ro_db).expect(3).run().stderr;
    assert_eq!(err.matches("Read-only file system").count(), 1, "errno said more than once: {err}");
    assert!(err.starts_with("dedupscan: error: ") && err.contains(s(&ro_db)), "{err}");
    drop(ro);

    // A database damaged inside (its header intact): path and advice.
    run_json(&vol, &["scan", s(&d)]);
    let db = vol.db();
    let mut bytes = std::fs::read(&db).unwrap();
    assert!(bytes.len() > 8192, "database too small to damage: {}", bytes.len());
    let page = u16::from_be_bytes([bytes[16], bytes[17]]) as usize;
    let page = if page == 1 { 65536 } else { page };
    let garbage = Rng::new(8).bytes(bytes.len() - page);
    bytes[page..].copy_from_slice(&garbage);
    std::fs::write(&db, &bytes).unwrap();
    for side in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{side}", s(&db)));
    }
    let err = dedupscan().arg("report").db(&db).expect(3).run().stderr;
    assert!(err.contains(s(&db)), "no path in: {err}");
    assert!(err.contains("move it aside"), "no advice in: {err}");
    assert_eq!(err.matches("malformed").count(), 1, "said more than once: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn bars_on_a_terminal_show_totals_file_counts_and_a_moving_plan_phase() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    if Command::new("script").arg("--version").output().is_err() {
        return skip("no script(1) (bsdutils) to run the binary on a terminal");
    }
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(21);
    let payload = rng.bytes(3 << 20);
    for i in 0..40 {
        // Every other file a copy, so the share phase has work.
        let data = if i % 2 == 0 { payload.clone() } else { rng.bytes(3 << 20) };
        std::fs::write(d.join(format!("f{i:02}")), data).unwrap();
    }
    vol.remount();
    let bin = bin();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("tty");
    let on_tty = |term: &str, db: &std::path::Path, extra: &str| {
        let cmd = format!("{} {} --db {} {extra} > /dev/null", bin.display(), s(&d), s(db));
        let st = Command::new("script")
            .args(["-qfec", &cmd])
            .arg(&log)
            .env("TERM", term)
            .stdout(std::process::Stdio::null())
            .status();
        assert!(st.unwrap().success());
        std::fs::read_to_string(&log).unwrap()
    };
    // A terminal that cannot move the cursor (TERM=dumb, as in a chroot or
    // an Emacs shell) gets the plain lines of a pipe, not a silent bar.
    // A dry run leaves the volume as it is for the next run.
    let dumb = on_tty("dumb", &dir.path().join("dumb.sqlite"), "--dry-run");
    // (The terminal turns each \n into \r\n; a bar redraws with a lone \r.)
    assert!(
        !dumb.replace("\r\n", "\n").contains('\r') && !dumb.contains("\x1b["),
        "bars on a dumb terminal:\n{dumb:?}"
    );
    assert!(dumb.contains("1/3 scan: 120.0 MiB in 40 files to go through"), "no plain lines:\n{dumb}");
    let out = on_tty("xterm-256color", &vol.db(), "");
    let frames: Vec<&str> = out.split(['\r', '\n']).map(|f| f.trim_start_matches("\x1b[2K")).collect();
    // Once the crawl is over the scan is a bar with a total, file counts and an ETA.
    let bar =
        frames.iter().find(|f| f.starts_with("1/3 scan [") && f.contains("/120.00 MiB") && f.contains("/40 files"));
    assert!(bar.is_some_and(|b| b.contains("eta")), "no scan bar with totals:\n{out}");
    // The plan phase shows time passing, not a count stuck at 0.
    for f in frames.iter().filter(|f| f.starts_with("2/3 plan ") && !f.starts_with("2/3 plan:")) {
        assert!(f.trim_end().ends_with('s'), "plan frame without elapsed time: {f:?}");
    }
    // Before anything is shared there is no rate: no "eta 0s".
    for f in frames.iter().filter(|f| f.starts_with("3/3 share [") && f.contains("] 0 B/")) {
        assert!(f.trim_end().ends_with("eta ?"), "an ETA without a rate: {f:?}");
    }
}

#[test]
fn a_killed_run_shows_as_unfinished() {
    use std::io::BufRead;
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(41);
    for i in 0..150 {
        std::fs::write(d.join(format!("f{i:03}")), rng.bytes(1 << 20)).unwrap();
    }
    vol.remount(); // cold cache: reading takes time
    let db = vol.db();
    let mut child = dedupscan()
        .args(["scan", s(&d), "--threads", "1", "-v", "--progress", "never", "--db", s(&db)])
        .command()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while err.read_line(&mut line).unwrap() > 0 && !line.contains("1/3 scan: started") {
        line.clear();
    }
    child.kill().unwrap(); // SIGKILL: no chance to record an end
    let status = child.wait().unwrap();
    assert!(status.code().is_none(), "the scan ended before it was killed: make the data larger");
    let r = report_json(&vol, &[]);
    assert_eq!(r["runs"][0]["status"], "unfinished", "{r:#}");
    assert!(r["runs"][0]["finished"].is_null(), "{r:#}");
    let (text, _) = report_text(&vol, &[]);
    assert!(text.contains("UNFINISHED"), "{text}");
}
