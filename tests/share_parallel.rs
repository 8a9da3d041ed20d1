//! The share phase on several workers does exactly what it does on one: the
//! same plan over the same files gives the same outcome, every figure and
//! every status, on real btrfs and XFS volumes. The plan is built by hand to
//! make the workers meet: many sources share into the same destinations,
//! one large source is cut into two units that share into one file at once,
//! one file has more copies than one request takes,
//! and a changed and a vanished file are each named by ranges of several
//! sources (they must be counted once, not once per worker). The workers
//! read each request's pages first, as when the data comes from disk.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use common::*;
use dedupscan::corpus::Rng;
use dedupscan::dedupe::headroom::KeepFree;
use dedupscan::dedupe::{execute, Bookends, Mode, Outcome, Sharing};
use dedupscan::file::{FileFacts, FileId, IdSet};
use dedupscan::plan::{Plan, Range};
use dedupscan::progress::Silent;
use dedupscan::sys::beneath::Tree;

const BLK: u64 = 4096;
/// Source files of the mosaics.
const SOURCES: usize = 24;
/// Blocks per source file.
const SRC_BLOCKS: u64 = 64;
/// Each mosaic is three pieces of this many blocks, from three sources.
const PIECE: u64 = 8;
const MOSAICS: usize = 12;
/// A small file with an unaligned tail, and how many copies of it (more
/// than `MAX_DESTS`, 127, the destinations of one request).
const SMALL: u64 = 3 * BLK + 100;
const SMALL_COPIES: u64 = 130;
/// The large source: more than one unit of work (64 MiB).
const BIG: u64 = 72 << 20;
const BIG_RANGE: u64 = 8 << 20;

/// A tree under `dir` and the plan a scan would make of it, plus the facts
/// of every file "as scanned". Deterministic: the same for every `dir`.
struct Case {
    plan: Plan,
    files: HashMap<FileId, FileFacts>,
    /// Paths of the files the test alters after the "scan".
    changed: PathBuf,
    vanished: PathBuf,
}

fn build(dir: &Path) -> Case {
    std::fs::create_dir_all(dir).unwrap();
    let mut rng = Rng::new(4242);
    let mut paths: Vec<PathBuf> = Vec::new();
    let mut add = |name: String, data: &[u8]| -> FileId {
        let p = dir.join(name);
        std::fs::write(&p, data).unwrap();
        paths.push(p);
        FileId(paths.len() as i64)
    };
    let mut ranges: Vec<Range> = Vec::new();
    let src_data: Vec<Vec<u8>> = (0..SOURCES).map(|_| rng.bytes((SRC_BLOCKS * BLK) as usize)).collect();
    let srcs: Vec<FileId> = src_data.iter().enumerate().map(|(i, d)| add(format!("s{i:02}"), d)).collect();

    // Mosaics: piece k of mosaic m is blocks [8k', 8k'+8) of a source chosen
    // so that every mosaic takes from three sources and every source feeds
    // several mosaics.
    for m in 0..MOSAICS {
        let mut data = Vec::new();
        let mut pieces = Vec::new();
        for k in 0..3u64 {
            let s = (m * 5 + k as usize * 7) % SOURCES;
            let at = ((m as u64 + k) % (SRC_BLOCKS / PIECE)) * PIECE;
            data.extend_from_slice(&src_data[s][(at * BLK) as usize..((at + PIECE) * BLK) as usize]);
            pieces.push((s, at, k * PIECE));
        }
        let id = add(format!("m{m:02}"), &data);
        for (s, at, dest_at) in pieces {
            ranges.push(Range { src: srcs[s], src_off: at * BLK, len: PIECE * BLK, dest: id, dest_off: dest_at * BLK });
        }
    }
    // Whole copies: three of each of the first four sources (one request
    // with three destinations), one of them with an unaligned tail.
    for (s, data) in src_data.iter().enumerate().take(4) {
        let len = if s == 3 { data.len() - 1000 } else { data.len() };
        let tail_src = if s == 3 { Some(add("s03-short".into(), &data[..len])) } else { None };
        let src = tail_src.unwrap_or(srcs[s]);
        for c in 0..3 {
            let id = add(format!("c{s}-{c}"), &data[..len]);
            ranges.push(Range { src, src_off: 0, len: len as u64, dest: id, dest_off: 0 });
        }
    }
    // More copies of one file than one request takes: two requests.
    let small = rng.bytes(SMALL as usize);
    let src = add("small".into(), &small);
    for c in 0..SMALL_COPIES {
        let id = add(format!("small-{c:03}"), &small);
        ranges.push(Range { src, src_off: 0, len: SMALL, dest: id, dest_off: 0 });
    }
    // A copy of a source whose last block differs (a fingerprint collision,
    // as far as the executor knows): the kernel says DIFFERS.
    let mut x = src_data[5].clone();
    let n = x.len();
    x[n - 10] ^= 0xff;
    let id = add("differs".into(), &x);
    ranges.push(Range { src: srcs[5], src_off: 0, len: n as u64, dest: id, dest_off: 0 });
    // The large pair, in ranges of 8 MiB: two units, both into `big-copy`.
    let big = rng.bytes(BIG as usize);
    let b = add("big".into(), &big);
    let b2 = add("big-copy".into(), &big);
    for k in 0..BIG / BIG_RANGE {
        ranges.push(Range { src: b, src_off: k * BIG_RANGE, len: BIG_RANGE, dest: b2, dest_off: k * BIG_RANGE });
    }
    ranges.sort_unstable_by_key(|r| (r.src, r.src_off, r.len, r.dest, r.dest_off));
    let files = paths
        .iter()
        .enumerate()
        .map(|(i, p)| {
            // Files are known by volume key (btrfs subvolume id), not st_dev.
            let key = dedupscan::sys::volume_key(std::os::fd::AsFd::as_fd(&std::fs::File::open(p).unwrap())).unwrap();
            (FileId(i as i64 + 1), FileFacts::from_metadata(p.clone(), key, &std::fs::metadata(p).unwrap()))
        })
        .collect();
    Case { plan: Plan { ranges }, files, changed: dir.join("m07"), vanished: dir.join("m06") }
}

/// Alter the tree after the "scan": one destination rewritten, one removed.
fn alter(case: &Case) {
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut data = std::fs::read(&case.changed).unwrap();
    data[0] ^= 1;
    std::fs::write(&case.changed, &data).unwrap();
    std::fs::remove_file(&case.vanished).unwrap();
}

/// Four workers, each reading a request's pages before submitting it, as
/// when the data comes from disk: neither may change what is shared.
const MANY: Sharing = Sharing { workers: 4, from_disk: true, ..Sharing::cached(4) };

fn run(case: &Case, mode: Mode, bookends: Option<&Bookends>, sharing: Sharing) -> Outcome {
    let stop = AtomicBool::new(false);
    let tree = Tree::open(&[case.changed.parent().unwrap().to_owned()]).unwrap();
    execute(&case.plan, &case.files, &IdSet::new(), &tree, BLK, mode, bookends, &Silent, &stop, sharing)
}

/// Every figure of an outcome, for comparing two of them.
fn figures(o: &Outcome) -> String {
    format!("{o:?}")
}

fn one_and_many_workers_agree(fs: Fs) {
    let Some(vol) = Volume::new(fs, 768) else { return };
    let one = build(&vol.path("one"));
    let many = build(&vol.path("many"));
    alter(&one);
    alter(&many);
    let before = Snapshot::take(&vol.mnt);
    let bookends =
        (fs == Fs::Btrfs).then(|| Bookends::for_volume(1.0, (KeepFree::DEFAULT, false), Mode::Share, &vol.mnt));

    // Dry run: compared in user space, nothing changes.
    let dry1 = run(&one, Mode::DryRun, bookends.as_ref(), Sharing::cached(1));
    let dry4 = run(&many, Mode::DryRun, bookends.as_ref(), MANY);
    assert_eq!(figures(&dry1), figures(&dry4), "{fs:?} dry run");
    assert_eq!(dry1.deduped_bytes, 0);
    before.assert_same(&Snapshot::take(&vol.mnt));

    let out1 = run(&one, Mode::Share, bookends.as_ref(), Sharing::cached(1));
    let out4 = run(&many, Mode::Share, bookends.as_ref(), MANY);
    assert_eq!(figures(&out1), figures(&out4), "{fs:?}: 1 worker vs 4");
    before.assert_same(&Snapshot::take(&vol.mnt));

    // What the outcome must say, whatever the number of workers.
    let o = &out4;
    assert_eq!(o.changed_files, 1, "{o:?}");
    assert_eq!(o.skipped.get(&dedupscan::policy::SkipReason::Vanished), Some(&1), "{o:?}");
    assert!(o.errors.is_empty(), "a file gone since the scan is no error: {o:?}");
    assert_eq!(o.status.differs, 1, "{o:?}");
    assert!(o.status.errors.is_empty() && o.refused.is_none(), "{o:?}");
    assert_eq!(dry1.duplicate_bytes, o.deduped_bytes, "dry run previews what is shared: {dry1:?} {o:?}");
    let expected = (MOSAICS as u64 - 2) * 3 * PIECE * BLK
        + 3 * 3 * SRC_BLOCKS * BLK
        + 3 * (SRC_BLOCKS * BLK - 1000)
        + SMALL_COPIES * SMALL
        + BIG;
    assert_eq!(o.deduped_bytes, expected, "{o:?}");
    for case in [&one, &many] {
        for r in &case.plan.ranges {
            let (s, d) = (&case.files[&r.src].path, &case.files[&r.dest].path);
            if *d == case.changed || *d == case.vanished || d.ends_with("differs") {
                continue;
            }
            assert!(same_physical(s, r.src_off, d, r.dest_off, r.len), "{fs:?}: {r:?} not shared");
        }
    }

    // Nothing left to submit: the second run only finds shared extents.
    let again = run(&many, Mode::Share, bookends.as_ref(), MANY);
    assert_eq!(again.duplicate_bytes, SRC_BLOCKS * BLK, "only the differing copy is retried: {again:?}");
    assert_eq!(again.already_shared_bytes, expected, "{again:?}");
    before.assert_same(&Snapshot::take(&vol.mnt));
}

#[test]
fn xfs_one_and_many_workers_agree() {
    one_and_many_workers_agree(Fs::Xfs);
}

#[test]
fn btrfs_one_and_many_workers_agree() {
    one_and_many_workers_agree(Fs::Btrfs);
}

/// A filesystem that cannot share stops every worker at its first request.
#[test]
fn refusal_stops_every_worker() {
    let Some(vol) = Volume::new(Fs::XfsNoReflink, 768) else { return };
    let case = build(&vol.path("t"));
    let before = Snapshot::take(&vol.mnt);
    let out = run(&case, Mode::Share, None, MANY);
    assert!(out.refused.is_some(), "{out:?}");
    assert_eq!((out.duplicate_bytes, out.deduped_bytes, out.status.same), (0, 0, 0), "{out:?}");
    before.assert_same(&Snapshot::take(&vol.mnt));
}
