//! Where the kernel cannot free anything: a destination whose extent a
//! read-only snapshot outside the run also references stays allocated
//! whatever the run does. It is not shared (that would only add metadata),
//! it is counted by reason, and it is shared by a later run, incremental
//! or not, once the snapshot is gone.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use dedupscan::corpus::Rng;

/// A subvolume `sub` holding two copies `a` and `b` of `len` bytes, and a
/// read-only snapshot `snap` of it.
fn snapshotted_copies(len: usize) -> Option<(Volume, PathBuf, PathBuf)> {
    let vol = Volume::new(Fs::Btrfs, 256)?;
    let sub = vol.path("sub");
    btrfs(&["subvolume", "create"], &sub);
    let data = Rng::new(9).bytes(len);
    std::fs::write(sub.join("a"), &data).unwrap();
    std::fs::write(sub.join("b"), &data).unwrap();
    btrfs(&["filesystem", "sync"], &vol.mnt);
    let snap = vol.path("snap");
    let out = Command::new("btrfs").args(["subvolume", "snapshot", "-r"]).arg(&sub).arg(&snap).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Some((vol, sub, snap))
}

/// Delete the snapshot and let the cleaner drop its references.
fn delete_snapshot(vol: &Volume, snap: &Path) {
    btrfs(&["subvolume", "delete"], snap);
    // A commit wakes the cleaner, which drops the snapshot's references.
    btrfs(&["filesystem", "sync"], &vol.mnt);
    btrfs(&["subvolume", "sync"], &vol.mnt);
}

#[test]
fn extents_pinned_by_a_readonly_snapshot_are_left_until_it_is_gone() {
    let len = 4 << 20;
    let Some((vol, sub, snap)) = snapshotted_copies(len) else { return };
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
    delete_snapshot(&vol, &snap);
    // A dry run previews that: nothing would be left pending any more.
    let dry = run_json(&vol, &[path, "--incremental", "--dry-run"]);
    assert_eq!(num(&dry, "duplicate_bytes"), len as u64, "{dry:#}");
    assert_eq!(num(&dry, "pending_bytes"), 0, "the dry run shows what an earlier run left: {dry:#}");
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

/// `--share-snapshotted` (rotating snapshots: the newest always keeps every
/// old extent): shared at once, nothing freed while the snapshot stays, the
/// copy's old extent freed with the snapshot.
#[test]
fn share_snapshotted_shares_now_and_frees_when_the_snapshot_goes() {
    let len = 4 << 20;
    let Some((vol, sub, snap)) = snapshotted_copies(len) else { return };
    let before = Snapshot::take(&sub);
    let kept = Snapshot::take(&snap);
    let phys = |p: &Path| physical_blocks(p, 0, len as u64);
    let snap_blocks = (phys(&snap.join("a")), phys(&snap.join("b")));

    let r = run_json(&vol, &[sub.to_str().unwrap(), "--share-snapshotted"]);
    before.assert_same(&Snapshot::take(&sub));
    kept.assert_same(&Snapshot::take(&snap));
    assert_eq!(num(&r, "deduped_bytes"), len as u64, "{r:#}");
    assert_eq!(num(&r, "pending_bytes"), 0, "{r:#}");
    assert!(same_physical(&sub.join("a"), 0, &sub.join("b"), 0, len as u64), "{r:#}");
    assert_eq!((phys(&snap.join("a")), phys(&snap.join("b"))), snap_blocks, "the snapshot's extents moved");

    // The snapshot held the only other reference to one copy's old extent.
    let free0 = free_bytes(&vol.mnt);
    delete_snapshot(&vol, &snap);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    assert!(freed >= len as i64 * 95 / 100, "deleting the snapshot freed {freed}");
    before.assert_same(&Snapshot::take(&sub));
}

/// A subvolume `sub` with two copies of `len` random bytes, `a` and `b`
/// (separate extents), of which a read-only snapshot `snap` holds `b` only
/// (its `a` is empty): `a` is created first, so the planner, which orders
/// equal copies by inode, picks `a` as the source and plans the copy the
/// snapshot keeps as its destination.
fn snapshotted_destination(len: usize) -> Option<(Volume, PathBuf, PathBuf)> {
    snapshotted_copy_among(len, &["a"])
}

/// The same with more copies the snapshot does not keep: `names`, created
/// (empty) in that order before `b`, so that `b` comes last by inode.
fn snapshotted_copy_among(len: usize, names: &[&str]) -> Option<(Volume, PathBuf, PathBuf)> {
    let vol = Volume::new(Fs::Btrfs, 256)?;
    let sub = vol.path("sub");
    btrfs(&["subvolume", "create"], &sub);
    let data = Rng::new(12).bytes(len);
    for n in names {
        std::fs::write(sub.join(n), b"").unwrap();
    }
    std::fs::write(sub.join("b"), &data).unwrap();
    btrfs(&["filesystem", "sync"], &vol.mnt);
    let snap = vol.path("snap");
    let out = Command::new("btrfs").args(["subvolume", "snapshot", "-r"]).arg(&sub).arg(&snap).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for n in names {
        std::fs::write(sub.join(n), &data).unwrap();
    }
    btrfs(&["filesystem", "sync"], &vol.mnt);
    assert!(!same_physical(&sub.join("a"), 0, &sub.join("b"), 0, len as u64), "setup: a and b share");
    assert!(same_physical(&sub.join("b"), 0, &snap.join("b"), 0, len as u64), "setup: the snapshot's b is not b's");
    Some((vol, sub, snap))
}

/// Five copies, the snapshot keeping the last by inode: the planner sees
/// three of them and the others follow in a plan of their own
/// (`plan::copies`); the role still goes to the snapshot's copy, and the
/// four others' extents are freed (with the followers' plan made after `a`
/// had been shared with the second copy, `a`'s extent stayed: 3 of 4 freed).
#[test]
fn among_many_copies_the_one_a_snapshot_keeps_becomes_the_source() {
    let len = 4 << 20;
    let Some((vol, sub, snap)) = snapshotted_copy_among(len, &["a", "c", "d", "e"]) else { return };
    let (before, kept) = (Snapshot::take(&sub), Snapshot::take(&snap));
    let snap_b = snap.join("b");
    let free0 = free_bytes(&vol.mnt);
    let r = run_json(&vol, &[s(&sub)]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    assert_eq!(num(&r, "sources_swapped"), 1, "{r:#}");
    for n in ["a", "b", "c", "d", "e"] {
        assert!(same_physical(&sub.join(n), 0, &snap_b, 0, len as u64), "{n} is not on the snapshot's extent: {r:#}");
    }
    assert!(freed >= 4 * len as i64 * 95 / 100, "freed {freed} of {}: {r:#}", 4 * len);
    before.assert_same(&Snapshot::take(&sub));
    kept.assert_same(&Snapshot::take(&snap));
}

/// The planned source is `a`, the destination the snapshotted `b`.
fn assert_planned_a_into_b(report: &serde_json::Value, sub: &Path) {
    let ranges = report["ranges"].as_array().unwrap_or_else(|| panic!("no ranges: {report:#}"));
    assert_eq!(ranges.len(), 1, "{report:#}");
    assert_eq!(ranges[0]["source"], s(&sub.join("a")), "setup: the planner picked another source: {report:#}");
    assert_eq!(ranges[0]["destination"], s(&sub.join("b")), "{report:#}");
}

/// The planner picked the copy nobody else keeps as the source and the
/// copy a read-only snapshot keeps as its destination: sharing into that
/// would free nothing, so the roles are swapped: the source is shared into
/// the snapshot's extent and its own extent is freed now.
#[test]
fn a_copy_a_snapshot_keeps_becomes_the_source() {
    let len = 6 << 20;
    let Some((vol, sub, snap)) = snapshotted_destination(len) else { return };
    let (a, b, snap_b) = (sub.join("a"), sub.join("b"), snap.join("b"));
    let before = Snapshot::take(&sub);
    let kept = Snapshot::take(&snap);
    let snap_blocks = physical_blocks(&snap_b, 0, len as u64);

    let free0 = free_bytes(&vol.mnt);
    let out = dedupscan().args([s(&sub), "--list"]).json().db(vol.db()).expect(0).run();
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    validate_report(&out.json);
    let r = out.json;
    assert_planned_a_into_b(&r, &sub);
    before.assert_same(&Snapshot::take(&sub));
    kept.assert_same(&Snapshot::take(&snap));
    assert_eq!(physical_blocks(&snap_b, 0, len as u64), snap_blocks, "the snapshot's extents moved");
    assert!(same_physical(&a, 0, &snap_b, 0, len as u64), "a does not share the snapshot's extent: {r:#}");
    assert!(same_physical(&b, 0, &snap_b, 0, len as u64), "b left the snapshot's extent: {r:#}");
    assert_eq!(num(&r, "sources_swapped"), 1, "{r:#}");
    assert_eq!(num(&r, "deduped_bytes"), len as u64, "{r:#}");
    assert_eq!(num(&r, "pending_bytes"), 0, "{r:#}");
    assert!(r["pending"].as_object().is_some_and(|p| p.is_empty()), "{r:#}");
    assert!(freed >= len as i64 * 95 / 100, "freed {freed} of {len}: {r:#}");
    assert!(r["freed_bytes"].as_i64().unwrap() >= len as i64 * 95 / 100, "{r:#}");

    // A rerun finds everything shared: nothing submitted, nothing pending.
    let again = run_json(&vol, &[s(&sub)]);
    assert_eq!(num(&again, "duplicate_bytes"), 0, "{again:#}");
    assert_eq!(num(&again, "pending_bytes"), 0, "{again:#}");
    before.assert_same(&Snapshot::take(&sub));
    kept.assert_same(&Snapshot::take(&snap));
}

/// The dry run decides the swap the same way: its preview counts what the
/// real run then does, and it changes nothing.
#[test]
fn the_preview_counts_the_swap_to_a_snapshotted_copy() {
    let len = 3 << 20;
    let Some((vol, sub, snap)) = snapshotted_destination(len) else { return };
    let before = Snapshot::take(&sub);
    let kept = Snapshot::take(&snap);

    let dry = run_json(&vol, &[s(&sub), "--dry-run", "--list"]);
    assert_planned_a_into_b(&dry, &sub);
    before.assert_same(&Snapshot::take(&sub));
    assert!(!same_physical(&sub.join("a"), 0, &sub.join("b"), 0, len as u64), "the dry run shared");
    assert_eq!(num(&dry, "duplicate_bytes"), len as u64, "{dry:#}");
    assert_eq!(num(&dry, "sources_swapped"), 1, "{dry:#}");

    let real = run_json(&vol, &[s(&sub)]);
    before.assert_same(&Snapshot::take(&sub));
    kept.assert_same(&Snapshot::take(&snap));
    for key in ["duplicate_bytes", "sources_swapped", "ranges_planned"] {
        assert_eq!(num(&real, key), num(&dry, key), "{key}: preview {dry:#}\nrun {real:#}");
    }
    assert_eq!(num(&real, "deduped_bytes"), len as u64, "{real:#}");
    assert_eq!(num(&real, "pending_bytes"), 0, "{real:#}");
}

/// `x`, `n` pieces of `piece` random bytes written in one pass, each
/// piece reflinked into a file `run/y{i}` of its own, and a copy of all
/// of it written anew, `run/z`: the stretches are its duplicates.
fn pieces_and_copy(vol: &Volume, x: &Path, run: &Path, (n, piece): (usize, u64), seed: u64) {
    std::fs::create_dir(run).unwrap();
    let data = Rng::new(seed).bytes(n * piece as usize);
    std::fs::write(x, &data).unwrap();
    btrfs(&["filesystem", "sync"], &vol.mnt);
    let x = std::fs::File::open(x).unwrap();
    for i in 0..n as u64 {
        let y = std::fs::File::create(run.join(format!("y{i}"))).unwrap();
        clone_range(&x, i * piece, piece, &y, 0);
    }
    std::fs::write(run.join("z"), &data).unwrap();
    btrfs(&["filesystem", "sync"], &vol.mnt);
}

/// One extent a file outside the run holds whole and each of many files
/// of the run holds a stretch of (an image shared piecemeal into a tree's
/// files by an earlier run): btrfs is asked who holds it once per share
/// worker, not once per stretch. Each question walks every reference of
/// the extent, so asked per stretch the walks grew with the square of the
/// stretches: a nightly run adding a VM image's copy to FULL took 15 s,
/// one adding the layered corpus 108 s (`benches/slices.sh`). The build
/// before asks 600 times here.
#[test]
fn btrfs_an_extent_held_in_many_stretches_is_asked_about_once_per_worker() {
    let (n, piece) = (600, 8192u64);
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let (out, run) = (vol.path("out"), vol.path("run"));
    std::fs::create_dir(&out).unwrap();
    pieces_and_copy(&vol, &out.join("x"), &run, (n, piece), 5);
    let before = Snapshot::take(&run);

    let trace = vol.db().with_extension("trace");
    let strace = ["strace", "-f", "-qq", "-e", "trace=ioctl", "-o", s(&trace)];
    let r = dedupscan().under(strace).arg(&run).json().arg("--progress=never").db(vol.db()).expect(0).run().json;
    before.assert_same(&Snapshot::take(&run));
    // `out/x` keeps the extent: nothing is shared into it, all of it waits.
    let pending = &r["pending"]["referenced_outside_run"];
    assert_eq!(pending["bytes"].as_u64(), Some(n as u64 * piece), "{r:#}");
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(text.lines().any(|l| l.contains("FIDEDUPERANGE") || l.contains("FS_IOC_FIEMAP")), "is strace working?");
    let asked = text.lines().filter(|l| l.contains("BTRFS_IOC_LOGICAL_INO")).count();
    assert!((1..=8).contains(&asked), "btrfs asked {asked} times who holds one extent (held in {n} stretches)");
}

/// An extent held by more files than one 64 KiB answer lists (3,000
/// stretches of an image since deleted, one a file; a reference takes 24
/// bytes of the answer, so 2,730 fit), every one of them a file of the
/// run, and a copy of all of it written anew. Nothing outside the run holds
/// the extent, so sharing it frees it: btrfs is asked again with room for
/// all of them, not taken to name a holder outside.
#[test]
fn btrfs_an_extent_held_by_more_files_of_the_run_than_one_answer_lists_is_freed() {
    let (n, piece) = (3000, 8192u64);
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let run = vol.path("run");
    pieces_and_copy(&vol, &vol.path("x"), &run, (n, piece), 6);
    std::fs::remove_file(vol.path("x")).unwrap();
    btrfs(&["filesystem", "sync"], &vol.mnt);
    let before = Snapshot::take(&run);

    let dry = run_json(&vol, &[s(&run), "--dry-run"]);
    assert_eq!(num(&dry, "pending_bytes"), 0, "the preview: {dry:#}");
    let free0 = free_bytes(&vol.mnt);
    let r = run_json(&vol, &[s(&run)]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    before.assert_same(&Snapshot::take(&run));
    assert_eq!((num(&r, "errors"), num(&r, "pending_bytes")), (0, 0), "{r:#}");
    assert!(freed >= (n as u64 * piece - (1 << 20)) as i64, "freed {freed} of {}: {r:#}", n as u64 * piece);
}
