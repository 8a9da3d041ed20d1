//! A full disk: work that fails for lack of space is remembered and done by
//! the next run once there is room, even an `--incremental` run in which
//! nothing changed.

mod common;

use std::io::Write;

use common::*;
use dedupscan::corpus::Rng;

/// Write `path` until the volume is out of data space, in large then small
/// pieces, across a few transaction commits (btrfs gives reserved space
/// back at commit).
fn fill(path: &std::path::Path) {
    let mut f = std::fs::File::create(path).unwrap();
    let big = vec![0x5au8; 1 << 20];
    for piece in [1usize << 20, 64 << 10, 4 << 10] {
        for _ in 0..3 {
            while f.write_all(&big[..piece]).and_then(|_| f.flush()).is_ok() {}
            let _ = f.sync_all();
        }
    }
}

#[test]
fn bookends_stuck_on_a_full_disk_are_freed_by_the_next_incremental_run() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(7);
    let len = 16 << 20;
    let a = rng.bytes(len);
    let mut b = a.clone();
    for blk in [3usize, 2000, 3500] {
        b[blk * 4096..(blk + 1) * 4096].copy_from_slice(&rng.bytes(4096));
    }
    std::fs::write(d.join("a"), &a).unwrap();
    std::fs::write(d.join("b"), &b).unwrap();
    let path = d.to_str().unwrap();
    let before = Snapshot::take(&d);
    fill(&vol.path("filler"));

    // Full: the three blocks of b cannot be rewritten, so b's extent could
    // not be freed; b is left whole for later and said so.
    let first = run_json(&vol, &[path, "--incremental"]);
    before.assert_same(&Snapshot::take(&d));
    assert!(num(&first, "pending_bytes") > 0, "nothing pending on a full disk: {first:#}");
    assert!(first["pending"]["no_space_rewrite"]["files"].as_u64() == Some(1), "{first:#}");
    assert!(first["error_kinds"]["no_space"].as_u64().is_some(), "{first:#}");
    let rep = db_report(&vol);
    assert_eq!(num(&rep, "pending_bytes"), num(&first, "pending_bytes"), "{rep:#}");

    // Room again; nothing changed on the volume.
    std::fs::remove_file(vol.path("filler")).unwrap();
    let free0 = free_bytes(&vol.mnt);
    let second = run_json(&vol, &[path, "--incremental"]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    before.assert_same(&Snapshot::take(&d));
    assert_eq!(num(&second, "files_hashed"), 0, "{second:#}");
    assert_eq!(num(&second, "rewritten_bytes"), 3 * 4096, "{second:#}");
    assert_eq!(num(&second, "pending_bytes"), 0, "{second:#}");
    let want = (len - 3 * 4096) as i64;
    assert!(freed >= want * 95 / 100, "the stuck space was not freed: {freed} of {want}: {second:#}");
    assert!(same_physical(&d.join("a"), 4 * 4096, &d.join("b"), 4 * 4096, 1996 * 4096));
    assert_eq!(num(&db_report(&vol), "pending_bytes"), 0);
}

/// A full temporary directory (`/var/tmp` is often the root filesystem,
/// not the volume being shared) does not stop the run: the plan's first
/// grouping then reads the database once per slice, and the plan's batches
/// and the `--list` stay in memory. Tiny limits
/// (`DEDUPSCAN_TEST_SMALL_BATCHES`) send all three to temporary files from
/// the first few blocks and ranges.
#[test]
fn a_full_temporary_directory_does_not_stop_the_run() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(5);
    for i in 0..12 {
        let a = rng.bytes(64 << 10);
        let mut b = a.clone();
        b[i * 4096..i * 4096 + 8].copy_from_slice(b"changed!");
        std::fs::write(d.join(format!("a{i}")), &a).unwrap();
        std::fs::write(d.join(format!("b{i}")), &b).unwrap();
    }
    let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
    let mut mount = std::process::Command::new("mount");
    assert!(mount.args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"]).arg(tmp.path()).status().unwrap().success());
    let _unmount = Unmount(tmp.path().to_owned());
    fill(&tmp.path().join("filler"));
    let before = Snapshot::take(&d);
    let path = d.to_str().unwrap();
    let run = |tmpdir: &std::path::Path, args: &[&str]| {
        let out = dedupscan().arg(path).args(args).json().db(vol.db()).env("DEDUPSCAN_TEST_SMALL_BATCHES", "1");
        out.env("TMPDIR", tmpdir).expect(0).run().json
    };
    let room = tempfile::tempdir_in("/var/tmp").unwrap();
    let planned = num(&run(room.path(), &["--dry-run"]), "duplicate_bytes");
    assert!(planned >= 12 * (60 << 10), "planned {planned}");
    assert_eq!(num(&run(tmp.path(), &["--dry-run"]), "duplicate_bytes"), planned);
    let listed = |r: &serde_json::Value| r["ranges"].as_array().map(|l| l.len()).unwrap_or(0);
    let dry = run(room.path(), &["--dry-run", "--list"]);
    assert!(listed(&dry) >= 12, "{dry:#}");
    let r = run(tmp.path(), &["--list"]);
    before.assert_same(&Snapshot::take(&d));
    assert_eq!((num(&r, "duplicate_bytes"), num(&r, "deduped_bytes")), (planned, planned), "{r:#}");
    assert_eq!(r["ranges"], dry["ranges"], "the list, kept in memory");
}
