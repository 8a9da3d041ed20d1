//! Crash safety and concurrent writers: SIGKILL at many points of scanning
//! and sharing, files rewritten while they are shared, a full disk under the
//! database. After each: every file as its writer left it, the database
//! intact, and the next run completes.

mod common;

use std::collections::HashMap;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use dedupscan::corpus::Rng;

fn start(vol: &Volume, data: &Path) -> std::process::Child {
    dedupscan()
        .arg(data)
        .args(["--progress", "never", "-q"])
        .db(vol.db())
        .command()
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Kill points spread over a run: rounds of SIGKILL at 0/20 .. 19/20 of a
/// typical run's time, each on new duplicated data, so there is always
/// hashing and sharing to interrupt. A kill counts only if it landed on a
/// running process (the child's status says SIGKILL): a round whose run
/// ended first is done again, sooner.
fn sigkill_many_times(fs: Fs) {
    let Some(vol) = Volume::new(fs, 1024) else { return };
    let data = vol.path("data");
    dedupscan::corpus::build(&data, 3, 1).unwrap();
    assert!(start(&vol, &data).wait().unwrap().success());
    let mut rng = Rng::new(42);
    let mut pairs = Vec::new();
    let mut new_pair = |name: String| {
        let blob = rng.bytes(3 << 20);
        let pair = (data.join(format!("{name}-a")), data.join(format!("{name}-b")));
        std::fs::write(&pair.0, &blob).unwrap();
        std::fs::write(&pair.1, &blob).unwrap();
        pairs.push(pair);
    };
    // How long a run takes now that the corpus is known: one new pair to
    // hash and share, like every round below.
    new_pair("calibration".into());
    let t = Instant::now();
    assert!(start(&vol, &data).wait().unwrap().success());
    let typical = t.elapsed();
    let mut early = 0;
    for i in 0..20u32 {
        let mut delay = typical * i / 20 + Duration::from_millis(5);
        for attempt in 0.. {
            new_pair(format!("round{i}-{attempt}"));
            let before = Snapshot::take(&data);
            let mut child = start(&vol, &data);
            std::thread::sleep(delay);
            let _ = child.kill(); // SIGKILL
            let status = child.wait().unwrap();
            before.assert_same(&Snapshot::take(&data));
            integrity_ok(&vol.db());
            if status.signal() == Some(libc::SIGKILL) {
                break;
            }
            // The run ended before the kill: this round tested nothing.
            assert!(status.success(), "round {i}: the run failed on its own: {status}");
            early += 1;
            assert!(attempt < 5, "round {i}: every run ended before the kill (last after {delay:?})");
            delay /= 2;
        }
    }
    eprintln!("{fs:?}: 20 kills landed; {early} runs ended before their kill and were done again sooner");
    let before = Snapshot::take(&data);
    let r = run_json(&vol, &[data.to_str().unwrap()]);
    assert_eq!(r["errors"].as_u64(), Some(0), "{r:#}");
    before.assert_same(&Snapshot::take(&data));
    integrity_ok(&vol.db());
    for (a, b) in &pairs {
        assert!(same_physical(a, 0, b, 0, 3 << 20), "{} not shared with {} after recovery", a.display(), b.display());
    }
}

/// SIGKILL during the zero pass's work on clones (btrfs): an image written
/// in one pass, three reflinked clones and a written copy, so every extent
/// of the image is freed by all its holders at once: its data copied, then
/// shared into each, then every holder's zeros punched. Runs are killed at
/// growing delays after the pass starts (its phase line), each on the
/// state the last one left: an extent left half done, some holders moved
/// to the copy and some not. After each kill every file holds what it
/// held; then a run completes and the zeros are gone from every holder,
/// the space freed: a half-done extent is taken up again, not left.
#[test]
fn btrfs_survives_sigkill_during_the_zero_pass_of_clones() {
    let Some(vol) = Volume::new(Fs::Btrfs, 1024) else { return };
    let data = vol.path("store");
    std::fs::create_dir(&data).unwrap();
    let image = one_pass_image(48, 700);
    std::fs::write(data.join("image"), &image).unwrap();
    for n in ["clone1", "clone2", "clone3"] {
        assert!(Command::new("cp")
            .arg("--reflink=always")
            .arg(data.join("image"))
            .arg(data.join(n))
            .status()
            .unwrap()
            .success());
    }
    std::fs::write(data.join("copy"), &image).unwrap();
    dedupscan::sys::syncfs(std::fs::File::open(&data).unwrap()).unwrap();
    let before = Snapshot::take(&data);
    let free0 = free_bytes(&vol.mnt);
    let mut kills = 0;
    for delay_ms in [0, 2, 5, 10, 20, 40, 80, 160] {
        // `-v`: the pass's phase line ("... zeros to holes: started").
        let mut child = dedupscan().arg(&data).arg("-v").db(vol.db()).command();
        let mut child = child.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while std::io::BufRead::read_line(&mut err, &mut line).unwrap() > 0 && !line.contains("zeros to holes") {
            line.clear();
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill(); // SIGKILL
        let status = child.wait().unwrap();
        before.assert_same(&Snapshot::take(&data));
        integrity_ok(&vol.db());
        if status.signal() == Some(libc::SIGKILL) {
            kills += 1;
        } else {
            assert!(status.code().is_some_and(|c| c <= 1), "the run failed on its own: {status}");
        }
    }
    assert!(kills >= 3, "only {kills} kills landed in the zero pass");
    eprintln!("{kills} kills landed in the zero pass");
    let r = run_json(&vol, &[data.to_str().unwrap()]);
    assert_eq!(r["errors"].as_u64(), Some(0), "{r:#}");
    before.assert_same(&Snapshot::take(&data));
    integrity_ok(&vol.db());
    for n in ["image", "clone1", "clone2", "clone3", "copy"] {
        let map = physical_blocks(&data.join(n), 0, 96 << 20);
        let zeros = (0..48).filter(|k| map[(2 * k + 1) * 256 + 10].is_some()).count();
        assert_eq!(zeros, 0, "{n}: {zeros} zero runs still mapped after recovery: {r:#}");
    }
    // 5 × 96 MiB held in 2 × 96 MiB; 48 MiB of data is what must stay.
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    assert!(freed >= 130 << 20, "freed {} MiB after {kills} kills: {r:#}", freed >> 20);
}

#[test]
fn xfs_survives_sigkill_at_twenty_points() {
    sigkill_many_times(Fs::Xfs);
}

#[test]
fn btrfs_survives_sigkill_at_twenty_points() {
    sigkill_many_times(Fs::Btrfs);
}

#[test]
fn files_rewritten_while_shared_hold_what_their_writer_wrote() {
    let Some(vol) = Volume::new(Fs::Xfs, 1024) else { return };
    let data = vol.path("live");
    std::fs::create_dir(&data).unwrap();
    let mut rng = Rng::new(8);
    let mut expect: HashMap<PathBuf, Vec<u8>> = HashMap::new();
    for i in 0..40 {
        let blob = rng.bytes(1 << 20);
        for side in ["a", "b"] {
            let p = data.join(format!("{i:02}{side}"));
            std::fs::write(&p, &blob).unwrap();
            expect.insert(p, blob.clone());
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = Arc::clone(&stop);
        let mut expect = expect.clone();
        std::thread::spawn(move || {
            let mut rng = Rng::new(99);
            let paths: Vec<PathBuf> = {
                let mut v: Vec<_> = expect.keys().cloned().collect();
                v.sort();
                v
            };
            while !stop.load(Ordering::Relaxed) {
                let p = &paths[rng.below(paths.len() as u64) as usize];
                let content = expect.get_mut(p).unwrap();
                let mut f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
                match rng.below(3) {
                    // Overwrite a block in place.
                    0 => {
                        let blk = rng.below(content.len() as u64 / 4096) as usize;
                        let new = rng.bytes(4096);
                        f.seek(SeekFrom::Start((blk * 4096) as u64)).unwrap();
                        f.write_all(&new).unwrap();
                        content[blk * 4096..(blk + 1) * 4096].copy_from_slice(&new);
                    }
                    // Append.
                    1 => {
                        let len = 4096 + rng.below(8192) as usize;
                        let new = rng.bytes(len);
                        f.seek(SeekFrom::End(0)).unwrap();
                        f.write_all(&new).unwrap();
                        content.extend_from_slice(&new);
                    }
                    // Make it a copy of its twin again (new duplicate work).
                    _ => {
                        let twin = if p.to_str().unwrap().ends_with('a') { "b" } else { "a" };
                        let tp =
                            PathBuf::from(format!("{}{twin}", &p.to_str().unwrap()[..p.to_str().unwrap().len() - 1]));
                        let tc = std::fs::read(&tp).unwrap();
                        f.set_len(0).unwrap();
                        f.write_all(&tc).unwrap();
                        *content = tc;
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            expect
        })
    };
    let mut shared = 0;
    for _ in 0..6 {
        let r = run_json(&vol, &[data.to_str().unwrap()]);
        shared += num(&r, "deduped_bytes");
    }
    stop.store(true, Ordering::Relaxed);
    let expect = writer.join().unwrap();
    for (p, want) in &expect {
        let got = std::fs::read(p).unwrap();
        assert!(got == *want, "{} does not hold what its writer last wrote", p.display());
    }
    assert!(shared > 0, "nothing was shared while the writer ran: the test proved nothing");
    integrity_ok(&vol.db());
}

#[test]
fn full_disk_under_the_database_stops_cleanly_and_keeps_it_intact() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let data = vol.path("many");
    let mut rng = Rng::new(12);
    for i in 0..3000 {
        let d = data.join(format!("d{}", i % 30));
        std::fs::create_dir_all(&d).unwrap();
        let len = 4096 + rng.below(20_000) as usize;
        std::fs::write(d.join(format!("f{i}")), rng.bytes(len)).unwrap();
    }
    // A tiny filesystem for the database.
    let dbdir = vol.db().with_extension("d");
    std::fs::create_dir(&dbdir).unwrap();
    let mount = |opts: &str| {
        let st = Command::new("mount").args(["-t", "tmpfs", "-o", opts, "tmpfs"]).arg(&dbdir).status().unwrap();
        assert!(st.success());
    };
    // 0700: the database is refused in a directory others can write (a
    // tmpfs is 1777 by default).
    mount("size=192k,mode=0700");
    let db = dbdir.join("db.sqlite");
    let full = dedupscan().arg("scan").arg(&data).db(&db).arg("--progress=never").run();
    let remount = Command::new("mount").args(["-o", "remount,size=64m"]).arg(&dbdir).status().unwrap();
    assert!(remount.success());
    assert_eq!(full.code, 3, "{}", full.stderr);
    assert!(full.stderr.contains("full"), "the message must say the disk is full: {}", full.stderr);
    integrity_ok(&db);
    // With space again, the next run completes.
    let again = dedupscan().arg("scan").arg(&data).db(&db).json().arg("--incremental").run();
    let _ = Command::new("umount").arg(&dbdir).status();
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.json["files_scanned"].as_u64(), Some(3000));
}

#[test]
fn files_deleted_truncated_and_grown_during_runs_are_handled() {
    let Some(vol) = Volume::new(Fs::Btrfs, 1024) else { return };
    let data = vol.path("churn");
    std::fs::create_dir(&data).unwrap();
    let mut rng = Rng::new(17);
    let mut expect: HashMap<PathBuf, Option<Vec<u8>>> = HashMap::new();
    for i in 0..300 {
        let len = 64 * 1024 + rng.below(200_000) as usize;
        let blob = rng.bytes(len);
        for side in ["a", "b"] {
            let p = data.join(format!("{i:03}{side}"));
            std::fs::write(&p, &blob).unwrap();
            expect.insert(p, Some(blob.clone()));
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let churner = {
        let stop = Arc::clone(&stop);
        let mut expect = expect.clone();
        std::thread::spawn(move || {
            let mut rng = Rng::new(71);
            let mut paths: Vec<PathBuf> = expect.keys().cloned().collect();
            paths.sort();
            while !stop.load(Ordering::Relaxed) {
                let p = &paths[rng.below(paths.len() as u64) as usize];
                match rng.below(4) {
                    // Vanish.
                    0 => {
                        let _ = std::fs::remove_file(p);
                        expect.insert(p.clone(), None);
                    }
                    // Come back with other content (maybe a new inode).
                    1 => {
                        let len = 4096 + rng.below(100_000) as usize;
                        let blob = rng.bytes(len);
                        std::fs::write(p, &blob).unwrap();
                        expect.insert(p.clone(), Some(blob));
                    }
                    // Shrink in place.
                    2 => {
                        if let Some(Some(content)) = expect.get_mut(p) {
                            let len = content.len() / 2;
                            std::fs::OpenOptions::new().write(true).open(p).unwrap().set_len(len as u64).unwrap();
                            content.truncate(len);
                        }
                    }
                    // Grow.
                    _ => {
                        if let Some(Some(content)) = expect.get_mut(p) {
                            let more = rng.bytes(8192);
                            std::fs::OpenOptions::new().append(true).open(p).unwrap().write_all(&more).unwrap();
                            content.extend_from_slice(&more);
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            expect
        })
    };
    let mut shared = 0;
    for _ in 0..5 {
        // Every run finishes, with a valid report (errors are counted, the
        // run goes on).
        let r = run_json(&vol, &[data.to_str().unwrap()]);
        shared += num(&r, "deduped_bytes");
    }
    stop.store(true, Ordering::Relaxed);
    let expect = churner.join().unwrap();
    for (p, want) in &expect {
        match want {
            None => assert!(!p.exists(), "{} came back", p.display()),
            Some(w) => assert!(std::fs::read(p).unwrap() == *w, "{} does not hold what was last written", p.display()),
        }
    }
    assert!(shared > 0, "nothing was shared during the churn: the test proved nothing");
    integrity_ok(&vol.db());
    // With the churn over, a run is clean.
    let r = run_json(&vol, &[data.to_str().unwrap()]);
    assert_eq!(r["errors"].as_u64(), Some(0), "{r:#}");
}
