//! Issue 12, point 2: memory follows a file's data, never its apparent size.
//!
//! Any user can `truncate -s 8T` a file in a tree the nightly root run scans.
//! Before block maps were sparse, that one file made the run allocate a
//! fingerprint per 4 KiB of apparent size (16 GiB for the hasher alone):
//! killed by the OOM killer, or, under an address-space limit, aborted with
//! "memory allocation of 17179869184 bytes failed" (exit 134).
//!
//! Each run here is the real binary under `prlimit --as` (so a regression
//! fails the test instead of eating the machine) with its peak RSS read from
//! `wait4` ([`bounded`]). Set `DEDUPSCAN_TEST_BIN` to run another build (e.g. the old one,
//! to see these tests fail).

mod common;

use common::bounded::*;
use common::*;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const TIB: u64 = 1 << 40;
const GIB: u64 = 1 << 30;

/// Peak RSS a run may reach (issue 12: "under 256 MB").
const MAX_RSS: u64 = 256_000_000;

/// A file of apparent size `size` holding `data` at each offset, holes
/// elsewhere.
fn sparse_file(path: &Path, size: u64, parts: &[(u64, &[u8])]) {
    let f = File::create(path).unwrap();
    f.set_len(size).unwrap();
    for (off, data) in parts {
        f.write_all_at(data, *off).unwrap();
    }
    f.sync_all().unwrap();
}

fn check(b: &Bounded, what: &str) {
    check_bounds(b, what);
    validate_report(&b.json);
}

fn check_bounds(b: &Bounded, what: &str) {
    eprintln!("{what}: exit {}, peak RSS {:.1} MB", b.code, b.max_rss as f64 / 1e6);
    assert_eq!(b.code, 0, "{what}: exit {} (peak RSS {} MB): {}", b.code, b.max_rss >> 20, b.stderr);
    assert!(b.max_rss < MAX_RSS, "{what}: peak RSS {} MB >= 256 MB", b.max_rss / 1_000_000);
}

/// Two 8 TiB files, 4 KiB of the same data at 7 TiB: the scan and the full
/// run finish (exit 0) in bounded memory, and the database holds each map
/// in a few bytes.
fn eight_tib_twins(fs: Fs) {
    let Some(vol) = Volume::new(fs, 300) else { return };
    let d = vol.path("users");
    std::fs::create_dir(&d).unwrap();
    let data = dedupscan::corpus::Rng::new(12).bytes(4096);
    for name in ["huge", "twin"] {
        sparse_file(&d.join(name), 8 * TIB, &[(7 * TIB, &data)]);
    }
    let before = Snapshot::take_sparse(&d);

    let scan = bounded(&vol, &["scan", d.to_str().unwrap()]);
    check(&scan, "scan");
    assert_eq!(num(&scan.json, "files_hashed"), 2, "{:#}", scan.json);
    assert_eq!(num(&scan.json, "bytes_hashed"), 2 * 4096, "holes are never read: {:#}", scan.json);
    let conn = rusqlite::Connection::open(vol.db()).unwrap();
    let longest: i64 = conn.query_row("SELECT max(length(blocks)) FROM files", [], |r| r.get(0)).unwrap();
    assert!(longest <= 32, "an 8 TiB map of one data block takes {longest} bytes");
    drop(conn);

    // The full run: plan and share phases must not expand the holes either.
    let run = bounded(&vol, &[d.to_str().unwrap()]);
    check(&run, "run");
    assert_eq!(num(&run.json, "files_scanned"), 2, "{:#}", run.json);
    before.assert_same(&Snapshot::take_sparse(&d));
    // The planner reads the maps sparsely: the one data block at 7 TiB is
    // planned and shared like any other.
    assert_eq!(num(&run.json, "duplicate_bytes"), 4096, "{:#}", run.json);
    assert!(same_physical(&d.join("huge"), 7 * TIB, &d.join("twin"), 7 * TIB, 4096), "{:#}", run.json);

    // `report` rebuilds the plan from the database: bounded too.
    let report = bounded(&vol, &["report"]);
    check_bounds(&report, "report");
    validate_db_report(&report.json);
}

#[test]
fn btrfs_eight_tib_sparse_twins_in_bounded_memory() {
    eight_tib_twins(Fs::Btrfs);
}

#[test]
fn xfs_eight_tib_sparse_twins_in_bounded_memory() {
    eight_tib_twins(Fs::Xfs);
}

/// Sparse twins the planner can hold (16 GiB apparent, data scattered far
/// apart): the data blocks are found at their offsets and shared, holes stay
/// holes, in bounded memory.
fn sparse_twins_share_their_data(fs: Fs) {
    let Some(vol) = Volume::new(fs, 300) else { return };
    let d = vol.path("vm");
    std::fs::create_dir(&d).unwrap();
    let mut rng = dedupscan::corpus::Rng::new(7);
    let (a, b) = (rng.bytes(64 << 10), rng.bytes(3 * 4096 + 100));
    let size = 16 * GIB + 3 * 4096 + 100;
    let parts: [(u64, &[u8]); 2] = [(5 * GIB, &a), (16 * GIB, &b)];
    for name in ["one", "two"] {
        sparse_file(&d.join(name), size, &parts);
    }
    let before = Snapshot::take_sparse(&d);
    let run = bounded(&vol, &[d.to_str().unwrap()]);
    check(&run, "run");
    before.assert_same(&Snapshot::take_sparse(&d));
    let (one, two) = (d.join("one"), d.join("two"));
    assert!(same_physical(&one, 5 * GIB, &two, 5 * GIB, 64 << 10), "{:#}", run.json);
    assert!(same_physical(&one, 16 * GIB, &two, 16 * GIB, 3 * 4096), "{:#}", run.json);
    // Holes stay holes (the sharing did not allocate them).
    for p in [&one, &two] {
        let f = File::open(p).unwrap();
        assert_eq!(seek_data(&f, 0).unwrap(), 5 * GIB, "{} gained data before its first extent", p.display());
    }
}

fn seek_data(f: &File, from: u64) -> std::io::Result<u64> {
    nix::unistd::lseek(f, from as i64, nix::unistd::Whence::SeekData).map(|o| o as u64).map_err(Into::into)
}

#[test]
fn btrfs_sparse_twins_share_their_data_blocks() {
    sparse_twins_share_their_data(Fs::Btrfs);
}

#[test]
fn xfs_sparse_twins_share_their_data_blocks() {
    sparse_twins_share_their_data(Fs::Xfs);
}

/// What must not change about a sparse file, without reading terabytes of
/// holes: size, mode, mtime and the SHA-256 of its data regions with their
/// offsets.
trait TakeSparse {
    fn take_sparse(root: &Path) -> SparseSnapshot;
}

impl TakeSparse for Snapshot {
    fn take_sparse(root: &Path) -> SparseSnapshot {
        use sha2::{Digest, Sha256};
        use std::os::unix::fs::MetadataExt;
        let mut out = Vec::new();
        let mut names: Vec<_> = std::fs::read_dir(root).unwrap().map(|e| e.unwrap().path()).collect();
        names.sort();
        for p in names {
            let f = File::open(&p).unwrap();
            let m = f.metadata().unwrap();
            let mut h = Sha256::new();
            let mut pos = 0;
            while let Ok(start) = seek_data(&f, pos) {
                let end = nix::unistd::lseek(&f, start as i64, nix::unistd::Whence::SeekHole).unwrap() as u64;
                let mut buf = vec![0u8; (end - start) as usize];
                f.read_exact_at(&mut buf, start).unwrap();
                // Written zeros and holes are the same content.
                if buf.iter().any(|&x| x != 0) {
                    h.update(start.to_le_bytes());
                    h.update(&buf);
                }
                pos = end;
                if pos >= m.len() {
                    break;
                }
            }
            out.push((p, m.len(), m.mode(), m.mtime(), m.mtime_nsec(), h.finalize().to_vec()));
        }
        SparseSnapshot(out)
    }
}

type SparseState = (PathBuf, u64, u32, i64, i64, Vec<u8>);

#[derive(Debug, PartialEq, Eq)]
struct SparseSnapshot(Vec<SparseState>);

impl SparseSnapshot {
    fn assert_same(&self, after: &SparseSnapshot) {
        assert_eq!(self, after, "a sparse file changed");
    }
}
