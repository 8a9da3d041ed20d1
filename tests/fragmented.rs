//! Sharing a contiguous copy from a badly fragmented file would leave the
//! copy as fragmented. Where a whole-file copy is far less fragmented, it
//! is used as the source instead: every copy ends contiguous.

mod common;

use std::os::unix::fs::FileExt;

use common::*;
use dedupscan::corpus::Rng;

#[test]
fn a_fragmented_source_takes_the_contiguous_copy() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let len = 2 << 20;
    let data = Rng::new(11).bytes(len);
    // "a" ranks first as the source; rewriting every other block in place
    // (same bytes) gives it one extent per block.
    std::fs::write(d.join("a"), &data).unwrap();
    let a = std::fs::OpenOptions::new().write(true).open(d.join("a")).unwrap();
    a.sync_all().unwrap();
    for blk in (0..len / 4096).step_by(2) {
        a.write_all_at(&data[blk * 4096..(blk + 1) * 4096], (blk * 4096) as u64).unwrap();
    }
    a.sync_all().unwrap();
    drop(a);
    std::fs::write(d.join("b"), &data).unwrap();
    std::fs::File::open(d.join("b")).unwrap().sync_all().unwrap();
    let (ea, eb) = (extents(&d.join("a")), extents(&d.join("b")));
    assert!(ea >= 256 && eb <= 4, "setup: a has {ea} extents, b {eb}");
    let before = Snapshot::take(&d);

    let free0 = free_bytes(&vol.mnt);
    let r = run_json(&vol, &[d.to_str().unwrap()]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    before.assert_same(&Snapshot::take(&d));
    assert_eq!(num(&r, "sources_swapped"), 1, "{r:#}");
    assert_eq!(num(&r, "deduped_bytes"), len as u64, "{r:#}");
    assert!(same_physical(&d.join("a"), 0, &d.join("b"), 0, len as u64));
    let (ea2, eb2) = (extents(&d.join("a")), extents(&d.join("b")));
    assert!(eb2 <= 4 && ea2 <= 4, "copies left fragmented: a {ea2} extents, b {eb2}");
    assert!(freed >= len as i64 * 95 / 100, "freed {freed}: {r:#}");
    // A rerun does nothing.
    let again = run_json(&vol, &[d.to_str().unwrap()]);
    assert_eq!(num(&again, "duplicate_bytes"), 0, "{again:#}");
}
