//! A filesystem that stops taking writes during a run: remounted read-only
//! by an administrator, forced read-only by btrfs after an error, or shut
//! down by XFS after one (which then answers `EIO` to every call). The run
//! used to go on and fail every file and range left in turn (3,000 pairs:
//! 3,000 warnings and errors; in the pass that turns written zeros into
//! holes, a warning for every file left), and on a shut-down XFS ended
//! fatally with no report at all. Now it says so once, stops as on a signal (exit 5, the
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

/// Run on `d` and stop the filesystem (`stop`) at `phase`: the run says
/// so once and stops as on a signal (exit 5, interrupted), counting the
/// requests and files in flight when it stopped, not every one left.
fn stops_once(vol: &Volume, d: &Path, phase: &str, stop: fn(&Volume)) {
    let (code, r, err) = stopped_at(vol, d, phase, || stop(vol));
    assert_eq!(code, 5, "{err}");
    assert_eq!(err.matches("the filesystem stopped during the run").count(), 1, "{err}");
    assert!(err.lines().filter(|l| l.contains("warning")).count() <= 3, "one warning a file: {err}");
    assert!(r["interrupted"].as_bool().unwrap(), "{r:#}");
    assert!((1..=32).contains(&num(&r, "errors")), "{r:#}");
}

/// Put the filesystem back in order (`restore`): nothing of `d` changed
/// (`before`), and the next run goes through without an error. Its report.
fn carries_on(vol: &Volume, d: &Path, before: &Snapshot, restore: fn(&Volume)) -> serde_json::Value {
    restore(vol);
    before.assert_same(&Snapshot::take(d));
    let r = run_json(vol, &[s(d), "--incremental"]);
    assert_eq!(num(&r, "errors"), 0, "{r:#}");
    before.assert_same(&Snapshot::take(d));
    r
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

    stops_once(&vol, &d, phase, stop);
    let r = carries_on(&vol, &d, &before, restore);
    for i in 0..PAIRS {
        let (a, b) = (d.join(format!("{i}a")), d.join(format!("{i}b")));
        assert!(same_physical(&a, 0, &b, 0, 32 << 10), "pair {i} not shared: {r:#}");
    }
    let want = (PAIRS as u64) << 15;
    let freed = free_bytes(&vol.mnt).saturating_sub(free_before);
    assert!(freed >= want * 9 / 10, "freed {freed} of {want}");
}

/// The filesystem stops while written zeros are turned into holes (after
/// the sharing): the run used to warn once for every file with zeros left
/// (1,498 of 1,500) and exit 1. (Not remounted read-only: the pass holds
/// its unnamed file open for writing, and the kernel refuses the remount
/// while it does.)
fn stops_while_turning_zeros_into_holes(fs: Fs, stop: fn(&Volume), restore: fn(&Volume)) {
    let Some(vol) = Volume::new(fs, 600) else { return };
    let d = vol.path("d");
    // A few pairs, so that there is sharing before the zero pass, and many
    // files with a run of written zeros.
    std::fs::create_dir_all(&d).unwrap();
    let mut rng = Rng::new(36);
    for i in 0..4 {
        let blob = rng.bytes(64 << 10);
        std::fs::write(d.join(format!("p{i}a")), &blob).unwrap();
        std::fs::write(d.join(format!("p{i}b")), &blob).unwrap();
    }
    let zeros = |i: usize| d.join(format!("z{i}"));
    for i in 0..PAIRS {
        let mut body = rng.bytes(8 << 10);
        body.resize((8 << 10) + (64 << 10), 0);
        std::fs::write(zeros(i), body).unwrap();
    }
    let before = Snapshot::take(&d);

    stops_once(&vol, &d, "zeros to holes: started", stop);
    let r = carries_on(&vol, &d, &before, restore);
    for i in 0..PAIRS {
        // The zeros are a hole now: nothing mapped past the data block.
        let blocks = physical_blocks(&zeros(i), 8 << 10, 64 << 10);
        assert!(blocks.iter().all(Option::is_none), "{}: zeros still written: {r:#}", zeros(i).display());
    }
}

#[test]
fn xfs_shut_down_while_turning_zeros_into_holes_stops_the_run_once() {
    stops_while_turning_zeros_into_holes(Fs::Xfs, shut_down, Volume::remount);
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
