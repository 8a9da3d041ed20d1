//! A file of one repeated block (a flash image of 0xFF, a file preallocated
//! with a pattern): shared a window at a time, never one 4 KiB request and
//! one extent per block.
//!
//! Before (`91a4f90`), a 4 GiB file of one repeated block made 1,048,575
//! requests and as many extents (share phase 17 s on btrfs, 32 s on XFS);
//! on `compress-force=zstd` btrfs, where such a file is stored in tiny
//! compressed extents, the run *used* 141 MiB more than before it: the new
//! extent items outweighed the data freed. Here, with 256 MiB files, the
//! old build makes 65,535 ranges and, compressed, frees less than nothing.
//! Set `DEDUPSCAN_TEST_BIN` to run another build.

mod common;

use common::*;
use std::path::Path;

const FILE: u64 = 256 << 20;
const BLOCKS: u64 = FILE / 4096;

/// Writes `FILE` bytes of `pattern` repeated; returns the volume's bytes
/// in use it cost (statfs, after a sync).
fn write_repeated(vol: &Volume, path: &Path, pattern: &[u8]) -> u64 {
    let free = free_bytes(&vol.path(""));
    // The pattern repeated past 1 MiB, written 1 MiB at a time from where
    // the previous MiB left off (1 MiB need not be a whole number of them).
    let buf = pattern.repeat((1 << 20) / pattern.len() + 2);
    let mut f = std::fs::File::create(path).unwrap();
    for i in 0..(FILE >> 20) as usize {
        let off = (i << 20) % pattern.len();
        std::io::Write::write_all(&mut f, &buf[off..off + (1 << 20)]).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    sh(&mut std::process::Command::new("sync"));
    free.saturating_sub(free_bytes(&vol.path("")))
}

/// One file of `pattern` repeated, run once: few ranges, few extents,
/// contents and metadata unchanged, most of the space it took freed.
fn one_file(fs: Fs, mount: Option<&str>, pattern: &[u8]) {
    let Some(vol) = Volume::new(fs, 1024) else { return };
    if let Some(opts) = mount {
        vol.remount_with(opts);
    }
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let file = d.join("flash.img");
    let cost = write_repeated(&vol, &file, pattern);
    let before = Snapshot::take(&d);

    let run = run_json(&vol, &[s(&d)]);
    before.assert_same(&Snapshot::take(&d));
    let ranges = num(&run, "ranges_planned");
    let freed = run["freed_bytes"].as_i64().expect("freed_bytes");
    let ext = extents(&file);
    eprintln!("{fs:?} {mount:?}: on disk {cost}, {ranges} ranges, {ext} extents, freed {freed}");
    // A window of at least 16 blocks: at most one range per 16 blocks.
    assert!(ranges > 0 && ranges <= BLOCKS / 16, "{ranges} ranges for {BLOCKS} blocks: {run:#}");
    assert!(ext as u64 <= BLOCKS / 16 + 64, "{ext} extents for {BLOCKS} blocks");
    // Freed: all but the window (at most 1 MiB here) of what the file took,
    // within btrfs's metadata noise; compressed, at least 80% of it.
    let want = if mount.is_some() { cost / 5 * 4 } else { cost - (2 << 20) };
    assert!(freed > 0 && freed as u64 >= want, "freed {freed} of {cost} bytes on disk: {run:#}");
    assert_eq!(num(&run, "deduped_bytes"), num(&run, "duplicate_bytes"), "{run:#}");
    // A rerun finds it all shared.
    let again = run_json(&vol, &["--rehash", s(&d)]);
    assert_eq!(num(&again, "duplicate_bytes"), 0, "{again:#}");
    before.assert_same(&Snapshot::take(&d));
}

#[test]
fn a_repeated_block_on_btrfs_is_shared_a_window_at_a_time() {
    one_file(Fs::Btrfs, None, &[0xa5; 4096]);
}

#[test]
fn a_repeated_block_on_xfs_is_shared_a_window_at_a_time() {
    one_file(Fs::Xfs, None, &[0xa5; 4096]);
}

/// The case that lost space: each 128 KiB compressed extent takes one
/// 4 KiB sector, so 32 one-block ranges freed 4 KiB and cost 32 extent items.
#[test]
fn a_repeated_block_on_compressed_btrfs_frees_space_instead_of_costing_it() {
    one_file(Fs::Btrfs, Some("compress-force=zstd"), &[0xa5; 4096]);
}

/// A pattern of three blocks: ranges of a multiple of three blocks.
#[test]
fn a_repeated_three_block_pattern_is_shared_a_window_at_a_time() {
    let mut pattern = vec![0x11u8; 4096];
    pattern.extend([0x22u8; 4096]);
    pattern.extend(dedupscan::corpus::Rng::new(3).bytes(4096));
    one_file(Fs::Xfs, None, &pattern);
}
