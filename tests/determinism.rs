//! The plan is a function of the data: five full runs on fresh copies of one
//! btrfs volume, with 1, 2 and 8 hashing threads (so files reach the
//! database in different orders and get different row ids), and one more on
//! a copy whose directories were renamed, give the same plan range for
//! range (named by inode number, which a fresh copy and a rename keep), the
//! same bytes on disk after the run (each extent once), and the same freed
//! bytes within 0.2 points of the ideal or btrfs's metadata noise.
//!
//! The tree is "layered": the same files as whole files in two trees (every
//! third in five: the planner sees three copies, the others follow), inside
//! two raw images at different 4 KiB-aligned offsets (with blocks of their
//! own around them), and repeated inside one file, so whole-file groups and
//! runs inside images must be joined into one copy per content.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

use common::*;
use dedupscan::corpus::Rng;
use dedupscan::db::Db;
use dedupscan::file::FileId;
use dedupscan::plan::{self, Limits, PlanOptions};

const BLK: usize = 4096;

/// The layered tree under `dir`.
fn build(dir: &Path) {
    let mut rng = Rng::new(77);
    // Files of 1 to 24 blocks, some with an unaligned tail.
    let files: Vec<Vec<u8>> = (0..40)
        .map(|i| {
            let len = BLK * (1 + rng.below(24) as usize) - if i % 5 == 0 { 300 } else { 0 };
            rng.bytes(len)
        })
        .collect();
    for tree in ["roots/alpha", "roots/beta"] {
        std::fs::create_dir_all(dir.join(tree)).unwrap();
        for (i, f) in files.iter().enumerate() {
            std::fs::write(dir.join(format!("{tree}/f{i:02}.bin")), f).unwrap();
        }
    }
    // Every third file in three more trees: whole-file groups of five
    // copies, of which the planner sees three and the others follow.
    for tree in ["roots/gamma", "roots/delta", "roots/epsilon"] {
        std::fs::create_dir_all(dir.join(tree)).unwrap();
        for (i, f) in files.iter().enumerate().step_by(3) {
            std::fs::write(dir.join(format!("{tree}/f{i:02}.bin")), f).unwrap();
        }
    }
    // Two images: the files padded to 4 KiB, in two different orders, with
    // blocks of their own in between (so the images stay partly unique).
    std::fs::create_dir_all(dir.join("images")).unwrap();
    for (name, seed) in [("one.img", 1u64), ("two.img", 2)] {
        let mut order: Vec<usize> = (0..files.len()).collect();
        let mut r = Rng::new(seed);
        for i in (1..order.len()).rev() {
            order.swap(i, r.below(i as u64 + 1) as usize);
        }
        let mut img = Vec::new();
        for i in order {
            let own = BLK * (1 + r.below(3) as usize);
            img.extend(r.bytes(own));
            img.extend(&files[i]);
            img.resize(img.len().div_ceil(BLK) * BLK, 0);
        }
        std::fs::write(dir.join("images").join(name), img).unwrap();
    }
    // A block repeated inside one file, and a file that is four copies of one.
    std::fs::create_dir_all(dir.join("misc")).unwrap();
    let blk = rng.bytes(BLK);
    let mut rep = rng.bytes(3 * BLK);
    for _ in 0..3 {
        rep.extend(&blk);
        rep.extend(rng.bytes(2 * BLK));
    }
    std::fs::write(dir.join("misc/repeats.bin"), rep).unwrap();
    std::fs::write(dir.join("misc/fourfold.bin"), files[3].repeat(4)).unwrap();
    // A sparse copy of one image with a hole in front: shifted runs, holes.
    let one = std::fs::read(dir.join("images/one.img")).unwrap();
    let f = std::fs::File::create(dir.join("misc/sparse.img")).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&one[..one.len() / 2], 64 * BLK as u64).unwrap();
}

/// One run on a fresh copy: the plan as `(src ino, src off, len, dest ino,
/// dest off)`, freed bytes, ideal duplicate bytes, bytes on disk after.
type Key = (u64, u64, u64, u64, u64);

fn run_on_copy(pristine: &Path, work: &Path, n: usize, threads: &str, rename: bool) -> (Vec<Key>, u64, u64, u64) {
    let img = work.join("copy.img");
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    sh(Command::new("cp").arg("--sparse=always").arg("--reflink=never").arg(pristine).arg(&img));
    sh(Command::new("mount").args(["-o", "loop"]).arg(&img).arg(&mnt));
    let _guard = Unmount(mnt.clone());
    let root = mnt.join("data");
    if rename {
        // Names sort the other way round now; inode numbers stay.
        for (a, b) in [("roots", "zz-roots"), ("images", "aa-images"), ("misc", "00-misc")] {
            std::fs::rename(root.join(a), root.join(b)).unwrap();
        }
        std::fs::rename(root.join("zz-roots/alpha"), root.join("zz-roots/zeta")).unwrap();
    }
    let ideal = ideal_dup_bytes(&root);
    let before = Snapshot::take(&root);
    let db = work.join(format!("db-{n}.sqlite"));
    let report = dedupscan().arg(&root).args(["--threads", threads]).json().db(&db).expect(0).run().json;
    validate_report(&report);
    Snapshot::take(&root).assert_same(&before);
    let freed = report["freed_bytes"].as_i64().unwrap().max(0) as u64;
    // The data left on disk, each extent once (FIEMAP, like compsize).
    let on_disk = dedupscan().arg("report").json().db(&db).expect(0).run().json["on_disk_bytes"].as_u64().unwrap();
    // The plan the run used, rebuilt from its database.
    let db = Db::open_for_report(&db).unwrap();
    let all = db.all_ids().unwrap();
    let planned_for = |fresh: Option<&HashSet<FileId>>, limits| {
        let mut ranges = Vec::new();
        let stats = plan::from_db_with(&db, &all, fresh, PlanOptions::default(), limits, |p: plan::Plan| {
            ranges.extend(p.ranges);
            Ok::<(), rusqlite::Error>(())
        })
        .unwrap();
        (ranges, stats.batches, stats.map_passes)
    };
    let planned = |limits| planned_for(None, limits);
    // An incremental plan (every third file fresh) in many batches, each
    // grouped again in many slices, is the same too.
    let fresh: HashSet<FileId> = (1..=all.len() as i64).step_by(3).map(FileId).collect();
    let (mut one, ..) = planned_for(Some(&fresh), Limits::ONE_PIECE);
    let (mut tiny, n, _) = planned_for(Some(&fresh), Limits::TINY);
    one.sort_unstable();
    tiny.sort_unstable();
    assert!(!one.is_empty() && n >= 2, "{} ranges, {n} batches", one.len());
    assert_eq!(tiny, one, "incremental plan in tiny batches");
    // The same with the fresh fingerprints kept as keys, grouped in many
    // slices.
    let (mut keyed, _, passes) = planned_for(Some(&fresh), Limits { fresh_keys: u64::MAX, ..Limits::TINY });
    keyed.sort_unstable();
    assert!(passes >= 2, "{passes} passes");
    assert_eq!(keyed, one, "incremental plan, keyed, in tiny batches and slices");
    let (mut ranges, batches, passes) = planned(Limits::ONE_PIECE);
    assert_eq!((batches, passes), (1, 1), "no limits, one batch, one grouping pass");
    // With the default limits (copies beyond three follow in plans of
    // their own) and in many batches (tiny limits), the plan is the same,
    // range for range.
    ranges.sort_unstable();
    for (limits, least) in [(Limits::default(), 2), (Limits::TINY, 8)] {
        let (mut got, n, _) = planned(limits);
        assert!(n >= least, "{n} batches with {limits:?}");
        got.sort_unstable();
        assert_eq!(got, ranges, "{limits:?}");
    }
    // Tiny limits group blocks in hundreds of slices, written out to
    // temporary files by a few passes over the maps; where no temporary
    // file can be made, one pass per slice gives the same plan.
    let (_, _, written) = planned(Limits::TINY);
    let tmpdir = std::env::var_os("TMPDIR");
    std::env::set_var("TMPDIR", work.join("no-such-directory"));
    let (mut by_passes, _, passes) = planned(Limits::TINY);
    match tmpdir {
        Some(d) => std::env::set_var("TMPDIR", d),
        None => std::env::remove_var("TMPDIR"),
    }
    assert!(written < 8 && passes > 100, "{written} passes written out, {passes} without");
    by_passes.sort_unstable();
    assert_eq!(by_passes, ranges, "one pass per slice");
    let facts = db.file_facts(ranges.iter().flat_map(|r| [r.src, r.dest])).unwrap();
    let mut plan: Vec<Key> =
        ranges.iter().map(|r| (facts[&r.src].key.ino, r.src_off, r.len, facts[&r.dest].key.ino, r.dest_off)).collect();
    plan.sort_unstable();
    (plan, freed, ideal, on_disk)
}

#[test]
fn five_fresh_copies_and_a_renamed_one_give_the_same_plan() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    build(&vol.path("data"));
    // The pristine image: unmount the volume and copy its image.
    let work = tempfile::Builder::new().prefix("dedupscan-determinism-").tempdir_in("/var/tmp").unwrap();
    let pristine = work.path().join("pristine.img");
    let src_img = vol.mnt.parent().unwrap().join("volume.img");
    sh(Command::new("umount").arg(&vol.mnt));
    sh(Command::new("cp").arg("--sparse=always").arg(&src_img).arg(&pristine));
    // Left unmounted: a copy of a mounted btrfs would be given a temporary
    // fsid (Volume's drop then finds nothing to unmount).

    let mut results = Vec::new();
    let runs = [("1", false), ("2", false), ("8", false), ("1", false), ("8", false), ("2", true)];
    for (n, (threads, rename)) in runs.into_iter().enumerate() {
        results.push((threads, rename, run_on_copy(&pristine, work.path(), n, threads, rename)));
    }
    for (threads, rename, (plan, freed, ideal, _)) in &results {
        let dup: u64 = plan.iter().map(|k| k.2).sum();
        eprintln!(
            "--threads {threads} rename {rename}: {} ranges, {dup} planned, {freed} freed, ideal {ideal}",
            plan.len()
        );
    }
    let (_, _, (plan0, freed0, ideal, on_disk0)) = &results[0];
    assert!(!plan0.is_empty());
    // Every copy of the tree's files is in the plan: both trees and both
    // images hold them, and three of each four copies are destinations.
    let dup: u64 = plan0.iter().map(|k| k.2).sum();
    assert!(dup * 100 >= ideal * 99, "planned {dup} of ideal {ideal}");
    for (threads, rename, (plan, freed, _, on_disk)) in &results[1..] {
        assert!(
            plan == plan0,
            "--threads {threads} rename {rename}: the plan differs ({} vs {} ranges)",
            plan.len(),
            plan0.len()
        );
        // The data left is the same, extent for extent.
        assert_eq!(on_disk, on_disk0, "--threads {threads} rename {rename}: bytes on disk after the run");
        // statfs counts btrfs metadata too: runs whose data on disk is
        // identical differ by up to four 16 KiB metadata nodes (64 KiB,
        // 0.6 points of this small tree's ideal) with the plan in several
        // batches.
        let diff = (*freed as f64 - *freed0 as f64).abs();
        assert!(
            diff <= (*ideal as f64 * 0.002).max(128.0 * 1024.0),
            "--threads {threads} rename {rename}: freed {freed} vs {freed0} ({:.2} points of ideal)",
            diff / *ideal as f64 * 100.0
        );
    }
}

/// A lone pair of equal blocks between two large files links nothing and
/// is not planned (a 48-bit fingerprint collision looks like that: see
/// `plan::links`), in one piece as in batches; two such pairs, or one
/// with a small file, are planned. Synthetic maps, no volume.
#[test]
fn a_lone_pair_of_blocks_between_large_files_is_not_planned_in_any_batching() {
    use dedupscan::db::writer::{self, WriteOp};
    use dedupscan::hash::{FileHash, MapBytes};
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("db.sqlite"), "lone-pairs").unwrap();
    let mut rng = Rng::new(11);
    let mut files: Vec<Vec<u64>> =
        (0..7).map(|i| (0..[100, 100, 100, 100, 10, 100, 100][i]).map(|_| rng.next_u64() | 1).collect()).collect();
    files[1][50] = files[0][30]; // A-B: one lone pair
    let run = files[2][10..20].to_vec();
    files[3][40..50].copy_from_slice(&run); // C-D: ten blocks
    files[4][3] = files[0][70]; // E (small) inside A
    (files[6][80], files[6][7]) = (files[5][5], files[5][60]); // F-G: two lone pairs
    let (tx, rx) = std::sync::mpsc::sync_channel(files.len());
    for (i, fps) in files.iter().enumerate() {
        let map = dedupscan::blockmap::BlockMap::from_fps(fps);
        let hash = FileHash { map, ..FileHash::empty(fps.len() as u64 * 4096, 1) };
        let path = format!("/f{i}").into();
        tx.send(WriteOp::Hashed { id: None, dev: 1, ino: i as u64 + 10, path, mtime: 0, ctime: 0, hash }).unwrap();
    }
    drop(tx);
    let (db, _) = writer::run(db, 1, rx, &MapBytes::default()).unwrap();
    let all = db.all_ids().unwrap();
    let ino = |id: FileId| id.0 as u64 + 9; // row ids 1.. in order of writing
    let planned = |limits| {
        let mut ranges = Vec::new();
        plan::from_db_with(&db, &all, None, PlanOptions::default(), limits, |p: plan::Plan| {
            ranges.extend(
                p.ranges.iter().map(|r| (ino(r.src), r.src_off / 4096, r.len / 4096, ino(r.dest), r.dest_off / 4096)),
            );
            Ok::<(), rusqlite::Error>(())
        })
        .unwrap();
        ranges.sort_unstable();
        ranges
    };
    let one = planned(Limits::ONE_PIECE);
    assert_eq!(planned(Limits::TINY), one, "in batches");
    let pairs: Vec<(u64, u64)> = one.iter().map(|r| (r.0.min(r.3), r.0.max(r.3))).collect();
    assert!(!pairs.contains(&(10, 11)), "lone pair planned: {one:?}");
    for (pair, blocks) in [((12, 13), 10), ((10, 14), 1), ((15, 16), 2)] {
        let got: u64 = one.iter().filter(|r| (r.0.min(r.3), r.0.max(r.3)) == pair).map(|r| r.2).sum();
        assert_eq!(got, blocks, "{pair:?} in {one:?}");
    }
}
