//! btrfs gives each subvolume its `st_dev` when the subvolume is first
//! touched after mount, so the same file can come back under another
//! `st_dev` after a remount. Files are known by subvolume id and inode: an
//! incremental run after a remount that touched the subvolumes in another
//! order rehashes nothing and reports nothing removed.

mod common;

use std::os::unix::fs::MetadataExt;
use std::process::Command;

use common::*;
use dedupscan::corpus::Rng;

#[test]
fn remount_in_another_order_rehashes_nothing() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    btrfs(&["subvolume", "create"], &vol.path("@"));
    btrfs(&["subvolume", "create"], &vol.path("@home"));
    let mut rng = Rng::new(12);
    // Same inode numbers in both subvolumes (each starts at 257), different
    // sizes: with st_dev swapped, no file can pass for another.
    for (sub, n, size) in [("@", 6, 96 << 10), ("@home", 6, 160 << 10)] {
        let d = vol.path(sub).join("data");
        std::fs::create_dir(&d).unwrap();
        let shared = rng.bytes(size);
        for k in 0..n {
            let body = if k % 2 == 0 { shared.clone() } else { rng.bytes(size) };
            std::fs::write(d.join(format!("f{k}")), body).unwrap();
        }
    }
    let root = vol.mnt.to_str().unwrap().to_owned();
    let first = run_json(&vol, &[&root, "--incremental"]);
    assert_eq!(num(&first, "files_hashed"), 12, "{first:#}");
    assert!(num(&first, "deduped_bytes") > 0, "{first:#}");
    let dev_before = std::fs::metadata(vol.path("@home/data/f0")).unwrap().dev();
    let before = [Snapshot::take(&vol.path("@")), Snapshot::take(&vol.path("@home"))];

    vol.remount();
    // Touch things in another order than before: @home takes the first
    // free st_dev (the one @ had), then a new subvolume, then @.
    let dev_after = std::fs::metadata(vol.path("@home/data/f0")).unwrap().dev();
    btrfs(&["subvolume", "create"], &vol.path("@new"));
    std::fs::metadata(vol.path("@/data/f0")).unwrap();
    assert_ne!(dev_before, dev_after, "the remount must give @home another st_dev, or this test proves nothing");

    let again = run_json(&vol, &[&root, "--incremental"]);
    assert_eq!(num(&again, "bytes_hashed"), 0, "rehashed after a remount: {again:#}");
    assert_eq!(num(&again, "files_hashed"), 0, "{again:#}");
    assert_eq!(num(&again, "files_removed"), 0, "{again:#}");
    assert_eq!(num(&again, "files_unchanged"), 12, "{again:#}");
    assert_eq!(num(&again, "duplicate_bytes"), 0, "{again:#}");
    before[0].assert_same(&Snapshot::take(&vol.path("@")));
    before[1].assert_same(&Snapshot::take(&vol.path("@home")));

    // A file changed in one subvolume is still found changed (identity is
    // not so loose that a rewrite passes).
    std::fs::write(vol.path("@home/data/f1"), rng.bytes(160 << 10)).unwrap();
    let third = run_json(&vol, &[&root, "--incremental"]);
    assert_eq!((num(&third, "files_hashed"), num(&third, "files_removed")), (1, 0), "{third:#}");
}

/// XFS has one `st_dev`, the device's, which changes when the volume comes
/// back on another device number (a loop device, a disk enumerated in
/// another order after a reboot). Files are known by inode alone there
/// (volume key 0): nothing is rehashed.
#[test]
fn xfs_on_another_device_number_rehashes_nothing() {
    let Some(vol) = Volume::new(Fs::Xfs, 320) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(13);
    let shared = rng.bytes(128 << 10);
    for k in 0..4 {
        std::fs::write(d.join(format!("f{k}")), if k % 2 == 0 { shared.clone() } else { rng.bytes(64 << 10) }).unwrap();
    }
    let path = d.to_str().unwrap().to_owned();
    let first = run_json(&vol, &[&path, "--incremental"]);
    assert_eq!(num(&first, "files_hashed"), 4, "{first:#}");
    let dev_before = std::fs::metadata(&d).unwrap().dev();
    let before = Snapshot::take(&d);

    // Mount the image again with its old loop device taken by another
    // image, so it gets another device number.
    let dir = vol.db().parent().unwrap().to_owned();
    assert!(Command::new("umount").arg(&vol.mnt).status().unwrap().success());
    let dummy = dir.join("dummy.img");
    std::fs::File::create(&dummy).unwrap().set_len(1 << 20).unwrap();
    let out = Command::new("losetup").args(["-f", "--show"]).arg(&dummy).output().unwrap();
    let loopdev = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(out.status.success() && loopdev.starts_with("/dev/loop"), "losetup: {out:?}");
    let mounted = Command::new("mount").args(["-o", "loop"]).arg(dir.join("volume.img")).arg(&vol.mnt).status();
    let _ = Command::new("losetup").args(["-d", &loopdev]).status();
    assert!(mounted.unwrap().success());
    let dev_after = std::fs::metadata(&d).unwrap().dev();
    assert_ne!(dev_before, dev_after, "the volume must come back on another device number");

    let again = run_json(&vol, &[&path, "--incremental"]);
    assert_eq!(num(&again, "bytes_hashed"), 0, "rehashed on another device number: {again:#}");
    assert_eq!((num(&again, "files_removed"), num(&again, "files_unchanged")), (0, 4), "{again:#}");
    before.assert_same(&Snapshot::take(&d));
}

/// A starting path below the root of a read-only snapshot is inside it as
/// much as the root is: left alone (unless `--include-readonly-snapshots`),
/// counted and warned about, whether it is a directory or a file. The crawl
/// recognised a read-only snapshot only at its root directory.
#[test]
fn a_starting_path_inside_a_readonly_snapshot_is_left_alone() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    btrfs(&["subvolume", "create"], &vol.path("sv2"));
    let data = Rng::new(14).bytes(1 << 20);
    std::fs::create_dir(vol.path("sv2/sub")).unwrap();
    for f in ["a", "b", "c"] {
        std::fs::write(vol.path("sv2/sub").join(f), &data).unwrap();
    }
    sh(Command::new("btrfs").args(["-q", "subvolume", "snapshot", "-r"]).arg(vol.path("sv2")).arg(vol.path("snapro2")));
    btrfs(&["-q", "subvolume", "delete"], &vol.path("sv2"));
    // Until the deleted subvolume is cleaned up, its files still hold the
    // extents and nothing would be shared anyway (`pending`).
    btrfs(&["subvolume", "sync"], &vol.mnt);
    let sub = vol.path("snapro2/sub");
    let files: Vec<_> = ["a", "b", "c"].iter().map(|f| sub.join(f)).collect();
    let phys = |p: &std::path::Path| physical_blocks(p, 0, 1 << 20);
    let phys_before: Vec<_> = files.iter().map(|p| phys(p)).collect();
    let before = Snapshot::take(&sub);

    let dir = dedupscan().arg(&sub).json().db(vol.db()).expect(0).run();
    let by_file = dedupscan().args(&files).json().db(vol.db()).expect(0).run();
    before.assert_same(&Snapshot::take(&sub));
    for (p, was) in files.iter().zip(&phys_before) {
        assert_eq!(&phys(p), was, "{} in the read-only snapshot was moved", p.display());
        assert_eq!(shared_bytes(p), 0, "{} in the read-only snapshot was shared", p.display());
    }
    for (what, out, skipped, n) in [("directory", &dir, "skipped_dirs", 1), ("files", &by_file, "skipped", 3)] {
        let r = &out.json;
        validate_report(r);
        assert_eq!(num(r, "deduped_bytes"), 0, "{what}: {r:#}");
        assert_eq!(num(r, "files_scanned"), 0, "{what}: {r:#}");
        assert_eq!(r[skipped]["readonly_snapshot"].as_u64(), Some(n), "{what}: {r:#}");
        assert!(out.stderr.contains("read-only btrfs snapshot"), "{what}: no warning:\n{}", out.stderr);
    }
}
