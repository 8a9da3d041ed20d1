//! Compressed btrfs (`compress-force=zstd`): FIEMAP flags every extent
//! ENCODED and reports the start of the whole compressed extent as its
//! address. Blocks already in the source's compressed extent are
//! recognised as shared: a rerun submits nothing, and `report` says nothing
//! is left to share.

mod common;

use common::*;

#[test]
fn rerun_on_compressed_btrfs_submits_nothing() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    vol.remount_with("compress-force=zstd");
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let a = compressible(4, 1 << 20);
    std::fs::write(d.join("a"), &a).unwrap();
    std::fs::write(d.join("b"), &a).unwrap();
    // A copy shifted by 64 KiB: once shared, its extents start in the middle
    // of a's compressed extents, where FIEMAP shows only the extent's start.
    let mut shifted = a[64 << 10..].to_vec();
    shifted.extend_from_slice(&compressible(5, 64 << 10));
    std::fs::write(d.join("shifted"), &shifted).unwrap();
    let path = d.to_str().unwrap();
    let before = Snapshot::take(&d);

    let first = run_json(&vol, &[path]);
    assert!(num(&first, "deduped_bytes") >= (2 << 20) - (64 << 10), "{first:#}");
    before.assert_same(&Snapshot::take(&d));
    let f = std::fs::File::open(d.join("b")).unwrap();
    let ext = dedupscan::sys::fiemap(std::os::fd::AsFd::as_fd(&f), 0, 1 << 20).unwrap();
    assert!(ext.iter().all(|e| e.flags & dedupscan::sys::fiemap::flags::ENCODED != 0), "not compressed: {ext:?}");
    assert!(shared_bytes(&d.join("b")) == 1 << 20 && shared_bytes(&d.join("shifted")) > 0);

    // A full rerun (--rehash: read and plan everything again): everything
    // planned is already shared.
    let again = run_json(&vol, &["--rehash", path]);
    assert_eq!(num(&again, "duplicate_bytes"), 0, "resubmitted shared compressed extents: {again:#}");
    assert_eq!(num(&again, "rewritten_bytes"), 0, "{again:#}");
    assert!(num(&again, "already_shared_bytes") >= (2 << 20) - (64 << 10), "{again:#}");
    before.assert_same(&Snapshot::take(&d));
    let rep = db_report(&vol);
    assert_eq!(num(&rep, "unshared_bytes"), 0, "report says not yet shared: {rep:#}");
    assert!(num(&rep, "shared_bytes") >= (2 << 20) - (64 << 10), "{rep:#}");
}
