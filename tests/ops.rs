//! What an operator relies on, on the real binary: exit codes, usage errors
//! found before the database is touched, unsupported filesystems and
//! read-only mounts refused before anything is read, interrupted runs marked and carried on, quiet
//! broken pipes, warnings for excludes that match nothing, a flood of
//! warnings about single paths cut and counted, and consent
//! before `scripts/quickstart.sh` shares anything.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use dedupscan::corpus::Rng;

/// Run the binary with `args` (no `--json` added); (exit code, stdout, stderr).
fn run(args: &[&str]) -> (i32, String, String) {
    let out = dedupscan().args(args).run();
    (out.code, out.stdout, out.stderr)
}

/// The bytes of a database and of its WAL and shared-memory files: equal
/// before and after means the run did not touch it.
fn db_state(db: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    ["", "-wal", "-shm", ".lock"]
        .iter()
        .map(|sfx| {
            let p = format!("{}{sfx}", db.display());
            let bytes = std::fs::read(&p).ok();
            (p, bytes)
        })
        .collect()
}

/// Two files with the same 256 KiB under `dir`.
fn two_copies(dir: &Path, seed: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let payload = Rng::new(seed).bytes(256 * 1024);
    std::fs::write(dir.join("a"), &payload).unwrap();
    std::fs::write(dir.join("b"), &payload).unwrap();
}

/// ext4, tmpfs and XFS made with reflink=0: the default command, with and
/// without `--dry-run`, exits 6 with a message before anything is read, and
/// creates no database — neither the one named by `--db` nor the default
/// one for the filesystem. `scan` still records the files.
#[test]
fn unsupported_filesystems_are_refused_before_hashing() {
    let dbs = tempfile::Builder::new().prefix("dedupscan-ops-db-").tempdir_in("/var/tmp").unwrap();
    // Each filesystem on its own: one this machine cannot make is skipped
    // (loudly), the others are still checked.
    let mut checked = Vec::new();
    for name in ["ext4", "xfs reflink=0", "tmpfs"] {
        // The volume (or tmpfs) lives until the end of the iteration.
        let (_ext4, _xfs0, _tmpfs);
        let (root, db) = match name {
            "ext4" => {
                let Some(v) = Volume::new(Fs::Ext4, 64) else { continue };
                let r = (v.mnt.clone(), v.db());
                _ext4 = v;
                r
            }
            "xfs reflink=0" => {
                let Some(v) = Volume::new(Fs::XfsNoReflink, 300) else { continue };
                let r = (v.mnt.clone(), v.db());
                _xfs0 = v;
                r
            }
            _ => {
                // Only where loop volumes can be made: this machine mounts.
                if checked.is_empty() {
                    continue;
                }
                let t = Tmpfs::new("size=16m");
                let r = (t.path().to_owned(), dbs.path().join("tmpfs.sqlite"));
                _tmpfs = t;
                r
            }
        };
        checked.push(name);
        let d = root.join("d");
        two_copies(&d, 3);
        let default_db = {
            let uuid = dedupscan::sys::fs::fs_info_of_path(&d).unwrap().uuid;
            dedupscan::config::default_db_path(&uuid).unwrap()
        };
        let before = Snapshot::take(&d);
        for extra in [&["--dry-run"][..], &[]] {
            let mut args = vec![s(&d), "--db", s(&db)];
            args.extend(extra);
            let (code, out, err) = run(&args);
            assert_eq!(code, 6, "{name} {extra:?}: exit {code}\nstdout: {out}\nstderr: {err}");
            assert!(err.contains("shares only on btrfs and on XFS made with reflink=1"), "{name}: {err}");
            assert!(err.contains(s(&d)), "{name}: {err}");
            assert!(!out.contains("would share") && !out.contains("verified"), "{name}: {out}");
            assert!(!db.exists(), "{name} {extra:?}: a database was created");
            // The same without --db: the default database is not created either.
            let (code, _, _) = run(&[s(&d), "--dry-run"]);
            assert_eq!(code, 6);
            assert!(!default_db.exists(), "{name}: {} was created", default_db.display());
        }
        // A file opened for hashing would have its atime updated on tmpfs;
        // the contents, sizes and mtimes are unchanged in any case.
        before.assert_same(&Snapshot::take(&d));
        // `scan` records an unsupported filesystem when asked to.
        let (code, out, err) = run(&["scan", s(&d), "--db", s(&db), "--json"]);
        assert_eq!(code, 0, "{name}: scan exited {code}: {err}");
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(num(&r, "files_hashed"), 2, "{r:#}");
    }
    eprintln!("checked: {checked:?}");
}

/// A volume mounted read-only: a run exits 6 before reading anything (it
/// used to hash everything, then fail every range with `EROFS`, one warning
/// each, exit 1); a dry run previews, as anywhere. Both filesystems.
#[test]
fn a_read_only_mount_is_refused_before_hashing_but_previewed() {
    for fs in [Fs::Btrfs, Fs::Xfs] {
        let Some(vol) = Volume::new(fs, 300) else { return };
        let d = vol.path("d");
        two_copies(&d, 4);
        vol.remount_with("ro");
        let db = vol.db();
        let (code, out, err) = run(&[s(&d), "--db", s(&db)]);
        assert_eq!(code, 6, "{fs:?}: exit {code}\nstdout: {out}\nstderr: {err}");
        assert!(err.contains("mounted read-only") && err.contains(s(&d)), "{fs:?}: {err}");
        assert!(!db.exists(), "{fs:?}: a database was created");
        let dry = dedupscan().arg(&d).arg("--dry-run").json().db(&db).expect(0).run().json;
        assert_eq!(num(&dry, "duplicate_bytes"), 256 * 1024, "{fs:?}: {dry:#}");
        vol.remount_with("rw");
        let real = run_json(&vol, &[s(&d)]);
        assert_eq!(num(&real, "deduped_bytes"), 256 * 1024, "{fs:?}: {real:#}");
    }
}

/// Every usage error exits 2 before the database is opened: its bytes are
/// the same afterwards (the old code exited 3 for a bad glob after
/// forgetting every hash because the block size differed, and left a run
/// open).
#[test]
fn usage_errors_leave_the_database_untouched() {
    let Some(vol) = Volume::new(Fs::Btrfs, 300) else { return };
    let d = vol.path("d");
    two_copies(&d, 4);
    let db = vol.db();
    run_json(&vol, &["scan", s(&d)]);
    let state = db_state(&db);
    let list = vol.path("excludes.txt");
    std::fs::write(&list, "# comment\n/ok/**\nrelative/*.tmp\n").unwrap();
    let bad_list = vol.path("bad-excludes.txt");
    std::fs::write(&bad_list, "\n**/[oops\n").unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--exclude", "[abc", "--block-size", "8K"], "--exclude '[abc'"),
        (&["--exclude", "{a,b", "--dry-run"], "--exclude '{a,b'"),
        (&["--exclude", "tmp/**"], "relative"),
        (&["--exclude", "./cache"], "relative"),
        (&["--exclude-from", s(&list), "--block-size", "8K"], "excludes.txt:3"),
        (&["--exclude-from", s(&bad_list)], "bad-excludes.txt:2"),
        (&["--exclude-from", "/nonexistent/list"], "/nonexistent/list"),
        (&["--threads", "0"], "--threads"),
        (&["--rewrite-ratio=-1"], "--rewrite-ratio"),
        (&["--block-size", "3000"], "--block-size"),
        (&["--rehash", "--incremental"], "--rehash"),
        (&["--max-runtime", "soon"], "--max-runtime"),
    ];
    for (extra, needle) in cases {
        for cmd in [&[][..], &["scan"]] {
            if cmd == ["scan"] && extra.contains(&"--dry-run") {
                continue;
            }
            let mut args: Vec<&str> = cmd.to_vec();
            args.push(s(&d));
            args.extend(*extra);
            args.extend(["--db", s(&db)]);
            let (code, _, err) = run(&args);
            assert_eq!(code, 2, "{args:?}: exit {code}: {err}");
            assert!(err.contains(needle), "{args:?}: message lacks {needle:?}: {err}");
            assert!(!err.contains("panicked"), "{err}");
            assert!(db_state(&db) == state, "{args:?}: the database changed");
        }
    }
    // A missing path, and a second path on another filesystem.
    for args in [&[s(&d), "/nonexistent/x"][..], &[s(&d), "/proc"]] {
        let mut a = args.to_vec();
        a.extend(["--db", s(&db)]);
        let (code, _, err) = run(&a);
        assert_eq!(code, 2, "{a:?}: {err}");
        assert!(db_state(&db) == state, "{a:?}: the database changed");
    }
    // The run history still has the one scan, finished.
    let (code, out, _) = run(&["report", "--json", "--db", s(&db)]);
    assert_eq!(code, 0);
    let rep: serde_json::Value = serde_json::from_str(&out).unwrap();
    let runs = rep["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{rep:#}");
    assert!(runs[0]["finished_at"].is_number());
}

/// 500 files of 256 KiB, and the volume remounted (cold cache), so that a
/// scan with one thread takes long enough to be stopped.
fn slow_tree(vol: &Volume) -> (PathBuf, u64) {
    let data = vol.path("slow");
    std::fs::create_dir(&data).unwrap();
    let mut rng = Rng::new(11);
    let n = 500;
    for i in 0..n {
        std::fs::write(data.join(format!("f{i:03}")), rng.bytes(256 * 1024)).unwrap();
    }
    vol.remount();
    (data, n)
}

/// A stopped run (SIGINT, or `--max-runtime`) exits 5, says so, and is
/// marked interrupted in the history; a plain rerun — no `--incremental` —
/// carries on with the rest, and `--rehash` reads everything again.
#[test]
fn stopped_runs_exit_5_and_a_plain_rerun_carries_on() {
    let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
    let (data, n) = slow_tree(&vol);
    let db = vol.db();

    // Ctrl-C once the scan has started (the handler is set up within
    // milliseconds; the scan takes over a second on a cold cache).
    let child = dedupscan().args([s(&data), "--threads", "1", "--progress", "never", "--json", "--db", s(&db)]).spawn();
    // Signal as soon as the run is reading files (its read counter in
    // /proc moves), not after a fixed sleep: on a quiet machine the whole
    // scan can end within a fixed delay.
    let io = format!("/proc/{}/io", child.id());
    let reading = || {
        std::fs::read_to_string(&io)
            .ok()
            .and_then(|t| t.lines().find_map(|l| l.strip_prefix("rchar: ").and_then(|v| v.trim().parse::<u64>().ok())))
    };
    let t0 = std::time::Instant::now();
    while reading().is_some_and(|r| r < 4 << 20) && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    let rest = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "SIGINT: {rest}");
    assert!(rest.contains("stopped before finishing"), "{rest}");
    let first: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    validate_report(&first);
    assert_eq!(first["interrupted"], true, "{first:#}");
    let done = num(&first, "files_hashed");
    assert!(done < n, "the scan finished before the signal: make the test data larger");

    // The history marks it: finished (committed), interrupted.
    let (code, hist, _) = run(&["report", "--json", "--db", s(&db)]);
    assert_eq!(code, 0);
    let hist: serde_json::Value = serde_json::from_str(&hist).unwrap();
    let last = hist["runs"].as_array().unwrap().last().unwrap().clone();
    assert!(last["finished_at"].is_number(), "{last:#}");
    assert_eq!(last["report"]["interrupted"], true, "{last:#}");

    // A plain rerun carries on: only the files not hashed yet are read.
    let (code, out, err) = run(&[s(&data), "--json", "--db", s(&db)]);
    assert_eq!(code, 0, "{err}");
    let second: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(num(&second, "files_hashed"), n - done, "{second:#}");
    assert_eq!(num(&second, "files_unchanged"), done, "{second:#}");
    assert_eq!(second["incremental"], true);

    // --rehash reads everything again.
    let third = run_json(&vol, &["scan", s(&data), "--rehash"]);
    assert_eq!(num(&third, "files_hashed"), n, "{third:#}");
    assert_eq!(third["incremental"], false);

    // --max-runtime: the same exit status, for scan and the default command.
    vol.remount();
    for cmd in [&["scan"][..], &[]] {
        let mut args = cmd.to_vec();
        args.extend([s(&data), "--rehash", "--threads", "1", "--max-runtime", "1ms", "--json", "--db", s(&db)]);
        let (code, out, err) = run(&args);
        assert_eq!(code, 5, "{args:?}: {err}");
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(r["interrupted"], true, "{r:#}");
        assert!(num(&r, "files_hashed") < n, "{r:#}");
    }
}

/// The reader of stdout or stderr going away (`| head -1`, `2>&1 | head -1`)
/// ends that output quietly: no panic, the run goes on to its own exit
/// status. The read end is closed before anything is written, so every
/// write fails with EPIPE.
#[test]
fn a_closed_stdout_or_stderr_ends_quietly() {
    let Some(vol) = Volume::new(Fs::Xfs, 300) else { return };
    let db = vol.db();
    let (d1, d2) = (vol.path("d1"), vol.path("d2"));
    two_copies(&d1, 5);
    two_copies(&d2, 6);
    let spawn = |args: &[&str], close_stdout: bool| {
        let mut child = dedupscan().args(args).spawn();
        // Close the only read end of one pipe; keep reading the other.
        if close_stdout {
            drop(child.stdout.take());
        } else {
            drop(child.stderr.take());
        }
        let out = child.wait_with_output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{args:?}: {text}");
        assert!(!text.contains("panicked") && !text.contains("Broken pipe"), "{args:?}: {text}");
    };
    spawn(&[s(&d1), "--json", "--db", s(&db)], true);
    spawn(&["report", "--json", "--db", s(&db)], true);
    spawn(&["report", "--db", s(&db)], true);
    spawn(&[s(&d2), "-v", "--progress", "never", "--db", s(&db)], false);
    // The runs were done in full.
    assert!(same_physical(&d1.join("a"), 0, &d1.join("b"), 0, 256 * 1024));
    assert!(same_physical(&d2.join("a"), 0, &d2.join("b"), 0, 256 * 1024));
}

/// An exclude that matches nothing (a typo, a path elsewhere) is warned
/// about by name; one that matches is not.
#[test]
fn an_exclude_matching_nothing_warns() {
    let Some(vol) = Volume::new(Fs::Btrfs, 300) else { return };
    let d = vol.path("d");
    two_copies(&d, 6);
    let (code, _, err) =
        run(&["scan", s(&d), "--exclude", "**/b", "--exclude", "/srv/no-such-dir/**", "--db", s(&vol.db())]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("'/srv/no-such-dir/**' matched nothing"), "{err}");
    assert!(!err.contains("'**/b' matched nothing"), "{err}");
}

/// A flood of warnings about single paths (here 300 files refused as too
/// large: the test lowers the bound of a block map, as `tests/too_large.rs`
/// does; a user touching their files in a loop under the run does the
/// same) is cut after 200 lines, says so and says how many it left out,
/// under the journal's plain lines; a run-wide warning still shows;
/// `-v` shows every one; the report counts all 300. Before, every one
/// was a line: past journald's rate limit the run's last lines were lost.
#[test]
fn a_flood_of_warnings_about_single_paths_is_cut_and_counted() {
    let Some(vol) = Volume::new(Fs::Xfs, 300) else { return };
    let d = vol.path("d");
    std::fs::create_dir_all(&d).unwrap();
    for i in 0..300 {
        std::fs::write(d.join(format!("f{i:03}")), Rng::new(100 + i).bytes(64 << 10)).unwrap();
    }
    let run = |extra: &[&str]| {
        let db = vol.path(&format!("db{}", extra.len()));
        let out = dedupscan()
            .args(["scan", s(&d), "--json", "--exclude", "/srv/no-such-dir/**"])
            .args(extra)
            .db(&db)
            .env("DEDUPSCAN_TEST_MAX_MAP_BYTES", "64")
            .expect(1)
            .run();
        assert_eq!(out.json["error_kinds"]["too_large"], 300, "{:#}", out.json);
        let paths = out.stderr.lines().filter(|l| l.contains(": too_large: ")).count();
        (paths, out.stderr)
    };
    let (paths, err) = run(&[]);
    assert_eq!(paths, 200, "{err}");
    assert!(err.contains("more than 200 warnings about single paths: the rest are counted, not shown"), "{err}");
    assert!(err.contains("100 more warnings about single paths were not shown (-v shows every one"), "{err}");
    assert!(err.contains("'/srv/no-such-dir/**' matched nothing"), "{err}");
    let (paths, err) = run(&["-v"]);
    assert_eq!(paths, 300, "{err}");
    assert!(!err.contains("were not shown"), "{err}");
}

/// `scripts/quickstart.sh PATH` without a terminal previews and shares
/// nothing; with `--yes` it shares. (DEDUPSCAN_BIN: the binary under test,
/// instead of a release build.)
#[test]
fn quickstart_shares_only_with_consent() {
    let Some(vol) = Volume::new(Fs::Btrfs, 300) else { return };
    let d = vol.path("d");
    two_copies(&d, 7);
    let before = Snapshot::take(&d);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/quickstart.sh");
    let quickstart = |extra: &[&str]| {
        let out = Command::new("bash")
            .arg(&script)
            .args(extra)
            .args([s(&d), "--db", s(&vol.db())])
            .env("DEDUPSCAN_BIN", bin())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = quickstart(&[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("nothing shared") && err.contains("--yes"), "{err}");
    assert!(!same_physical(&d.join("a"), 0, &d.join("b"), 0, 256 * 1024), "shared without consent");
    before.assert_same(&Snapshot::take(&d));
    let (code, err) = quickstart(&["--yes"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(same_physical(&d.join("a"), 0, &d.join("b"), 0, 256 * 1024), "--yes did not share: {err}");
    before.assert_same(&Snapshot::take(&d));
}

/// `--help` and the man page list every exit code the binary uses.
#[test]
fn help_documents_exit_codes() {
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    for c in dedupscan::exit::ExitCode::ALL {
        assert!(out.contains(&format!("{} ", c.code())), "--help lacks exit code {}", c.code());
    }
}
