//! Sharing writes an inode under every one of its names, so a hard link
//! must not carry sharing past the policy or out of the tree: a file with
//! more than one name is shared only when the run's crawl saw all of its
//! names below the starting paths and left none out. Otherwise it is kept
//! out of the plan, as source and as destination, on every run, and counted
//! `hardlink_outside`.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use dedupscan::corpus::Rng;

const LEN: u64 = 2 << 20;

/// A real copy of `data` at `p` (written, not reflinked), directories made.
fn put(p: &Path, data: &[u8]) -> PathBuf {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
    p.to_owned()
}

fn phys(p: &Path) -> Vec<Option<u64>> {
    physical_blocks(p, 0, LEN)
}

/// The files kept out have every block where it was and share nothing.
fn untouched(kept_out: &[(PathBuf, Vec<Option<u64>>)], what: &str) {
    for (p, was) in kept_out {
        assert_eq!(&phys(p), was, "{what}: {} was moved", p.display());
        assert_eq!(shared_bytes(p), 0, "{what}: {} was shared", p.display());
    }
}

/// The report's count of files kept out for a hard link.
fn kept_out(r: &serde_json::Value) -> u64 {
    r["skipped"]["hardlink_outside"].as_u64().unwrap_or(0)
}

/// The reported case: a file behind a `.nodedup` marker and an excluded
/// file, each with a second name in a plain directory, next to copies of
/// the same data. Scanned first and then shared from the database (the
/// files unchanged), then shared again with `--rehash` (hashed afresh):
/// neither protected file is touched, the plain copies are shared, and a
/// hard-linked pair wholly inside the tree is shared with its copy.
fn protected_names(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let r = vol.path("t8");
    let mut rng = Rng::new(81);
    let (data, other) = (rng.bytes(LEN as usize), rng.bytes(LEN as usize));
    let a = put(&r.join("a"), &data);
    let dup = put(&r.join("plain/dup"), &data);
    let prot = put(&r.join("prot/f"), &data);
    std::fs::write(r.join("prot/.nodedup"), b"").unwrap();
    let iso = put(&r.join("excl/g.iso"), &data);
    std::fs::hard_link(&prot, r.join("plain/f-link")).unwrap();
    std::fs::hard_link(&iso, r.join("plain/g-link")).unwrap();
    // A pair of names both inside the tree, neither left out: shared.
    let pair = put(&r.join("pair/p"), &other);
    std::fs::hard_link(&pair, r.join("pair/p-link")).unwrap();
    let copy = put(&r.join("pair/q"), &other);
    let protected: Vec<_> = [&prot, &iso].iter().map(|p| (p.to_path_buf(), phys(p))).collect();
    let before = Snapshot::take(&r);
    let args = [s(&r), "--exclude", "**/*.iso"];

    let scan = dedupscan().arg("scan").args(args).json().db(vol.db()).expect(0).run().json;
    for (what, extra) in [("run on the scan's database", None), ("--rehash run", Some("--rehash"))] {
        let mut run: Vec<&str> = args.to_vec();
        run.extend(extra);
        let rep = run_json(&vol, &run);
        before.assert_same(&Snapshot::take(&r));
        untouched(&protected, what);
        assert!(same_physical(&a, 0, &dup, 0, LEN), "{what}: the plain copies were not shared: {rep:#}");
        assert!(same_physical(&pair, 0, &copy, 0, LEN), "{what}: the pair inside the tree was not shared: {rep:#}");
        assert_eq!(kept_out(&rep), 2, "{what}: {rep:#}");
        assert_eq!(num(&rep, "errors"), 0, "{what}: {rep:#}");
    }
    assert_eq!(kept_out(&scan), 2, "scan: {scan:#}");
}

#[test]
fn xfs_a_hard_link_does_not_carry_sharing_past_nodedup_or_exclude() {
    protected_names(Fs::Xfs);
}

#[test]
fn btrfs_a_hard_link_does_not_carry_sharing_past_nodedup_or_exclude() {
    protected_names(Fs::Btrfs);
}

/// A file with a second name outside the starting path is left alone (the
/// other name may be anyone's), counted, shown in the text report and named
/// with `-v`; copies of it inside the tree are still shared with each other.
fn name_outside(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let data = Rng::new(82).bytes(LEN as usize);
    let tree = vol.path("in");
    let x = put(&tree.join("x"), &data);
    let (y, z) = (put(&tree.join("y"), &data), put(&tree.join("z"), &data));
    std::fs::create_dir(vol.path("elsewhere")).unwrap();
    std::fs::hard_link(&x, vol.path("elsewhere/x-link")).unwrap();
    let kept = vec![(x.clone(), phys(&x))];
    let before = Snapshot::take(&vol.mnt);

    let text = dedupscan().arg(&tree).arg("-v").db(vol.db()).expect(0).run();
    before.assert_same(&Snapshot::take(&vol.mnt));
    untouched(&kept, "text run");
    assert!(same_physical(&y, 0, &z, 0, LEN), "the copies inside the tree were not shared");
    assert!(text.stdout.contains("hardlink_outside"), "not in the text report:\n{}", text.stdout);
    assert!(text.stderr.contains(s(&x)), "-v does not name the file kept out:\n{}", text.stderr);
    // `report` plans as the run did: the file kept out is counted, not
    // "not yet shared" (before: its whole length, every night).
    let rep = db_report(&vol);
    assert_eq!((num(&rep, "kept_out_files"), num(&rep, "unshared_bytes")), (1, 0), "{rep:#}");

    // A starting path that is the file itself: its other name is still
    // outside.
    let r = run_json(&vol, &[s(&x), s(&y), s(&z)]);
    before.assert_same(&Snapshot::take(&vol.mnt));
    untouched(&kept, "files as starting paths");
    assert_eq!(kept_out(&r), 1, "{r:#}");

    // The other name goes: the next run shares the file, and `report` no
    // longer keeps it out.
    std::fs::remove_file(vol.path("elsewhere/x-link")).unwrap();
    let r = run_json(&vol, &[s(&tree)]);
    assert_eq!(kept_out(&r), 0, "{r:#}");
    assert!(same_physical(&x, 0, &y, 0, LEN), "x not shared once its other name is gone: {r:#}");
    let rep = db_report(&vol);
    assert_eq!((num(&rep, "kept_out_files"), num(&rep, "unshared_bytes")), (0, 0), "{rep:#}");
}

#[test]
fn xfs_a_hard_link_outside_the_starting_path_is_left_alone() {
    name_outside(Fs::Xfs);
}

#[test]
fn btrfs_a_hard_link_outside_the_starting_path_is_left_alone() {
    name_outside(Fs::Btrfs);
}

/// One copy of an rsnapshot-like backup (every file with a second name in
/// the next copy), more files than the run handles at a time (65,536):
/// scanned alone, every one is kept out, named with `-v`, counted by the
/// run and by `report`, and nothing is shared; scanned with the other
/// copy, all are let in again, unchanged, and the copies among them are
/// planned (by a preview, then by a real run) and shared.
#[test]
fn xfs_one_copy_of_a_hard_linked_backup_is_kept_out_whole() {
    const FILES: usize = 70_000;
    let Some(vol) = Volume::new(Fs::Xfs, 700) else { return };
    let (daily0, daily1) = (vol.path("daily.0"), vol.path("daily.1"));
    // Files of two blocks; the first 1,000 are 500 pairs of copies.
    let content = |i: usize| {
        let key = if i < 1000 { i % 500 } else { i } as u64;
        let mut b = vec![0xa5u8; 8192];
        b[..8].copy_from_slice(&key.to_le_bytes());
        b[4096..4104].copy_from_slice(&(!key).to_le_bytes());
        b
    };
    let path = |root: &Path, i: usize| root.join(format!("d{:03}/f{i:05}", i / 1000));
    for i in 0..FILES {
        put(&path(&daily0, i), &content(i));
        std::fs::create_dir_all(path(&daily1, i).parent().unwrap()).unwrap();
        std::fs::hard_link(path(&daily0, i), path(&daily1, i)).unwrap();
    }
    let (a, b) = (path(&daily0, 7), path(&daily0, 507));
    let before = Snapshot::take(&vol.mnt);

    let out = dedupscan().arg(&daily0).arg("-v").json().db(vol.db()).expect(0).run();
    before.assert_same(&Snapshot::take(&vol.mnt));
    assert_eq!(kept_out(&out.json), FILES as u64, "{:#}", out.json);
    let named = out.stderr.lines().filter(|l| l.contains("another of its hard links is outside")).count();
    assert_eq!(named, FILES, "-v names each file kept out once");
    assert_eq!(shared_bytes(&a) + shared_bytes(&b), 0, "a file kept out was shared");
    assert_eq!(num(&db_report(&vol), "kept_out_files"), FILES as u64);

    // Let in again, though none of them changed: planned by a preview,
    // which shares nothing, and then by the run that shares (each an
    // incremental run after the complete first one).
    let r = run_json(&vol, &[s(&vol.mnt), "--dry-run"]);
    assert_eq!((kept_out(&r), num(&r, "ranges_planned")), (0, 500), "{r:#}");
    assert_eq!(shared_bytes(&a) + shared_bytes(&b), 0, "the preview shared");
    let r = run_json(&vol, &[s(&vol.mnt)]);
    assert_eq!((kept_out(&r), num(&r, "ranges_planned")), (0, 500), "{r:#}");
    assert!(same_physical(&a, 0, &b, 0, 8192), "the copies were not shared once both names were seen: {r:#}");
    assert_eq!(num(&db_report(&vol), "kept_out_files"), 0);
}
