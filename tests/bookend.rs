//! The bookend case: a file that shares all but a few blocks of another
//! must free its extent, on btrfs (by rewriting the few blocks into a fresh
//! extent) as on XFS (which frees per block).

mod common;

use common::*;
use dedupscan::corpus::Rng;

fn almost_identical_pair(fs: Fs) {
    let Some(vol) = Volume::new(fs, 512) else { return };
    let d = vol.path("pair");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(21);
    let len = 16 << 20;
    let a = rng.bytes(len);
    let mut b = a.clone();
    for blk in [5usize, 1000, 3000] {
        b[blk * 4096..blk * 4096 + 4096].copy_from_slice(&rng.bytes(4096));
    }
    std::fs::write(d.join("a"), &a).unwrap();
    std::fs::write(d.join("b"), &b).unwrap();
    let before = Snapshot::take(&d);
    let free0 = free_bytes(&vol.mnt);
    let r = run_json(&vol, &[d.to_str().unwrap()]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    before.assert_same(&Snapshot::take(&d));
    let shared = (len - 3 * 4096) as i64;
    assert!(freed >= shared * 98 / 100, "{fs:?}: freed {freed} of {shared}: {r:#}");
    if fs == Fs::Btrfs {
        assert_eq!(num(&r, "rewritten_bytes"), 3 * 4096, "{r:#}");
    }
    // Every block b has in common with a is a block of a now.
    assert!(same_physical(&d.join("a"), 0, &d.join("b"), 0, 5 * 4096));
    assert!(same_physical(&d.join("a"), 6 * 4096, &d.join("b"), 6 * 4096, 994 * 4096));
    // A rerun does nothing.
    let again = run_json(&vol, &[d.to_str().unwrap()]);
    assert_eq!(num(&again, "duplicate_bytes") + num(&again, "rewritten_bytes"), 0, "{again:#}");
}

#[test]
fn btrfs_frees_the_extent_of_an_almost_identical_file() {
    almost_identical_pair(Fs::Btrfs);
}

#[test]
fn xfs_frees_the_blocks_of_an_almost_identical_file() {
    almost_identical_pair(Fs::Xfs);
}

/// More destinations with remainders than a share worker copies out at a
/// time (the bookend pass copies a batch, then shares the batch back): 40
/// near copies, each differing from its source in one block in the middle
/// and in its unaligned tail. Every remainder must be rewritten and shared
/// back into its own file, and every old extent freed.
#[test]
fn btrfs_frees_the_extents_of_many_near_copies_in_batches() {
    let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
    let d = vol.path("near");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(40);
    let (n, len, tail) = (40, 512 << 10, 300);
    for i in 0..n {
        let a = rng.bytes(len + tail);
        let mut b = a.clone();
        b[10 * 4096..11 * 4096].copy_from_slice(&rng.bytes(4096));
        b[len..].copy_from_slice(&rng.bytes(tail));
        std::fs::write(d.join(format!("a{i:02}")), &a).unwrap();
        std::fs::write(d.join(format!("b{i:02}")), &b).unwrap();
    }
    let before = Snapshot::take(&d);
    let free0 = free_bytes(&vol.mnt);
    let r = run_json(&vol, &[d.to_str().unwrap()]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    before.assert_same(&Snapshot::take(&d));
    let shared = n as i64 * (len as i64 - 4096);
    assert_eq!(num(&r, "deduped_bytes") as i64, shared, "{r:#}");
    assert_eq!(num(&r, "rewritten_bytes"), n * (4096 + tail as u64), "{r:#}");
    assert_eq!(num(&r, "pinned_bytes"), 0, "{r:#}");
    assert!(freed >= shared * 98 / 100, "freed {freed} of {shared}: {r:#}");
    for i in 0..n {
        let (a, b) = (d.join(format!("a{i:02}")), d.join(format!("b{i:02}")));
        assert!(same_physical(&a, 0, &b, 0, 10 * 4096), "b{i:02}");
        assert!(same_physical(&a, 11 * 4096, &b, 11 * 4096, len as u64 - 11 * 4096), "b{i:02}");
    }
}

#[test]
fn rewrite_ratio_zero_leaves_bookends_alone() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let d = vol.path("p");
    std::fs::create_dir(&d).unwrap();
    let a = Rng::new(1).bytes(4 << 20);
    let mut b = a.clone();
    b[0] ^= 1;
    std::fs::write(d.join("a"), &a).unwrap();
    std::fs::write(d.join("b"), &b).unwrap();
    let r = run_json(&vol, &[d.to_str().unwrap(), "--rewrite-ratio", "0"]);
    assert_eq!(num(&r, "rewritten_bytes"), 0);
    assert!(num(&r, "deduped_bytes") > 0);
}

/// On btrfs every shared byte either frees space or is pinned: its extent
/// stays for an uncovered rest too large to rewrite. The report's
/// `pinned_bytes` makes the two add up to what was shared (issue 13).
#[test]
fn btrfs_shared_is_freed_plus_pinned() {
    let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
    let d = vol.path("p");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(77);
    let whole = rng.bytes(8 << 20);
    let x = rng.bytes(2 << 20);
    // x at the start of one 16 MiB file and at the end of another: either
    // way the destination's extent is 2 MiB covered, 14 MiB not (pinned).
    let big1 = [x.clone(), rng.bytes(14 << 20)].concat();
    let big2 = [rng.bytes(14 << 20), x].concat();
    for (name, data) in [("whole1", &whole), ("whole2", &whole), ("big1", &big1), ("big2", &big2)] {
        std::fs::write(d.join(name), data).unwrap();
    }
    free_bytes(&vol.mnt);
    // Setup: x lies inside a larger extent in both big files.
    for (name, off) in [("big1", 0), ("big2", 14 << 20)] {
        let f = std::fs::File::open(d.join(name)).unwrap();
        let ext = dedupscan::sys::fiemap(std::os::fd::AsFd::as_fd(&f), off, 2 << 20).unwrap();
        assert!(ext.iter().any(|e| e.length > 4 << 20), "setup: {name} holds x in a small extent: {ext:?}");
    }
    let before = Snapshot::take(&d);
    let free0 = free_bytes(&vol.mnt);
    let r = run_json(&vol, &[d.to_str().unwrap()]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    before.assert_same(&Snapshot::take(&d));
    let (shared, pinned) = (num(&r, "deduped_bytes") as i64, num(&r, "pinned_bytes") as i64);
    assert_eq!(shared, 10 << 20, "{r:#}");
    assert!(pinned > 0, "{r:#}");
    let off = (shared - freed - pinned).abs();
    assert!(off * 50 <= shared, "shared {shared} != freed {freed} + pinned {pinned} (off by {off}): {r:#}");
}

/// Source choice by what stays on disk anyway (issue 13): a tarball, mostly
/// data of its own, holds x at an aligned member; a slightly larger disk
/// image holds x, a whole file g and a little metadata; x and g are files
/// too. Before, the image (larger, with a block of its own) was the source
/// of x, so the tarball's copy of x was shared into an extent that stays
/// for the tarball's own data: pinned, nothing freed. Now the tarball is
/// x's source, the image a destination everywhere but its metadata (which
/// the bookend pass rewrites), and every shared byte frees space.
#[test]
fn btrfs_tarball_is_the_source_and_the_image_extent_is_freed() {
    let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
    let d = vol.path("t");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(13);
    let (x, g, meta) = (rng.bytes(1 << 20), rng.bytes(8 << 20), rng.bytes(64 << 10));
    let tar = [rng.bytes(3 << 20), x.clone(), rng.bytes(5 << 20)].concat();
    let img = [meta, x.clone(), g.clone()].concat();
    for (name, data) in [("a.tar", &tar), ("b.img", &img), ("x", &x), ("g", &g)] {
        std::fs::write(d.join(name), data).unwrap();
    }
    free_bytes(&vol.mnt);
    let f = std::fs::File::open(d.join("a.tar")).unwrap();
    let ext = dedupscan::sys::fiemap(std::os::fd::AsFd::as_fd(&f), 3 << 20, 1 << 20).unwrap();
    assert!(ext.iter().any(|e| e.length > 2 << 20), "setup: the tarball holds x in a small extent: {ext:?}");
    let before = Snapshot::take(&d);
    let free0 = free_bytes(&vol.mnt);
    let r = run_json(&vol, &[d.to_str().unwrap()]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    before.assert_same(&Snapshot::take(&d));
    let shared = num(&r, "deduped_bytes") as i64;
    assert_eq!(shared, 10 << 20, "{r:#}");
    assert_eq!(num(&r, "pinned_bytes"), 0, "{r:#}");
    assert!(freed >= shared * 98 / 100, "freed {freed} of {shared}: {r:#}");
    // Every copy of x is the tarball's.
    for (name, off) in [("x", 0), ("b.img", 64 << 10)] {
        assert!(same_physical(&d.join("a.tar"), 3 << 20, &d.join(name), off, 1 << 20), "{name}: {r:#}");
    }
}

/// The pinned account per file and reason (issue 13): a destination whose
/// extent stays for a rest too large to rewrite (`below_rewrite_ratio`) and
/// one whose shared part lies in a compressed extent (`compressed`, never
/// rewritten). The run reports them by reason; `report --json` names the
/// files, keeps them after a rerun that finds everything shared, and drops
/// a file's account once the file changed.
#[test]
fn btrfs_pinned_bytes_by_file_and_reason() {
    let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
    let (p, c) = (vol.path("p"), vol.path("c"));
    std::fs::create_dir(&p).unwrap();
    std::fs::create_dir(&c).unwrap();
    let mut rng = Rng::new(78);
    // Uncompressed: x inside a 16 MiB extent in both files.
    let x = rng.bytes(2 << 20);
    std::fs::write(p.join("big1"), [x.clone(), rng.bytes(14 << 20)].concat()).unwrap();
    std::fs::write(p.join("big2"), [rng.bytes(14 << 20), x].concat()).unwrap();
    free_bytes(&vol.mnt);
    // Compressed (128 KiB extents): y covers the first extent of each file
    // and half of the second, whose rest differs.
    vol.remount_with("compress-force=zstd");
    let y = compressible(1, 192 << 10);
    std::fs::write(c.join("c1"), [y.clone(), compressible(2, 832 << 10)].concat()).unwrap();
    std::fs::write(c.join("c2"), [y, compressible(3, 832 << 10)].concat()).unwrap();
    free_bytes(&vol.mnt);
    vol.remount_with("compress=no");
    let before = (Snapshot::take(&p), Snapshot::take(&c));

    // Uncompressed: shared = freed + pinned, and pinned is below_rewrite_ratio.
    let free0 = free_bytes(&vol.mnt);
    let r = run_json(&vol, &[s(&p)]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    let (shared, pinned) = (num(&r, "deduped_bytes") as i64, num(&r, "pinned_bytes") as i64);
    assert_eq!((shared, pinned), (2 << 20, 2 << 20), "{r:#}");
    assert_eq!(r["pinned_by_reason"], serde_json::json!({"below_rewrite_ratio": 2 << 20}), "{r:#}");
    assert!(
        (shared - freed - pinned).abs() * 50 <= shared,
        "shared {shared} != freed {freed} + pinned {pinned}: {r:#}"
    );

    // Compressed: the half-covered second extent of the destination.
    let r = run_json(&vol, &[s(&c)]);
    assert_eq!(num(&r, "deduped_bytes"), 192 << 10, "{r:#}");
    assert_eq!(r["pinned_by_reason"], serde_json::json!({"compressed": 64 << 10}), "{r:#}");
    before.0.assert_same(&Snapshot::take(&p));
    before.1.assert_same(&Snapshot::take(&c));

    // The database's account: one destination per reason, by path.
    let files = |rep: &serde_json::Value| -> Vec<(String, String, u64)> {
        let list = rep["pinned"]["files"].as_array().unwrap_or_else(|| panic!("{rep:#}"));
        let name = |f: &serde_json::Value| f["path"].as_str().unwrap().rsplit('/').next().unwrap().to_owned();
        list.iter().map(|f| (name(f), f["reason"].as_str().unwrap().to_owned(), f["bytes"].as_u64().unwrap())).collect()
    };
    let rep = db_report(&vol);
    let got = files(&rep);
    assert_eq!(got.len(), 2, "{rep:#}");
    assert!(matches!(got[0].0.as_str(), "big1" | "big2"), "{rep:#}");
    assert_eq!((&got[0].1[..], got[0].2), ("below_rewrite_ratio", 2 << 20), "{rep:#}");
    assert!(matches!(got[1].0.as_str(), "c1" | "c2"), "{rep:#}");
    assert_eq!((&got[1].1[..], got[1].2), ("compressed", 64 << 10), "{rep:#}");
    assert_eq!(num(&rep["pinned"], "bytes"), (2 << 20) + (64 << 10), "{rep:#}");
    let text = dedupscan().arg("report").db(vol.db()).expect(0).run().stdout;
    assert!(text.contains("below_rewrite_ratio") && text.contains(&got[0].0), "{text}");
    let page = vol.db().with_file_name("r.html");
    dedupscan().args(["report", "--html", s(&page)]).db(vol.db()).expect(0).run();
    let page = std::fs::read_to_string(page).unwrap();
    assert!(page.contains(&format!("data-figure=\"pinned\" data-value=\"{}\"", (2 << 20) + (64 << 10))), "{page}");

    // A rerun finds everything shared and judges nothing: the account stays.
    let r = run_json(&vol, &["--rehash", s(&vol.mnt)]);
    assert_eq!(num(&r, "duplicate_bytes"), 0, "{r:#}");
    assert_eq!(files(&db_report(&vol)), got);
    // The pinned big file is rewritten with other data: its account is
    // void (its old extent is gone); the compressed one stays. (Rewritten
    // with the same data, it would be shared and pinned again, and
    // recorded anew.)
    std::fs::write(p.join(&got[0].0), Rng::new(79).bytes(16 << 20)).unwrap();
    run_json(&vol, &["--incremental", s(&vol.mnt)]);
    assert_eq!(files(&db_report(&vol)), got[1..], "account of a changed file kept");
}

/// The run says what a larger `--rewrite-ratio` would free and copy about
/// the bytes it left pinned, and a run with that ratio does it: three
/// identical layouts with different data (one run for the figures, one for
/// the text, one at the larger ratio), x (2 MiB) at the start of one 16
/// MiB extent and at the end of another, so the destination's extent is
/// covered 2 MiB and holds 14 MiB more (7 times: pinned at the default 4).
#[test]
fn btrfs_what_a_larger_rewrite_ratio_would_free_is_what_it_frees() {
    let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
    let dirs = [vol.path("one"), vol.path("two"), vol.path("three")];
    for (seed, d) in (90..).zip(&dirs) {
        std::fs::create_dir(d).unwrap();
        let mut rng = Rng::new(seed);
        let x = rng.bytes(2 << 20);
        std::fs::write(d.join("big1"), [x.clone(), rng.bytes(14 << 20)].concat()).unwrap();
        std::fs::write(d.join("big2"), [rng.bytes(14 << 20), x].concat()).unwrap();
    }
    free_bytes(&vol.mnt);
    let before: Vec<Snapshot> = dirs.iter().map(|d| Snapshot::take(d)).collect();

    let r = run_json(&vol, &[s(&dirs[0])]);
    assert_eq!(num(&r, "pinned_bytes"), 2 << 20, "{r:#}");
    let what_if = |ratio: f64, free: u64, copy: u64| serde_json::json!({"rewrite_ratio": ratio, "would_free_bytes": free, "would_copy_bytes": copy});
    let expected: Vec<_> = [8.0, 16.0].map(|k| what_if(k, 2 << 20, 14 << 20)).into();
    assert_eq!(r["rewrite_what_if"], serde_json::Value::from(expected), "{r:#}");
    // The text says it under the pinned bytes, and a dry run before says
    // the same of what would stay pinned.
    let pinned_lines = |args: &[&str], label: &str| {
        let text = dedupscan().args(args).db(vol.db()).expect(0).run().stdout;
        let at = |key: &str| text.lines().find(|l| l.contains(key)).unwrap_or_else(|| panic!("{key}: {text}"));
        assert!(at(label).contains("2.0 MiB"), "{text}");
        assert!(at("below_rewrite_ratio").contains("2.0 MiB"), "{text}");
        let line = at("--rewrite-ratio 8");
        assert!(line.contains("2.0 MiB") && line.ends_with("would be freed by copying 14.0 MiB"), "{text}");
    };
    pinned_lines(&[s(&dirs[2]), "--dry-run"], "would stay pinned");
    pinned_lines(&[s(&dirs[2])], "the rest of the extent is in use");

    // The same layout, run at the ratio the first run suggested.
    let free0 = free_bytes(&vol.mnt);
    let r = run_json(&vol, &[s(&dirs[1]), "--rewrite-ratio", "8"]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    assert_eq!((num(&r, "pinned_bytes"), num(&r, "rewritten_bytes")), (0, 14 << 20), "{r:#}");
    assert_eq!(r["rewrite_what_if"], serde_json::json!([]), "{r:#}");
    assert!((freed - (2 << 20)).abs() * 20 <= 2 << 20, "freed {freed}, predicted 2 MiB: {r:#}");
    for (b, d) in before.iter().zip(&dirs) {
        b.assert_same(&Snapshot::take(d));
    }
}

/// A block whose 8 bytes `i` (little-endian) repeat to fill 4 KiB.
fn counter_block(i: u64) -> Vec<u8> {
    i.to_le_bytes().repeat(512)
}

/// Two different blocks whose 48-bit plan fingerprints collide (found once
/// by a birthday search over `counter_block` for i up to 2^26, 8 pairs:
/// bytes 2..8 of their SHA-256 are equal), so the planner takes them for
/// one content and the kernel's
/// compare says they differ. Before, the colliding block of a destination
/// kept the destination's whole old extent on disk once everything else in
/// it was shared: on FULL/btrfs about 105 MiB of image extents, 4.8 points
/// of the ideal. Now the part found different is rewritten like a
/// remainder, and the extent is freed.
#[test]
fn btrfs_a_fingerprint_collision_does_not_pin_the_extent() {
    let (c1, c2) = (counter_block(7_666_570), counter_block(40_773_325));
    let fp = |b: &[u8]| {
        use sha2::Digest;
        dedupscan::blockmap::short_fp(dedupscan::hash::fingerprint(&sha2::Sha256::digest(b).into()))
    };
    assert!(c1 != c2 && fp(&c1) == fp(&c2), "setup: the blocks do not collide");
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let d = vol.path("c");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(31);
    let y = rng.bytes(1 << 20);
    // `s` stays anyway (data of its own around c1): the source of c1. It
    // is small (48 blocks): a lone pair of blocks between two large files
    // links and plans nothing (`plan::links`; tests/determinism.rs), and
    // the collision is to reach the kernel here.
    // `dest`: y, c2, then 1 MiB of its own, in one extent: a destination
    // for y and c2, its own rest rewritten (bookend) so the extent can go.
    std::fs::write(d.join("y"), &y).unwrap();
    std::fs::write(d.join("dest"), [y.clone(), c2, rng.bytes(1 << 20)].concat()).unwrap();
    std::fs::write(d.join("s"), [rng.bytes(128 << 10), c1, rng.bytes(60 << 10)].concat()).unwrap();
    free_bytes(&vol.mnt);
    let dest_extents = || {
        let f = std::fs::File::open(d.join("dest")).unwrap();
        dedupscan::sys::fiemap(std::os::fd::AsFd::as_fd(&f), 0, 3 << 20).unwrap()
    };
    let ext = dest_extents();
    assert!(ext[0].length >= (1 << 20) + 4096, "setup: y and c2 not in one extent of dest: {ext:?}");
    let before = Snapshot::take(&d);
    let free0 = free_bytes(&vol.mnt);
    let r = run_json(&vol, &[s(&d)]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    before.assert_same(&Snapshot::take(&d));
    assert_eq!(r["dedupe_status"]["differs"], 1, "{r:#}");
    assert_eq!(num(&r, "deduped_bytes"), 1 << 20, "{r:#}");
    assert!(same_physical(&d.join("y"), 0, &d.join("dest"), 0, 1 << 20), "setup: y is not dest's source: {r:#}");
    // dest's old extent (2 MiB + 4 KiB) is gone, 1 MiB + 4 KiB written
    // anew: 1 MiB freed. Kept by c2, the extent would cost the rewrite.
    let ext = dest_extents();
    assert!(freed >= (1 << 20) * 9 / 10, "freed {freed}: the colliding block keeps dest's extent: {ext:?} {r:#}");
}

/// Shared parts smaller than the rest of their extent, as data laid out
/// unlike the benchmark corpora has them: small files with a common first
/// block (a template's header) or last block (a footer), and 1 MiB files
/// sharing a 256 KiB resource in the middle. Each destination extent holds
/// 2 or 3 times its shared part besides: at the default `--rewrite-ratio`
/// (4) everything is freed, at the old default 1 nothing was (checked on a
/// second copy of the layout).
#[test]
fn btrfs_frees_extents_shared_in_a_small_part_at_the_default_ratio() {
    let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
    let layout = |d: &std::path::Path, seed: u64| {
        let mut rng = Rng::new(seed);
        let (header, footer) = (rng.bytes(4096), rng.bytes(4096));
        for i in 0..256 {
            let sub = d.join(format!("t{}", i % 8));
            std::fs::create_dir_all(&sub).unwrap();
            std::fs::write(sub.join(format!("h{i}")), [header.clone(), rng.bytes(8192)].concat()).unwrap();
            std::fs::write(sub.join(format!("f{i}")), [rng.bytes(8192), footer.clone()].concat()).unwrap();
        }
        for i in 0..16 {
            let resource = rng.bytes(256 << 10);
            for side in ["a", "b"] {
                let file = [rng.bytes(256 << 10), resource.clone(), rng.bytes(512 << 10)].concat();
                std::fs::write(d.join(format!("{side}{i}.bin")), file).unwrap();
            }
        }
    };
    let (new, old) = (vol.path("new"), vol.path("old"));
    layout(&new, 1);
    layout(&old, 2);
    let ideal = 2 * 255 * 4096 + 16 * (256 << 10);
    let before = (Snapshot::take(&new), Snapshot::take(&old));

    let free0 = free_bytes(&vol.mnt);
    let r = run_json(&vol, &[s(&new)]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    assert_eq!((num(&r, "deduped_bytes"), num(&r, "pinned_bytes")), (ideal as u64, 0), "{r:#}");
    assert_eq!(num(&r, "rewritten_bytes"), 2 * 255 * 8192 + 16 * (768 << 10), "{r:#}");
    // Less the metadata of 544 rewritten extents (4% here).
    assert!(freed >= ideal * 90 / 100, "freed {freed} of {ideal}: {r:#}");
    assert!(same_physical(&new.join("t0/h0"), 0, &new.join("t1/h1"), 0, 4096));
    assert!(same_physical(&new.join("t0/f0"), 8192, &new.join("t1/f1"), 8192, 4096));
    assert!(same_physical(&new.join("a3.bin"), 256 << 10, &new.join("b3.bin"), 256 << 10, 256 << 10));

    let free0 = free_bytes(&vol.mnt);
    let r = run_json(&vol, &[s(&old), "--rewrite-ratio", "1"]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    assert_eq!((num(&r, "deduped_bytes"), num(&r, "pinned_bytes")), (ideal as u64, ideal as u64), "{r:#}");
    assert!(freed < ideal / 10, "freed {freed} at ratio 1: {r:#}");
    before.0.assert_same(&Snapshot::take(&new));
    before.1.assert_same(&Snapshot::take(&old));
}

/// A file written in one extent, then changed in place: its extent is
/// split into stretches that FIEMAP shows apart. One stretch (block 11,
/// between the two changed blocks) is the only copy the plan keeps of a
/// block another file has; the stretches around it are covered whole.
/// Judged stretch by stretch, nothing was left to rewrite, and the whole
/// extent stayed on disk for that one block (and `pinned_bytes` said 0).
/// Judged by the extent on disk, the block is rewritten and the extent
/// freed.
#[test]
fn btrfs_frees_an_extent_split_by_writes_into_its_middle() {
    let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
    let d = vol.path("split");
    std::fs::create_dir(&d).unwrap();
    const B: usize = 4096;
    let mut rng = Rng::new(41);
    // c: the original, with a tail of its own (larger: the planner's
    // first choice of source); a: c with block 11 changed, written and
    // synced in one extent, then blocks 10 and 12 changed in place; b: c
    // with a's block 11.
    let c = rng.bytes(256 * B);
    let mut a = c.clone();
    a[11 * B..12 * B].copy_from_slice(&rng.bytes(B));
    let b = a.clone();
    std::fs::write(d.join("c"), [c.clone(), rng.bytes(16 * B)].concat()).unwrap();
    std::fs::write(d.join("b"), &b).unwrap();
    let f = std::fs::File::create(d.join("a")).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&a, 0).unwrap();
    f.sync_all().unwrap();
    for blk in [10, 12] {
        f.write_all_at(&rng.bytes(B), (blk * B) as u64).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let at = |blk: usize| physical_blocks(&d.join("a"), (blk * B) as u64, B as u64)[0].unwrap();
    assert_eq!(at(11), at(9) + 2 * B as u64, "block 11 must stay in the first extent");
    assert_ne!(at(10), at(9) + B as u64, "block 10 must be written elsewhere");
    let old = at(11);
    let before = Snapshot::take(&d);

    let free0 = free_bytes(&vol.mnt);
    let r = run_json(&vol, &[s(&d)]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    before.assert_same(&Snapshot::take(&d));
    // b whole, a but its own two and the source block 11: 509 blocks
    // shared, one rewritten.
    assert_eq!(num(&r, "deduped_bytes"), 509 * B as u64, "{r:#}");
    assert_eq!((num(&r, "rewritten_bytes"), num(&r, "pinned_bytes")), (B as u64, 0), "{r:#}");
    assert!(freed >= 500 * B as i64, "freed {freed} of {}: {r:#}", 508 * B);
    assert!(same_physical(&d.join("a"), 11 * B as u64, &d.join("b"), 11 * B as u64, B as u64));
    assert!(same_physical(&d.join("a"), 0, &d.join("c"), 0, 10 * B as u64));
    assert_ne!(at(11), old, "block 11 must have left the old extent");
}

/// Under `compress-force` the rest of a partly covered compressed extent
/// is rewritten (compressed anew, as every write there) and the extent
/// freed; without it (the same data, remounted `compress=no`, as after a
/// `btrfs filesystem defragment -c`) it stays pinned as `compressed`: a
/// copy written plain could take more room than the extent frees.
#[test]
fn btrfs_compressed_extents_are_rewritten_only_under_compress_force() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    vol.remount_with("compress-force=zstd");
    let dirs = [vol.path("forced"), vol.path("plain")];
    for (seed, d) in (40..).step_by(3).zip(&dirs) {
        // y covers the first 128 KiB extent of each file and half of the
        // second, whose rest differs (3 times y's part there).
        std::fs::create_dir(d).unwrap();
        let y = compressible(seed, 160 << 10);
        std::fs::write(d.join("c1"), [y.clone(), compressible(seed + 1, 864 << 10)].concat()).unwrap();
        std::fs::write(d.join("c2"), [y, compressible(seed + 2, 864 << 10)].concat()).unwrap();
    }
    free_bytes(&vol.mnt);
    let before: Vec<Snapshot> = dirs.iter().map(|d| Snapshot::take(d)).collect();
    let extents_of = |d: &std::path::Path| -> std::collections::BTreeSet<u64> {
        ["c1", "c2"].iter().flat_map(|n| physical_blocks(&d.join(n), 0, 1 << 20)).map(Option::unwrap).collect()
    };
    let old = [extents_of(&dirs[0]), extents_of(&dirs[1])];
    assert!(old.iter().all(|e| e.len() == 16), "setup: 8 compressed extents a file: {old:?}");

    let r = run_json(&vol, &[s(&dirs[0])]);
    assert_eq!(num(&r, "deduped_bytes"), 160 << 10, "{r:#}");
    assert_eq!((num(&r, "pinned_bytes"), num(&r, "rewritten_bytes")), (0, 96 << 10), "{r:#}");
    assert_eq!(old[0].difference(&extents_of(&dirs[0])).count(), 2, "both old extents freed: {r:#}");

    vol.remount_with("compress=no");
    let r = run_json(&vol, &[s(&dirs[1])]);
    assert_eq!(num(&r, "deduped_bytes"), 160 << 10, "{r:#}");
    assert_eq!(r["pinned_by_reason"], serde_json::json!({"compressed": 32 << 10}), "{r:#}");
    assert_eq!(num(&r, "rewritten_bytes"), 0, "{r:#}");
    assert_eq!(old[1].difference(&extents_of(&dirs[1])).count(), 1, "{r:#}");
    for (b, d) in before.iter().zip(&dirs) {
        b.assert_same(&Snapshot::take(d));
    }
}
