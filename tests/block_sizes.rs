//! XFS made with blocks other than 4 KiB. The kernel shares whole blocks of
//! the filesystem only: with 64 KiB blocks a range starting at a 4 KiB
//! offset is refused with `EINVAL`, which the first builds took for "this
//! filesystem cannot share" and stopped sharing altogether (nothing freed,
//! no error counted). With 1 KiB blocks (small-file servers) 4 KiB
//! fingerprints stay right.
//!
//! Each test proves nothing was lost (contents, sizes, modes, mtimes) and
//! proves its claims with FIEMAP and statfs.

mod common;

use common::*;

/// Random bytes from a seed (not all alike: the kernel compares them).
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    dedupscan::corpus::Rng::new(seed).bytes(len)
}

/// Kernel release as (major, minor).
fn kernel() -> (u32, u32) {
    let rel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = rel.split(['.', '-']).map(|p| p.parse().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

#[test]
fn xfs_with_64k_blocks_shares_whole_64k_blocks() {
    let vol = match Volume::try_new(Fs::Xfs64k, 512) {
        Ok(v) => v,
        // Blocks larger than a page need kernel 6.12 (XFS large block
        // sizes): an older kernel cannot mount such a filesystem at all, so
        // there is nothing to run on. Said on stderr, not skipped silently.
        Err(e) if kernel() < (6, 12) => {
            eprintln!("*** not applicable: kernel {:?} cannot mount XFS with 64 KiB blocks ({e}) ***", kernel());
            return;
        }
        Err(e) => {
            skip(&format!("cannot create XFS with 64 KiB blocks on kernel {:?}: {e}", kernel()));
            return;
        }
    };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let a = bytes(1, (4 << 20) + 1000);
    std::fs::write(d.join("a.bin"), &a).unwrap();
    std::fs::write(d.join("b.bin"), &a).unwrap();
    // The first 2 MiB of a behind a 64 KiB header: aligned to the
    // filesystem's blocks, so shareable.
    let mut c = bytes(2, 65536);
    c.extend_from_slice(&a[..2 << 20]);
    std::fs::write(d.join("c.bin"), &c).unwrap();
    // Behind a 4 KiB header: aligned to 4 KiB only, never shareable here.
    let mut e = bytes(3, 4096);
    e.extend_from_slice(&a[..2 << 20]);
    std::fs::write(d.join("e.bin"), &e).unwrap();
    let before = Snapshot::take(&d);
    let d_s = d.to_str().unwrap();
    sh(&mut std::process::Command::new("sync"));
    let free0 = free_bytes(&vol.mnt);

    let dry = run_json(&vol, &[d_s, "--dry-run"]);
    assert_eq!(free_bytes(&vol.mnt), free0, "a dry run changed the used space");
    let real = run_json(&vol, &[d_s]);
    before.assert_same(&Snapshot::take(&d));
    assert_eq!(real["block_size"].as_u64(), Some(65536), "{real:#}");
    assert!(real["sharing_refused"].is_null(), "{real:#}");
    assert_eq!(real["errors"].as_u64(), Some(0), "{real:#}");
    assert_eq!(real["dedupe_status"]["differs"].as_u64(), Some(0), "{real:#}");
    // b whole (to EOF) and c's 2 MiB: what the dry run predicted.
    let expect = a.len() as u64 + (2 << 20);
    assert_eq!(num(&real, "deduped_bytes"), expect, "{real:#}");
    assert_eq!(num(&dry, "duplicate_bytes"), expect, "{dry:#}");
    let len = a.len() as u64;
    assert!(same_physical(&d.join("a.bin"), 0, &d.join("b.bin"), 0, len & !65535));
    assert!(same_physical(&d.join("a.bin"), 0, &d.join("c.bin"), 65536, 2 << 20));
    assert_eq!(shared_bytes(&d.join("e.bin")), 0, "a range inside a 64 KiB block was shared");
    sh(&mut std::process::Command::new("sync"));
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    assert!(freed >= expect as i64 - 65536, "statfs says {freed} freed, expected about {expect}");

    let again = run_json(&vol, &[d_s, "--rehash"]);
    assert_eq!(num(&again, "duplicate_bytes"), 0, "{again:#}");
    before.assert_same(&Snapshot::take(&d));
}

#[test]
fn xfs_with_1k_blocks_shares_4k_fingerprinted_ranges_and_small_files() {
    let Some(vol) = Volume::new(Fs::Xfs1k, 320) else { return };
    let d = vol.path("d");
    std::fs::create_dir_all(d.join("small")).unwrap();
    let a = bytes(4, (3 << 20) + 777);
    std::fs::write(d.join("a.bin"), &a).unwrap();
    std::fs::write(d.join("b.bin"), &a).unwrap();
    // A 4 KiB-aligned shift of a: shareable block by block.
    let mut c = bytes(5, 8192);
    c.extend_from_slice(&a[..1 << 20]);
    std::fs::write(d.join("c.bin"), &c).unwrap();
    // Files smaller than a 4 KiB fingerprint block, in pairs: whole files.
    for i in 0..20u64 {
        let s = bytes(100 + i, 300 + 150 * i as usize);
        std::fs::write(d.join(format!("small/{i}.a")), &s).unwrap();
        std::fs::write(d.join(format!("small/{i}.b")), &s).unwrap();
    }
    let before = Snapshot::take(&d);
    let d_s = d.to_str().unwrap();
    sh(&mut std::process::Command::new("sync"));
    let free0 = free_bytes(&vol.mnt);

    let real = run_json(&vol, &[d_s]);
    before.assert_same(&Snapshot::take(&d));
    assert_eq!(real["block_size"].as_u64(), Some(4096), "{real:#}");
    assert!(real["sharing_refused"].is_null(), "{real:#}");
    assert_eq!(real["errors"].as_u64(), Some(0), "{real:#}");
    let small: u64 = (0..20u64).map(|i| 300 + 150 * i).sum();
    let expect = a.len() as u64 + (1 << 20) + small;
    assert_eq!(num(&real, "deduped_bytes"), expect, "{real:#}");
    let len = a.len() as u64;
    assert!(same_physical(&d.join("a.bin"), 0, &d.join("b.bin"), 0, len & !4095));
    assert!(same_physical(&d.join("a.bin"), 0, &d.join("c.bin"), 8192, 1 << 20));
    assert!(shared_bytes(&d.join("small/19.b")) > 0, "a small file was not shared");
    sh(&mut std::process::Command::new("sync"));
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    // Every 1 KiB block of b, the shifted MiB, and each small copy's blocks.
    let blocks: u64 = (0..20u64).map(|i| (300 + 150 * i).div_ceil(1024) * 1024).sum();
    let want = len.div_ceil(1024) * 1024 + (1 << 20) + blocks;
    assert!(freed >= want as i64 - 4096, "statfs says {freed} freed, expected about {want}");

    let again = run_json(&vol, &[d_s, "--rehash"]);
    assert_eq!(num(&again, "duplicate_bytes"), 0, "{again:#}");
    before.assert_same(&Snapshot::take(&d));
}
