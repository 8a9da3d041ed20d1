//! btrfs files with data checksums and files without them (made on a
//! volume mounted `nodatasum`) on one volume. btrfs refuses to share
//! between the two kinds (`EINVAL`). The run used to:
//! - pair them anyway, and fail every such pair with an error;
//! - make its unnamed files (a rewrite's copy, the hole written zeros are
//!   shared from) with whatever the mount options gave, so every rewrite
//!   and punch into a file of the other kind failed, silently: the shared
//!   bytes counted pinned (`rewrite_failed`), nothing freed, no zeros
//!   turned into holes.
//!
//! Now the fingerprints of files without checksums are salted apart (the
//! plan pairs each kind only with its own; where new files keep checksums a
//! file is asked only when read again, so a mixed pair fails once first),
//! and each unnamed file is given the kind of the file it is shared into.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use dedupscan::corpus::Rng;

/// A near-copy pair (`{name}a`: 1 MiB, `{name}b`: its first 512 KiB with
/// one block changed: the rest of `b`'s extent must be rewritten), and a
/// file of 1 MiB of written zeros between two random MiB (`{name}z`).
fn write_kind(d: &Path, name: &str, seed: u64) {
    let mut rng = Rng::new(seed);
    let a = rng.bytes(1 << 20);
    let mut b = a[..512 << 10].to_vec();
    b[4096..8192].copy_from_slice(&rng.bytes(4096));
    std::fs::write(d.join(format!("{name}a")), &a).unwrap();
    std::fs::write(d.join(format!("{name}b")), &b).unwrap();
    let mut z = rng.bytes(1 << 20);
    z.extend(vec![0; 1 << 20]);
    z.extend(rng.bytes(1 << 20));
    std::fs::write(d.join(format!("{name}z")), &z).unwrap();
}

/// Files of both kinds; the run under `run_with` mount options.
fn both_kinds(run_with: &str) {
    let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
    let d = vol.path("d");
    std::fs::create_dir_all(&d).unwrap();
    write_kind(&d, "sum", 1);
    let whole = Rng::new(3).bytes(2 << 20);
    std::fs::write(d.join("whole-sum"), &whole).unwrap();
    free_bytes(&vol.mnt);
    vol.remount_with("nodatasum");
    write_kind(&d, "nosum", 2);
    // Two copies without checksums of a file with them: the copies pair.
    std::fs::write(d.join("whole-nosum1"), &whole).unwrap();
    std::fs::write(d.join("whole-nosum2"), &whole).unwrap();
    free_bytes(&vol.mnt);
    vol.remount_with(run_with);
    let before = Snapshot::take(&d);

    let out = dedupscan().args([s(&d), "-v"]).json().db(vol.db()).expect(0).expect(1).run();
    let (r, err) = (&out.json, &out.stderr);
    validate_report(r);
    before.assert_same(&Snapshot::take(&d));
    // Where new files keep checksums, files are asked their kind only when
    // read again (hashing cost): the mixed copies of `whole` fail once,
    // said as such, and the next run reads the one without again.
    let refused = num(r, "errors");
    match run_with {
        "nodatasum" => assert_eq!(refused, 0, "{err}"),
        _ => {
            assert!(refused <= 2 && err.matches("one keeps data checksums and the other not").count() as u64 == refused)
        }
    }
    assert_eq!(err.matches("warning").count() as u64, refused, "{err}");
    let next = dedupscan().args([s(&d), "--incremental"]).json().db(vol.db()).expect(0).run();
    assert_eq!(num(&next.json, "errors"), 0, "{}", next.stderr);
    assert_eq!(num(r, "pinned_bytes"), 0, "{r:#}");
    assert!(num(r, "rewritten_bytes") >= 2 * (500 << 10), "{r:#}");
    assert_eq!(num(r, "zeros_to_holes_bytes"), 2 << 20, "{r:#}");
    for kind in ["sum", "nosum"] {
        let (a, b) = (d.join(format!("{kind}a")), d.join(format!("{kind}b")));
        assert!(same_physical(&a, 0, &b, 0, 4096), "{kind}: not shared: {r:#}");
        assert!(same_physical(&a, 8192, &b, 8192, (512 << 10) - 8192), "{kind}: not shared: {r:#}");
        let z = d.join(format!("{kind}z"));
        assert!(physical_blocks(&z, 1 << 20, 1 << 20).iter().all(Option::is_none), "{kind}: zeros kept");
    }
    let (n1, n2) = (d.join("whole-nosum1"), d.join("whole-nosum2"));
    assert!(same_physical(&n1, 0, &n2, 0, 2 << 20), "{r:#}");
}

#[test]
fn btrfs_files_without_checksums_are_shared_rewritten_and_punched_on_a_nodatasum_mount() {
    both_kinds("nodatasum");
}

#[test]
fn btrfs_files_without_checksums_are_shared_rewritten_and_punched_on_a_datasum_mount() {
    both_kinds("datasum");
}

/// Fingerprints recorded without the salt (by a build before it, or by a
/// run without `CAP_SYS_ADMIN`, which cannot tell the kinds apart: here a
/// `scan` under `setpriv` without it) still pair a file with checksums and
/// one without. The run that meets the refusal says why and marks the one
/// without to be read again; the next run reads it, salts it apart, and
/// nothing fails again.
#[test]
fn btrfs_pairs_of_both_kinds_recorded_before_are_read_again_once() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let d = vol.path("d");
    std::fs::create_dir_all(&d).unwrap();
    let blob = Rng::new(4).bytes(1 << 20);
    std::fs::write(d.join("sum"), &blob).unwrap();
    free_bytes(&vol.mnt);
    vol.remount_with("nodatasum");
    std::fs::write(d.join("nosum"), &blob).unwrap();
    free_bytes(&vol.mnt);
    let before = Snapshot::take(&d);
    let no_admin = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-all"];
    dedupscan().under(no_admin).args(["scan", s(&d)]).db(vol.db()).expect(0).run();

    let first = dedupscan().args([s(&d), "--incremental"]).json().db(vol.db()).expect(1).run();
    assert_eq!(num(&first.json, "errors"), 1, "{}", first.stderr);
    assert!(first.stderr.contains("one keeps data checksums and the other not"), "{}", first.stderr);
    assert_eq!(num(&first.json, "files_stale"), 1, "{:#}", first.json);
    let next = dedupscan().args([s(&d), "--incremental"]).json().db(vol.db()).expect(0).run();
    assert_eq!(num(&next.json, "files_hashed"), 1, "{:#}", next.json);
    assert_eq!((num(&next.json, "errors"), num(&next.json, "ranges_planned")), (0, 0), "{:#}", next.json);
    before.assert_same(&Snapshot::take(&d));
}

#[test]
fn btrfs_nocow_files_hashed_with_include_nocow_are_left_by_a_later_run_without_it() {
    let Some((vol, images, _)) = nocow_store() else { return };
    dedupscan().args(["scan", s(&vol.mnt), "--include-nocow"]).db(vol.db()).expect(0).run();
    let before = Snapshot::take(&images);
    let files = ["nocowa", "nocowb", "nocowz", "whole1", "whole2"];
    let maps = || files.map(|f| physical_blocks(&images.join(f), 0, std::fs::metadata(images.join(f)).unwrap().len()));
    let (map0, free0) = (maps(), free_bytes(&vol.mnt));
    for args in [&["--dry-run"][..], &[]] {
        let r = run_json(&vol, &[&[s(&vol.mnt)][..], args].concat());
        let done = ["deduped_bytes", "rewritten_bytes", "zeros_to_holes_bytes", "errors"].map(|k| num(&r, k));
        assert_eq!(done, [0; 4], "{args:?}: {r:#}");
        assert!(r["skipped"]["nocow"].as_u64().is_some_and(|n| n >= 3), "{args:?}: {r:#}");
    }
    assert_eq!(maps(), map0, "a NOCOW file was changed without --include-nocow");
    before.assert_same(&Snapshot::take(&images));
    assert!(free_bytes(&vol.mnt) <= free0 + (64 << 10));
    // The option given again shares them.
    let r = run_json(&vol, &[s(&vol.mnt), "--include-nocow"]);
    assert!(same_physical(&images.join("whole1"), 0, &images.join("whole2"), 0, 2 << 20), "{r:#}");
}

/// NOCOW files (`chattr +C`: a VM image directory) are left alone by
/// default; `--include-nocow` shares them, with each other only (they keep
/// no data checksums), rewrites their remainders and punches their zeros
/// with unnamed files of their kind, and leaves them NOCOW.
/// A volume with a NOCOW directory `images` (made NOCOW while empty, so
/// its files keep no checksums: `write_kind`'s three files and two copies
/// of a file) and a plain directory with a third copy.
fn nocow_store() -> Option<(Volume, PathBuf, PathBuf)> {
    let vol = Volume::new(Fs::Btrfs, 512)?;
    let (images, plain) = (vol.path("images"), vol.path("plain"));
    std::fs::create_dir_all(&images).unwrap();
    std::fs::create_dir_all(&plain).unwrap();
    // Files made in a NOCOW directory are NOCOW, without checksums.
    sh(std::process::Command::new("chattr").arg("+C").arg(&images));
    write_kind(&images, "nocow", 1);
    let whole = Rng::new(3).bytes(2 << 20);
    for (dir, name) in [(&images, "whole1"), (&images, "whole2"), (&plain, "whole")] {
        std::fs::write(dir.join(name), &whole).unwrap();
    }
    assert!(is_nocow(&images.join("whole1")) && !is_nocow(&plain.join("whole")));
    Some((vol, images, plain))
}

/// Whether `lsattr` shows `p` NOCOW.
fn is_nocow(p: &Path) -> bool {
    let out = std::process::Command::new("lsattr").arg(p).output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().contains('C')
}

/// A NOCOW file hashed under `--include-nocow`, and unchanged since, is
/// trusted by a later run's plan like any unchanged file (flags are read
/// when a file is hashed). A later run without the option, dry or not,
/// must still leave it alone: before, it shared the copies, rewrote the
/// near-copy's rest and punched the zeros.
#[test]
fn btrfs_nocow_files_are_shared_only_with_include_nocow() {
    let Some((vol, images, plain)) = nocow_store() else { return };
    let before = (Snapshot::take(&images), Snapshot::take(&plain));
    let maps = || physical_blocks(&images.join("nocowb"), 0, 512 << 10);
    let (map0, free0) = (maps(), free_bytes(&vol.mnt));

    let r = run_json(&vol, &[s(&vol.mnt)]);
    assert_eq!(r["skipped"]["nocow"], 5, "{r:#}");
    assert_eq!((num(&r, "deduped_bytes"), num(&r, "zeros_to_holes_bytes")), (0, 0), "{r:#}");
    assert_eq!(maps(), map0, "a NOCOW file was changed without --include-nocow");
    assert!(free_bytes(&vol.mnt) <= free0 + (64 << 10));

    let r = run_json(&vol, &[s(&vol.mnt), "--include-nocow"]);
    assert_eq!((num(&r, "errors"), num(&r, "pinned_bytes")), (0, 0), "{r:#}");
    assert!(r["skipped"].get("nocow").is_none(), "{r:#}");
    before.0.assert_same(&Snapshot::take(&images));
    before.1.assert_same(&Snapshot::take(&plain));
    let (a, b) = (images.join("nocowa"), images.join("nocowb"));
    assert!(same_physical(&a, 8192, &b, 8192, (512 << 10) - 8192), "{r:#}");
    assert!(num(&r, "rewritten_bytes") >= 500 << 10, "{r:#}");
    assert!(physical_blocks(&images.join("nocowz"), 1 << 20, 1 << 20).iter().all(Option::is_none), "zeros kept");
    assert!(same_physical(&images.join("whole1"), 0, &images.join("whole2"), 0, 2 << 20), "{r:#}");
    assert!(!same_physical(&images.join("whole1"), 0, &plain.join("whole"), 0, 4096), "kinds mixed");
    for f in ["nocowa", "nocowb", "nocowz", "whole1", "whole2"] {
        assert!(is_nocow(&images.join(f)), "{f} is no longer NOCOW");
    }
}
