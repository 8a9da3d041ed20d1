//! `--drop-cache` (the systemd unit's) drops from the page cache only what
//! the scan brought into it: pages of a file that were cached before the
//! run stay cached (a nightly run reads the changed files, often the hot
//! ones), pages it read from disk go. The build before dropped both.

mod common;

use std::io::Read;

use common::*;
use dedupscan::corpus::Rng;

fn kept_and_dropped(fs: Fs) {
    let Some(vol) = Volume::new(fs, 600) else { return };
    let d = vol.path("d");
    std::fs::create_dir_all(&d).unwrap();
    let (hot, cold, half) = (d.join("hot"), d.join("cold"), d.join("half"));
    // And files that fit in one read (256 KiB), read another way.
    let (small_hot, small_cold) = (d.join("small_hot"), d.join("small_cold"));
    for (i, p) in [&hot, &cold].into_iter().enumerate() {
        std::fs::write(p, Rng::new(70 + i as u64).bytes(8 << 20)).unwrap();
    }
    for (i, p) in [&small_hot, &small_cold].into_iter().enumerate() {
        std::fs::write(p, Rng::new(75 + i as u64).bytes(128 << 10)).unwrap();
    }
    // 160 MiB, more than two probe windows: its first 64 MiB cached.
    let mut f = std::fs::File::create(&half).unwrap();
    for i in 0..10 {
        std::io::Write::write_all(&mut f, &Rng::new(80 + i).bytes(16 << 20)).unwrap();
    }
    drop(f);
    for p in [&hot, &cold, &half, &small_hot, &small_cold] {
        drop_pages(p);
    }
    let mut buf = Vec::new();
    std::fs::File::open(&hot).unwrap().read_to_end(&mut buf).unwrap();
    std::fs::File::open(&small_hot).unwrap().read_to_end(&mut buf).unwrap();
    std::fs::File::open(&half).unwrap().take(64 << 20).read_to_end(&mut buf).unwrap();
    // Read-ahead may bring in a little past the 64 MiB read, and may still
    // be under way when the read returns.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (hot_before, half_before) = (resident(&hot), resident(&half));
    assert_eq!(hot_before, 2048);
    assert!((16384..=16384 + 2048).contains(&half_before), "{half_before} pages of half cached");
    let r = dedupscan().args(["scan", s(&d), "--drop-cache", "--json"]).db(vol.db()).expect(0).run().json;
    assert_eq!(num(&r, "files_hashed"), 5, "{r:#}");
    assert_eq!(resident(&hot), hot_before, "the pages cached before the run were dropped");
    assert_eq!(resident(&cold), 0, "the pages the run read were kept");
    assert_eq!(resident(&small_hot), 32, "a small file cached before the run was dropped");
    assert_eq!(resident(&small_cold), 0, "a small file the run read was kept");
    // Of the half-cached file, what was cached stays; of what the run
    // read, at most read-ahead that came after the count above.
    let half_after = resident(&half);
    assert!(
        (half_before..=half_before + 1024).contains(&half_after),
        "half: {half_before} pages cached, {half_after} after"
    );
}

#[test]
fn xfs_drop_cache_keeps_what_was_cached_before() {
    kept_and_dropped(Fs::Xfs);
}

#[test]
fn btrfs_drop_cache_keeps_what_was_cached_before() {
    kept_and_dropped(Fs::Btrfs);
}
