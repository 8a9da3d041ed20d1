//! End to end on real volumes: the synthetic corpus (whole-file copies,
//! aligned overlaps, shifted copies, a 2%-changed snapshot pair, sparse
//! files, unaligned tails, many small files) on XFS and btrfs.
//!
//! Each test proves nothing was lost (content, size, mode, mtime of every
//! file) and proves its claims with FIEMAP and statfs. A run, and a dry
//! run, leave every access time as it was.

mod common;

use common::*;

/// Dry run, real run and rerun on one volume; returns (ideal, freed).
fn corpus_round_trip(fs: Fs) -> Option<(u64, i64)> {
    let vol = Volume::new(fs, 512)?;
    let data = vol.path("data");
    dedupscan::corpus::build(&data, 1, 1).unwrap();
    let ideal = ideal_dup_bytes(&data);
    let before = Snapshot::take(&data);
    let data_s = data.to_str().unwrap();

    // Dry run: verifies in user space, changes nothing, not even when a
    // file was last read or a directory listed.
    let free0 = free_bytes(&vol.mnt);
    let atimes = AccessTimes::aged(&data);
    let dry = run_json(&vol, &[data_s, "--dry-run"]);
    atimes.assert_unchanged("a dry run");
    assert_eq!(free_bytes(&vol.mnt), free0, "a dry run changed the used space");
    before.assert_same(&Snapshot::take(&data));
    assert!(dry["dry_run"].as_bool().unwrap());
    assert_eq!(num(&dry, "deduped_bytes"), 0);
    assert_eq!(dry["freed_bytes"].as_i64(), Some(0));
    assert_eq!(shared_bytes(&data.join("whole/b/file0.bin")), 0, "dry run shared something");
    let preview = num(&dry, "duplicate_bytes");
    let preview_rewrite = num(&dry, "rewritten_bytes");
    assert!(preview * 10 >= ideal * 9, "dry run found {preview} of ideal {ideal}");
    assert_eq!(dry["dedupe_status"]["differs"].as_u64(), Some(0));

    // Real run.
    let atimes = AccessTimes::aged(&data);
    let real = run_json(&vol, &[data_s]);
    atimes.assert_unchanged("a run");
    let free1 = free_bytes(&vol.mnt);
    let measured = free1 as i64 - free0 as i64;
    before.assert_same(&Snapshot::take(&data));
    assert_eq!(real["errors"].as_u64(), Some(0), "{real:#}");
    assert_eq!(num(&real, "deduped_bytes"), num(&real, "duplicate_bytes"));
    // The dry run's preview is what the real run shared and rewrote.
    assert_eq!(num(&real, "deduped_bytes"), preview);
    assert_eq!(num(&real, "rewritten_bytes"), preview_rewrite);
    if fs == Fs::Xfs {
        assert_eq!(preview_rewrite, 0, "XFS frees per block and needs no rewriting");
    }
    let reported = real["freed_bytes"].as_i64().unwrap();
    assert!(
        (reported - measured).abs() <= measured.abs() / 50 + (1 << 20),
        "report says freed {reported}, statfs says {measured}"
    );
    // Sharing is visible in FIEMAP: whole-file copies share every block with
    // the oldest copy, the shifted copy shares the original at offset 4 KiB,
    // the snapshot pair shares most blocks.
    let w = |t: &str| data.join(format!("whole/{t}/file0.bin"));
    let len0 = std::fs::metadata(w("a")).unwrap().len();
    assert!(same_physical(&w("a"), 0, &w("b"), 0, len0));
    assert!(same_physical(&w("a"), 0, &w("c"), 0, len0));
    let orig = data.join("shifted/original.bin");
    let olen = std::fs::metadata(&orig).unwrap().len();
    assert!(same_physical(&orig, 0, &data.join("shifted/shifted.bin"), 4096, olen));
    let half = 2 << 20;
    assert!(same_physical(&data.join("partial/first.bin"), 0, &data.join("partial/second.bin"), 0, half));
    let img = data.join("images/vm-tuesday.img");
    let ilen = std::fs::metadata(&img).unwrap().len();
    assert!(shared_bytes(&img) * 100 >= ilen * 95, "snapshot pair: {} of {ilen} shared", shared_bytes(&img));
    // Sparse copies stay sparse and share their data islands.
    let sp = data.join("sparse/disk2.raw");
    assert!(std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&sp).unwrap()) * 512 < 2 << 20);
    assert!(same_physical(&data.join("sparse/disk1.raw"), 0, &sp, 0, 256 * 1024));

    // A second run on the unchanged volume submits nothing: incremental, it
    // neither hashes nor plans; a full rerun finds every range already shared.
    let again = run_json(&vol, &[data_s, "--incremental"]);
    assert_eq!(num(&again, "duplicate_bytes"), 0, "{again:#}");
    assert_eq!(num(&again, "bytes_hashed"), 0);
    assert_eq!(num(&again, "ranges_planned"), 0);
    let full = run_json(&vol, &[data_s, "--rehash"]);
    assert_eq!(num(&full, "duplicate_bytes"), 0, "{full:#}");
    assert!(num(&full, "already_shared_bytes") >= preview * 99 / 100, "{full:#}");
    before.assert_same(&Snapshot::take(&data));

    // New data arriving later: a shifted copy of an old image and a whole
    // copy of an old file. An incremental run finds them against the old,
    // already shared files through the new files' anchors alone.
    let monday = std::fs::read(data.join("images/vm-monday.img")).unwrap();
    let mut shifted = vec![0x5a; 8192];
    shifted.extend_from_slice(&monday[..4 << 20]);
    std::fs::write(data.join("later-shifted.img"), &shifted).unwrap();
    // (Not std::fs::copy: on btrfs and XFS it reflinks, already sharing.)
    std::fs::write(data.join("later-copy.bin"), std::fs::read(data.join("whole/a/file1.bin")).unwrap()).unwrap();
    let before = Snapshot::take(&data);
    let later = run_json(&vol, &[data_s, "--incremental"]);
    before.assert_same(&Snapshot::take(&data));
    assert_eq!(num(&later, "files_hashed"), 2, "{later:#}");
    let copy_len = std::fs::metadata(data.join("later-copy.bin")).unwrap().len();
    assert!(num(&later, "deduped_bytes") >= (4 << 20) + copy_len - 8192, "{later:#}");
    assert!(same_physical(&data.join("images/vm-monday.img"), 0, &data.join("later-shifted.img"), 8192, 4 << 20));
    assert!(same_physical(&data.join("whole/a/file1.bin"), 0, &data.join("later-copy.bin"), 0, copy_len & !4095));
    Some((ideal, measured))
}

#[test]
fn xfs_frees_at_least_90_percent_of_ideal() {
    let Some((ideal, freed)) = corpus_round_trip(Fs::Xfs) else { return };
    assert!(freed * 10 >= ideal as i64 * 9, "xfs freed {freed} of ideal {ideal}");
}

#[test]
fn btrfs_frees_at_least_90_percent_of_ideal() {
    // Needs the partly covered extents rewritten (the bookend problem):
    // without it btrfs frees about 60% of this corpus.
    let Some((ideal, freed)) = corpus_round_trip(Fs::Btrfs) else { return };
    assert!(freed * 10 >= ideal as i64 * 9, "btrfs freed {freed} of ideal {ideal}");
}

#[test]
fn report_subcommand_measures_what_is_shared_and_what_remains() {
    let Some(vol) = Volume::new(Fs::Btrfs, 320) else { return };
    let data = vol.path("d");
    std::fs::create_dir_all(data.join("copies")).unwrap();
    let payload = dedupscan::corpus::Rng::new(3).bytes(1 << 20);
    std::fs::write(data.join("a"), &payload).unwrap();
    std::fs::write(data.join("copies/b"), &payload).unwrap();
    std::fs::write(data.join("copies/c"), &payload).unwrap();
    run_json(&vol, &[data.to_str().unwrap(), "--dry-run"]);
    let before = db_report(&vol);
    assert_eq!(before["files"].as_u64(), Some(3));
    assert_eq!(num(&before, "duplicate_bytes"), 2 << 20);
    assert_eq!(num(&before, "unshared_bytes"), 2 << 20);
    assert_eq!(num(&before, "shared_bytes"), 0);
    assert_eq!(before["largest_remaining_groups"][0]["destinations"].as_u64(), Some(2));
    assert!(before["top_directories"][0]["directory"].as_str().unwrap().ends_with("/d/copies"), "{before:#}");
    run_json(&vol, &[data.to_str().unwrap()]);
    let after = db_report(&vol);
    assert_eq!(num(&after, "shared_bytes"), 2 << 20, "{after:#}");
    assert_eq!(num(&after, "unshared_bytes"), 0);
    assert!(after["largest_remaining_groups"].as_array().unwrap().is_empty());
    assert_eq!(after["runs"].as_array().unwrap().len(), 2);
    assert!(after["freed_bytes_total"].as_i64().unwrap() >= 2 << 20);
    // The database lists every path: only its owner may read it.
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(vol.db()).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
}
