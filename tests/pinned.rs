//! Where the kernel cannot free anything: a destination whose extent a
//! read-only snapshot outside the run also references stays allocated
//! whatever the run does. It is not shared (that would only add metadata),
//! it is counted by reason, and it is shared by a later run, incremental
//! or not, once the snapshot is gone.

mod common;

use std::process::Command;

use common::*;
use dedupscan::corpus::Rng;

#[test]
fn extents_pinned_by_a_readonly_snapshot_are_left_until_it_is_gone() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let sub = vol.path("sub");
    btrfs(&["subvolume", "create"], &sub);
    let len = 4 << 20;
    let data = Rng::new(9).bytes(len);
    std::fs::write(sub.join("a"), &data).unwrap();
    std::fs::write(sub.join("b"), &data).unwrap();
    btrfs(&["filesystem", "sync"], &vol.mnt);
    let snap = vol.path("snap");
    let out = Command::new("btrfs").args(["subvolume", "snapshot", "-r"]).arg(&sub).arg(&snap).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let path = sub.to_str().unwrap();
    let before = Snapshot::take(&sub);

    let first = run_json(&vol, &[path, "--incremental"]);
    before.assert_same(&Snapshot::take(&sub));
    assert_eq!(num(&first, "duplicate_bytes"), 0, "shared into an extent a snapshot keeps: {first:#}");
    assert_eq!(first["pending"]["referenced_outside_run"]["bytes"].as_u64(), Some(len as u64), "{first:#}");
    assert!(!same_physical(&sub.join("a"), 0, &sub.join("b"), 0, len as u64));

    // While the snapshot stays, a nightly run with nothing changed does not
    // plan the pinned group again (its extents are still shared).
    let still = run_json(&vol, &[path, "--incremental"]);
    assert_eq!(num(&still, "ranges_planned"), 0, "replanned a still-pinned group: {still:#}");
    assert_eq!(num(&still, "pending_bytes"), len as u64, "{still:#}");

    // The snapshot goes: the next incremental run, with nothing changed,
    // shares and frees the copy.
    btrfs(&["subvolume", "delete"], &snap);
    // A commit wakes the cleaner, which drops the snapshot's references.
    btrfs(&["filesystem", "sync"], &vol.mnt);
    btrfs(&["subvolume", "sync"], &vol.mnt);
    let free0 = free_bytes(&vol.mnt);
    let second = run_json(&vol, &[path, "--incremental"]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    before.assert_same(&Snapshot::take(&sub));
    assert_eq!(num(&second, "files_hashed"), 0, "{second:#}");
    assert_eq!(num(&second, "deduped_bytes"), len as u64, "{second:#}");
    assert_eq!(num(&second, "pending_bytes"), 0, "{second:#}");
    assert!(freed >= len as i64 * 95 / 100, "freed {freed}: {second:#}");
    assert!(same_physical(&sub.join("a"), 0, &sub.join("b"), 0, len as u64));
}
