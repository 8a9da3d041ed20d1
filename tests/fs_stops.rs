//! A filesystem that stops taking writes during a run: remounted read-only
//! by an administrator, forced read-only by btrfs after an error, or shut
//! down by XFS after one (which then answers `EIO` to every call). The run
//! used to go on and fail every file and range left in turn (3,000 pairs:
//! 3,000 warnings and errors), and on a shut-down XFS ended fatally with no
//! report at all. Now it says so once, stops as on a signal (exit 5, the
//! report marked interrupted, the work done kept) and the next run, on the
//! filesystem back in order, shares the rest. Nothing is lost.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;
use dedupscan::corpus::Rng;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Pairs of equal 32 KiB files: many destinations, so that a phase lasts
/// long enough to be paused in.
const PAIRS: usize = 1500;

fn write_pairs(d: &Path) {
    std::fs::create_dir_all(d).unwrap();
    let mut rng = Rng::new(31);
    for i in 0..PAIRS {
        let blob = rng.bytes(32 << 10);
        for side in ["a", "b"] {
            std::fs::write(d.join(format!("{i}{side}")), &blob).unwrap();
        }
    }
}

/// Run on `d` and, when its stderr says `phase`, stop it (SIGSTOP), call
/// `act`, and let it go on. Its exit code, report and stderr.
fn stopped_at(vol: &Volume, d: &Path, phase: &str, act: impl FnOnce()) -> (i32, serde_json::Value, String) {
    let mut child = dedupscan()
        .arg(d)
        .args(["--progress", "never", "--json", "-v"])
        .db(vol.db())
        .command()
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = Pid::from_raw(child.id() as i32);
    let mut stdout = child.stdout.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).unwrap();
        s
    });
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut err = String::new();
    loop {
        let mut line = String::new();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "the run ended before {phase:?}: {err}");
        err.push_str(&line);
        if line.contains(phase) {
            kill(pid, Signal::SIGSTOP).unwrap();
            break;
        }
    }
    act();
    kill(pid, Signal::SIGCONT).unwrap();
    stderr.read_to_string(&mut err).unwrap();
    let code = child.wait().unwrap().code().unwrap_or(-1);
    let json = serde_json::from_str(&out.join().unwrap()).unwrap_or_else(|e| panic!("no report ({e}): {err}"));
    (code, json, err)
}

/// The filesystem stops at `phase` (`stop`), is put back in order
/// (`restore`); then the next run shares what was left.
fn stops_once_and_the_next_run_carries_on(fs: Fs, phase: &str, stop: fn(&Volume), restore: fn(&Volume)) {
    let Some(vol) = Volume::new(fs, 600) else { return };
    let d = vol.path("d");
    write_pairs(&d);
    free_bytes(&vol.mnt);
    let before = Snapshot::take(&d);
    let free_before = free_bytes(&vol.mnt);

    let (code, r, err) = stopped_at(&vol, &d, phase, || stop(&vol));
    assert_eq!(code, 5, "{err}");
    assert_eq!(err.matches("the filesystem stopped during the run").count(), 1, "{err}");
    assert!(err.lines().filter(|l| l.contains("warning")).count() <= 3, "one warning a file: {err}");
    assert!(r["interrupted"].as_bool().unwrap(), "{r:#}");
    // Counted: the requests and files in flight when it stopped, not
    // every one left.
    assert!((1..=32).contains(&num(&r, "errors")), "{r:#}");

    restore(&vol);
    before.assert_same(&Snapshot::take(&d));
    let r = run_json(&vol, &[s(&d), "--incremental"]);
    assert_eq!(num(&r, "errors"), 0, "{r:#}");
    before.assert_same(&Snapshot::take(&d));
    for i in 0..PAIRS {
        let (a, b) = (d.join(format!("{i}a")), d.join(format!("{i}b")));
        assert!(same_physical(&a, 0, &b, 0, 32 << 10), "pair {i} not shared: {r:#}");
    }
    let want = (PAIRS as u64) << 15;
    let freed = free_bytes(&vol.mnt).saturating_sub(free_before);
    assert!(freed >= want * 9 / 10, "freed {freed} of {want}");
}

fn shut_down(vol: &Volume) {
    sh(Command::new("xfs_io").args(["-x", "-c", "shutdown"]).arg(&vol.mnt));
}

#[test]
fn btrfs_remounted_read_only_while_sharing_stops_the_run_once() {
    stops_once_and_the_next_run_carries_on(
        Fs::Btrfs,
        "3/3 share: started",
        |v| v.remount_with("ro"),
        |v| v.remount_with("rw"),
    );
}

#[test]
fn xfs_shut_down_while_sharing_stops_the_run_once() {
    stops_once_and_the_next_run_carries_on(Fs::Xfs, "3/3 share: started", shut_down, Volume::remount);
}

#[test]
fn xfs_shut_down_while_hashing_stops_the_run_once() {
    stops_once_and_the_next_run_carries_on(Fs::Xfs, "to go through", shut_down, Volume::remount);
}
