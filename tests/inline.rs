//! Files whose data btrfs keeps inline in its metadata cannot be shared:
//! they must be left alone and counted, never submitted run after run.

mod common;

use common::*;
use dedupscan::corpus::Rng;
use std::path::Path;

fn is_inline(path: &Path) -> bool {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len();
    dedupscan::sys::fiemap(std::os::fd::AsFd::as_fd(&f), 0, len)
        .unwrap()
        .iter()
        .any(|e| e.flags & dedupscan::sys::fiemap::flags::DATA_INLINE != 0)
}

/// The source (`a`, first by path) is inline, its copy `b` is not (written
/// while `max_inline=0`): the copy holds no shared extent, so only the
/// source's own map tells that there is nothing to share. Submitting anyway
/// makes btrfs copy the bytes into `b` and report success, every run.
#[test]
fn btrfs_inline_source_with_a_regular_copy_is_never_submitted() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let d = vol.path("small");
    std::fs::create_dir(&d).unwrap();
    let data = Rng::new(5).bytes(1000);
    vol.remount_with("max_inline=0");
    std::fs::write(d.join("b"), &data).unwrap();
    dedupscan::sys::syncfs(std::fs::File::open(&d).unwrap()).unwrap();
    vol.remount_with("max_inline=2048");
    std::fs::write(d.join("a"), &data).unwrap();
    dedupscan::sys::syncfs(std::fs::File::open(&d).unwrap()).unwrap();
    assert!(is_inline(&d.join("a")) && !is_inline(&d.join("b")), "setup: a inline, b a regular extent");

    let before = Snapshot::take(&d);
    for run in 1..=2 {
        // --rehash: the second run plans everything again (a plain rerun
        // would find nothing new and plan nothing).
        let r = run_json(&vol, &[d.to_str().unwrap(), "--rehash"]);
        assert_eq!(num(&r, "deduped_bytes"), 0, "run {run}: {r:#}");
        assert_eq!(r["skipped"]["inline"].as_u64(), Some(1), "run {run}: {r:#}");
    }
    before.assert_same(&Snapshot::take(&d));
    assert!(!is_inline(&d.join("b")), "b was rewritten");
}
