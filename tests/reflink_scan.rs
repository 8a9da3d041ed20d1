//! Issue 14, first point: each physical extent is read once per run.
//!
//! Reflinked copies (`cp --reflink=always`), writable snapshots and files a
//! previous run deduplicated share their extents; FIEMAP says so. Before,
//! `scan` read and hashed every copy (a 1 GiB file with 10 reflinks: 11.8 GB
//! read, 22.6 s against 3.4 s for the one file). Now a shared extent is
//! hashed once and its fingerprints reused: `bytes_hashed` counts what was
//! read, `bytes_reused` what was not.

mod common;

use common::*;
use std::process::Command;

const MIB: u64 = 1 << 20;

/// Run the binary (`DEDUPSCAN_TEST_BIN`, to try another build, or this
/// one) with `args --json --db <vol db>`; the report is checked against its
/// schema only after the caller's assertions ([`checked`]), so an old build
/// fails on what it reads, not on a missing key.
fn run(vol: &Volume, args: &[&str]) -> serde_json::Value {
    dedupscan().args(args).json().arg("--progress=never").db(vol.db()).expect(0).run().json
}

fn checked(r: &serde_json::Value) {
    validate_report(r);
}

/// `bytes_reused`, 0 where an old build does not report it.
fn reused(r: &serde_json::Value) -> u64 {
    r["bytes_reused"].as_u64().unwrap_or(0)
}

/// One 32 MiB file and five reflinked copies: one copy is read, the rest
/// comes from the cache, and the maps are the same as if every copy had
/// been read (all six are one whole-file group).
fn reflinks_are_read_once(fs: Fs) {
    let Some(vol) = Volume::new(fs, 400) else { return };
    let d = vol.path("clones");
    std::fs::create_dir(&d).unwrap();
    let size = 32 * MIB + 1000; // a partial last block is always read
    std::fs::write(d.join("orig"), dedupscan::corpus::Rng::new(14).bytes(size as usize)).unwrap();
    for i in 1..=5 {
        let ok = Command::new("cp")
            .arg("--reflink=always")
            .arg(d.join("orig"))
            .arg(d.join(format!("copy{i}")))
            .status()
            .unwrap();
        assert!(ok.success(), "cp --reflink=always");
    }
    // Cold: what is measured is what the disk is asked for.
    vol.remount();
    let r = run(&vol, &["scan", s(&d)]);
    assert_eq!(num(&r, "files_hashed"), 6, "{r:#}");
    let read = num(&r, "bytes_hashed");
    // One copy, plus each copy's partial last block (and a few chunks that
    // two threads may have read before either had filled the cache).
    assert!(read <= size + 5 * 4096 + 4 * MIB, "read {read} bytes for one {size}-byte file and its reflinks: {r:#}");
    assert_eq!(read + reused(&r), 6 * size, "every byte is read or reused: {r:#}");
    checked(&r);

    // The maps equal those of reading every copy: the full run finds one
    // group of six and has nothing to share (all already shared).
    let full = run(&vol, &[s(&d)]);
    assert_eq!(num(&full, "deduped_bytes"), 0, "{full:#}");
    assert_eq!(num(&full, "already_shared_bytes"), 5 * size, "{full:#}");
    checked(&full);
}

#[test]
fn btrfs_reflinked_copies_are_read_once() {
    reflinks_are_read_once(Fs::Btrfs);
}

#[test]
fn xfs_reflinked_copies_are_read_once() {
    reflinks_are_read_once(Fs::Xfs);
}

/// Four independent copies (nothing shared), deduplicated by a full run:
/// the next full scan reads one copy's worth and reuses the rest.
fn rerun_after_dedupe_reads_less(fs: Fs) {
    let Some(vol) = Volume::new(fs, 400) else { return };
    let d = vol.path("dups");
    std::fs::create_dir(&d).unwrap();
    let data = dedupscan::corpus::Rng::new(41).bytes(8 * MIB as usize);
    for i in 0..4 {
        std::fs::write(d.join(format!("c{i}")), &data).unwrap();
    }
    // Unique data too: read every time.
    std::fs::write(d.join("unique"), dedupscan::corpus::Rng::new(42).bytes(4 * MIB as usize)).unwrap();
    let before = Snapshot::take(&d);
    let first = run(&vol, &[s(&d)]);
    assert_eq!(num(&first, "bytes_hashed"), 36 * MIB, "{first:#}");
    assert_eq!(num(&first, "deduped_bytes"), 24 * MIB, "{first:#}");
    before.assert_same(&Snapshot::take(&d));
    vol.remount();
    // --rehash: a plain rerun carries on and reads nothing unchanged.
    let second = run(&vol, &["scan", "--rehash", s(&d)]);
    let read = num(&second, "bytes_hashed");
    assert!(read <= 12 * MIB + MIB, "rerun read {read} bytes of 36 MiB: {second:#}");
    assert_eq!(read + reused(&second), 36 * MIB, "{second:#}");
    checked(&first);
    checked(&second);
}

#[test]
fn btrfs_rerun_after_dedupe_reads_one_copy() {
    rerun_after_dedupe_reads_less(Fs::Btrfs);
}

#[test]
fn xfs_rerun_after_dedupe_reads_one_copy() {
    rerun_after_dedupe_reads_less(Fs::Xfs);
}

/// What the scan learned by mapping a file, the share phase uses: a
/// destination the scan found sharing no extent is not mapped again (on
/// FULL/btrfs those FIEMAP calls were a quarter of the share threads' CPU),
/// while a destination already shared before the run still is, so that its
/// blocks already shared with the source are not submitted again.
fn unshared_destinations_are_not_mapped_again(fs: Fs) {
    const PAIRS: u64 = 30;
    const SIZE: u64 = 64 * 1024 + 100;
    let Some(vol) = Volume::new(fs, 300) else { return };
    let d = vol.path("t");
    std::fs::create_dir(&d).unwrap();
    for i in 0..PAIRS {
        let data = dedupscan::corpus::Rng::new(100 + i).bytes(SIZE as usize);
        std::fs::write(d.join(format!("a{i:02}")), &data).unwrap();
        std::fs::write(d.join(format!("b{i:02}")), &data).unwrap();
    }
    // c0 and its reflink c1 share their extent before the run; c2 is a
    // third copy of their content, written on its own.
    let c = dedupscan::corpus::Rng::new(99).bytes(SIZE as usize);
    std::fs::write(d.join("c0"), &c).unwrap();
    let ok = Command::new("cp").arg("--reflink=always").arg(d.join("c0")).arg(d.join("c1")).status().unwrap();
    assert!(ok.success(), "cp --reflink=always");
    std::fs::write(d.join("c2"), &c).unwrap();
    let before = Snapshot::take(&d);
    vol.remount();
    let free_before = free_bytes(&vol.mnt);
    let trace = vol.db().with_extension("fiemap.trace");
    let strace = ["strace", "-f", "-qq", "-e", "trace=ioctl", "-o", s(&trace)];
    let r = dedupscan().under(strace).arg(&d).json().arg("--progress=never").db(vol.db()).expect(0).run().json;
    let fiemaps = std::fs::read_to_string(&trace).unwrap().lines().filter(|l| l.contains("FS_IOC_FIEMAP")).count();
    before.assert_same(&Snapshot::take(&d));
    let files = 2 * PAIRS as usize + 3;
    // The scan maps every file (one call each: all are under 256 MiB);
    // the share phase maps only the c group's destination that was shared
    // already and, for it, the source. Mapping every destination again
    // would make it files + PAIRS + 2.
    assert!(fiemaps >= files, "{fiemaps} FIEMAP calls for {files} files: is strace working?");
    assert!(fiemaps <= files + 4, "{fiemaps} FIEMAP calls for {files} files: destinations were mapped again");
    // Every pair and c2 shared; the c group's reflinked pair not again.
    assert_eq!(num(&r["dedupe_status"], "same"), PAIRS + 1, "{r:#}");
    assert_eq!(num(&r, "deduped_bytes"), (PAIRS + 1) * SIZE, "{r:#}");
    assert_eq!(num(&r, "already_shared_bytes"), SIZE, "{r:#}");
    for i in 0..PAIRS {
        let (a, b) = (d.join(format!("a{i:02}")), d.join(format!("b{i:02}")));
        assert!(same_physical(&a, 0, &b, 0, SIZE / 4096 * 4096), "a{i:02} and b{i:02} are not shared");
    }
    for k in [1, 2] {
        assert!(same_physical(&d.join("c0"), 0, &d.join(format!("c{k}")), 0, SIZE / 4096 * 4096), "c{k}");
    }
    // Measured: the destinations' blocks are freed.
    let freed = free_bytes(&vol.mnt).saturating_sub(free_before);
    assert!(freed >= PAIRS * 64 * 1024, "freed {freed} bytes, shared {}", (PAIRS + 1) * SIZE);
    checked(&r);
}

#[test]
fn btrfs_unshared_destinations_are_not_mapped_again() {
    unshared_destinations_are_not_mapped_again(Fs::Btrfs);
}

#[test]
fn xfs_unshared_destinations_are_not_mapped_again() {
    unshared_destinations_are_not_mapped_again(Fs::Xfs);
}
