//! What is already shared on disk is not grouped again (issue 14: hold
//! less). Reflinked near-copies of an image — VM clones that diverged a
//! little, writable snapshots, files a previous run deduplicated — share
//! most of their extents. The plan used to group every block of every copy
//! by fingerprint (12 bytes a member for the whole plan, 16 while
//! grouping), then found them already shared: sixty-four reflinked
//! near-copies of a 1 GiB image took 447 MB and 4.9 s to plan nothing. Now
//! the scan records where each file's shared extents lie, and the plan
//! groups each shared physical block once (`plan::claims`).
//!
//! Attacked here: memory (the old build's peak is several times the new
//! one's), the savings a third, unshared copy still brings (it must be
//! shared into the extent the clones keep, not the other way round, which
//! would free nothing), and that nothing is lost.

mod common;

use common::bounded::*;
use common::*;
use std::os::unix::fs::FileExt;
use std::process::Command;

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;
const IMAGE: u64 = 32 * MIB;
const CLONES: u64 = 256;
/// Blocks each clone rewrites (its own data: never shared).
const REWRITTEN: u64 = 4;

/// Rewrite `n` distinct blocks of `path` with fresh random data, chosen by
/// `seed`; returns how many distinct blocks were rewritten.
fn rewrite_blocks(path: &std::path::Path, seed: u64, n: u64) -> u64 {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let mut rng = dedupscan::corpus::Rng::new(seed);
    let mut at = std::collections::BTreeSet::new();
    while (at.len() as u64) < n {
        at.insert(rng.next_u64() % (IMAGE / BLOCK));
    }
    for &b in &at {
        f.write_all_at(&rng.bytes(BLOCK as usize), b * BLOCK).unwrap();
    }
    f.sync_all().unwrap();
    n
}

/// An image, `CLONES` reflinked near-copies of it, and one copy written on
/// its own (unshared) with a few blocks of its own too.
fn near_clones_are_grouped_once(fs: Fs) {
    let Some(vol) = Volume::new(fs, 600) else { return };
    let d = vol.path("images");
    std::fs::create_dir(&d).unwrap();
    let data = dedupscan::corpus::Rng::new(7).bytes(IMAGE as usize);
    std::fs::write(d.join("base.img"), &data).unwrap();
    let mut own = 0;
    for i in 0..CLONES {
        let p = d.join(format!("clone{i:03}.img"));
        reflink(&d.join("base.img"), &p);
        own += rewrite_blocks(&p, 1000 + i, REWRITTEN);
    }
    std::fs::write(d.join("copy.img"), &data).unwrap();
    rewrite_blocks(&d.join("copy.img"), 99, 3);
    let before = Snapshot::take(&d);
    vol.remount();
    let free_before = free_bytes(&vol.mnt);

    let run = bounded(&vol, &[s(&d)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let r = &run.json;
    before.assert_same(&Snapshot::take(&d));

    // The unshared copy is shared into the extent base and clones keep
    // (all but its own three blocks), and that frees its blocks.
    let kept = (IMAGE / BLOCK - 3) * BLOCK;
    assert!(num(r, "deduped_bytes") >= kept, "{r:#}");
    let freed = free_bytes(&vol.mnt).saturating_sub(free_before);
    assert!(freed >= kept - MIB, "freed {freed} bytes of the copy's {kept}: {r:#}");
    let (base, copy) = (d.join("base.img"), d.join("copy.img"));
    let shared_blocks =
        (0..IMAGE / BLOCK).filter(|&b| same_physical(&base, b * BLOCK, &copy, b * BLOCK, BLOCK)).count();
    assert!(shared_blocks as u64 >= IMAGE / BLOCK - 3 - REWRITTEN * CLONES, "{shared_blocks} blocks shared");
    // What the clones already share is reported as such, measured by the
    // scan's FIEMAP: every block of theirs but their own.
    let clone_shared = CLONES * IMAGE - own * BLOCK;
    assert!(num(r, "already_shared_bytes") >= clone_shared, "{r:#}");

    // Grouping the clones' blocks (8 GiB, two million blocks) took 68-71
    // MiB before; 23-24 MiB now: the scan's and the plan of one copy.
    assert!(run.max_rss < 40 * MIB, "peak RSS {} MiB", run.max_rss / MIB);
    validate_report(r);

    // `report` plans the same way, and says the same.
    let rep = db_report(&vol);
    assert!(num(&rep, "shared_bytes") >= clone_shared + kept, "{rep:#}");

    // One more clone, and a nightly run: it groups the fresh file's
    // fingerprints — every clone has them — and claims where the fresh
    // file lies (here the image's extent, which every clone shares): all
    // found shared, in bounded memory, nothing shared anew.
    let late = d.join("late.img");
    reflink(&base, &late);
    let late_own = rewrite_blocks(&late, 5000, REWRITTEN);
    let before = Snapshot::take(&d);
    let nightly = bounded(&vol, &["--incremental", s(&d)]);
    assert_eq!(nightly.code, 0, "{}", nightly.stderr);
    let n = &nightly.json;
    assert_eq!(num(n, "files_hashed"), 1, "{n:#}");
    // (Not the blocks where the late clone has its own data: no fresh
    // fingerprint leads there.)
    let fresh_shared = clone_shared + IMAGE - (CLONES + 1) * late_own * BLOCK;
    assert!(num(n, "already_shared_bytes") >= fresh_shared, "{n:#}");
    assert_eq!(num(n, "deduped_bytes"), 0, "{n:#}");
    assert!(nightly.max_rss < 40 * MIB, "peak RSS {} MiB", nightly.max_rss / MIB);
    before.assert_same(&Snapshot::take(&d));
}

#[test]
fn btrfs_near_clones_are_grouped_once() {
    near_clones_are_grouped_once(Fs::Btrfs);
}

#[test]
fn xfs_near_clones_are_grouped_once() {
    near_clones_are_grouped_once(Fs::Xfs);
}

/// A user who can read a root file reflinks it into a file of theirs made
/// earlier (a lower inode number, so it would claim the shared blocks).
/// Claims are per owner, like groups, and a file another owner's file
/// keeps extents of is preferred as a source: root's near-copy of the file
/// must still be shared into root's file (the other way round it would be
/// left pending: root's extent stays for the user's reflink).
fn a_users_reflink_does_not_keep_roots_copies_apart(fs: Fs) {
    const SIZE: u64 = 16 * MIB;
    let Some(vol) = Volume::new(fs, 400) else { return };
    let d = vol.path("data");
    std::fs::create_dir_all(&d).unwrap();
    // Root made it for the user (same directory: XFS numbers a directory's
    // inodes in order of creation, as btrfs numbers all of them).
    let theirs = d.join("u.img");
    std::fs::write(&theirs, b"").unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let data = dedupscan::corpus::Rng::new(8).bytes(SIZE as usize);
    let (root, copy) = (d.join("r.img"), d.join("r2.img"));
    std::fs::write(&root, &data).unwrap();
    std::fs::write(&copy, &data).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&copy).unwrap();
    f.write_all_at(&[1u8; 4096], 0).unwrap();
    f.write_all_at(&[2u8; 4096], SIZE / 2).unwrap();
    drop(f);
    let as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cp", "--reflink=always"];
    let ok = Command::new(as_user[0]).args(&as_user[1..]).arg(&root).arg(&theirs).status().unwrap();
    assert!(ok.success(), "the user's cp --reflink=always");
    use std::os::unix::fs::MetadataExt;
    let ino = |p: &std::path::Path| std::fs::metadata(p).unwrap().ino();
    assert!(ino(&theirs) < ino(&root), "the user's file must have the lower inode for this attack");
    assert!(same_physical(&theirs, 0, &root, 0, SIZE), "the user's reflink");
    let before = Snapshot::take(&d);
    vol.remount();
    let free_before = free_bytes(&vol.mnt);

    let r = run_json(&vol, &[s(&d)]);
    before.assert_same(&Snapshot::take(&d));
    let (a, b) = (BLOCK, SIZE / 2 - BLOCK);
    assert!(same_physical(&root, a, &copy, a, b), "root's near-copy was not shared with root's file: {r:#}");
    let freed = free_bytes(&vol.mnt).saturating_sub(free_before);
    assert!(freed >= SIZE - 2 * MIB, "freed {freed} bytes of the copy's {SIZE}: {r:#}");
    validate_report(&r);
}

#[test]
fn btrfs_a_users_reflink_does_not_keep_roots_copies_apart() {
    a_users_reflink_does_not_keep_roots_copies_apart(Fs::Btrfs);
}

#[test]
fn xfs_a_users_reflink_does_not_keep_roots_copies_apart() {
    a_users_reflink_does_not_keep_roots_copies_apart(Fs::Xfs);
}
