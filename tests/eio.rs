//! A disk that cannot read a block: a bad sector, or on btrfs a block that
//! fails its checksum (made here by overwriting one data block in the image
//! while it is unmounted; reading it then fails with EIO). The run names the
//! file and the reason, counts it, exits 1, changes no byte, and shares
//! everything else, the damaged file's good copies with each other too.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use common::*;
use dedupscan::corpus::Rng;

const MIB: u64 = 1 << 20;

/// Physical addresses of a file's blocks ([`physical_blocks`]).
type Blocks = Vec<Option<u64>>;

/// A btrfs volume holding `a` (8 MiB) and its copies `b` and `f`, made in
/// that order (the planner ranks copies by inode: `a` is the source), and
/// a pair `c`, `e` of 4 MiB; with the two contents.
fn volume() -> Option<(Volume, Vec<u8>, Vec<u8>)> {
    let vol = Volume::new(Fs::Btrfs, 256)?;
    let (data, pair) = (Rng::new(31).bytes(8 * MIB as usize), Rng::new(32).bytes(4 * MIB as usize));
    for (name, bytes) in [("a", &data), ("b", &data), ("f", &data), ("c", &pair), ("e", &pair)] {
        std::fs::write(vol.path(name), bytes).unwrap();
    }
    btrfs(&["filesystem", "sync"], &vol.mnt);
    Some((vol, data, pair))
}

/// Overwrite the 4 KiB block at `off` of file `name` on the unmounted
/// image, so that reading it fails its checksum; check that it does.
fn damage(vol: &Volume, name: &str, off: u64) {
    let logical = physical_blocks(&vol.path(name), off, 4096)[0].expect("a data block");
    vol.remount_after(|img: &Path| {
        let out = Command::new("btrfs-map-logical").args(["-l", &logical.to_string()]).arg(img).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let physical: u64 = text
            .split_whitespace()
            .skip_while(|w| *w != "physical")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("btrfs-map-logical: {text}{}", String::from_utf8_lossy(&out.stderr)));
        let f = OpenOptions::new().write(true).open(img).unwrap();
        f.write_all_at(&[0xa5; 4096], physical).unwrap();
        f.sync_all().unwrap();
    });
    let e = std::fs::read(vol.path(name)).expect_err("the damaged block still reads");
    assert_eq!(e.raw_os_error(), Some(nix::errno::Errno::EIO as i32), "{e}");
}

/// [`volume`], scanned, then `name` damaged at `off`: the run trusts the
/// fingerprints, and the kernel's compare meets the bad block. Also the
/// damaged file's blocks.
fn damaged_after_scan(name: &str, off: u64) -> Option<(Volume, Vec<u8>, Vec<u8>, Blocks)> {
    let (vol, data, pair) = volume()?;
    dedupscan().arg("scan").arg(&vol.mnt).db(vol.db()).expect(0).run();
    damage(&vol, name, off);
    let blocks = physical_blocks(&vol.path(name), 0, 8 * MIB);
    Some((vol, data, pair, blocks))
}

/// The undamaged files hold what was written, and `a` still fails.
fn contents_kept(vol: &Volume, data: &[u8], pair: &[u8]) {
    for (name, bytes) in [("b", data), ("f", data), ("c", pair), ("e", pair)] {
        assert!(std::fs::read(vol.path(name)).unwrap() == bytes, "{name} changed");
    }
    assert!(std::fs::read(vol.path("a")).is_err(), "a reads again");
}

/// The copies of `a` are shared with each other, the pair too, and `a`'s
/// blocks (`a_blocks` before the run) are where they were, shared with
/// nothing.
fn shared_but_a(vol: &Volume, a_blocks: &[Option<u64>]) {
    let p = |n| vol.path(n);
    assert!(same_physical(&p("b"), 0, &p("f"), 0, 8 * MIB), "the copies of a are not shared");
    assert!(same_physical(&p("c"), 0, &p("e"), 0, 4 * MIB), "the pair is not shared");
    assert_eq!(physical_blocks(&p("a"), 0, 8 * MIB), a_blocks, "a moved");
    assert_eq!(shared_bytes(&p("a")), 0, "a shares its extent");
}

#[test]
fn btrfs_a_file_unreadable_when_hashed_is_named_and_everything_else_is_shared() {
    let Some((vol, data, pair)) = volume() else { return };
    damage(&vol, "a", MIB);
    let a_blocks = physical_blocks(&vol.path("a"), 0, 8 * MIB);
    let free = free_bytes(&vol.mnt);

    let out = dedupscan().arg(&vol.mnt).json().db(vol.db()).expect(1).run();
    validate_report(&out.json);
    let r = &out.json;
    let named = format!(
        "{}: read: Input/output error (os error 5); left out, tried again next run; the disk may be failing",
        vol.path("a").display()
    );
    assert!(out.stderr.contains(&named), "no `{named}` in: {}", out.stderr);
    assert_eq!((num(r, "files_failed"), num(r, "files_hashed"), num(r, "errors")), (1, 4, 1), "{r:#}");
    assert_eq!(r["error_kinds"]["read"].as_u64(), Some(1), "{r:#}");
    assert_eq!(num(r, "deduped_bytes"), 12 * MIB, "{r:#}");
    contents_kept(&vol, &data, &pair);
    shared_but_a(&vol, &a_blocks);
    let freed = free_bytes(&vol.mnt) - free;
    assert!(freed >= 12 * MIB - MIB / 2, "freed {freed}");

    // Tried again by the next run, and named again: not forgotten.
    let again = dedupscan().arg(&vol.mnt).json().db(vol.db()).expect(1).run();
    assert!(again.stderr.contains(&named), "no `{named}` in: {}", again.stderr);
    assert_eq!(num(&again.json, "files_failed"), 1, "{:#}", again.json);
}

#[test]
fn btrfs_a_source_unreadable_when_shared_leaves_its_copies_to_share_with_each_other() {
    let Some((vol, data, pair, a_blocks)) = damaged_after_scan("a", 5 * MIB) else { return };
    let warning = format!(
        "{}: cannot be read (Input/output error (os error 5)); not used as a source, its 2 copies are shared \
         with each other instead",
        vol.path("a").display()
    );

    // The preview reads both sides itself and finds the same.
    let dry = dedupscan().arg(&vol.mnt).arg("--dry-run").json().db(vol.db()).expect(1).run();
    assert!(dry.stderr.contains(&warning), "no `{warning}` in: {}", dry.stderr);
    assert_eq!(num(&dry.json, "duplicate_bytes"), 12 * MIB, "{:#}", dry.json);
    assert_eq!(dry.json["dedupe_status"]["errors"]["read"].as_u64(), Some(1), "{:#}", dry.json);
    assert!(!same_physical(&vol.path("b"), 0, &vol.path("f"), 0, 8 * MIB), "a dry run shared");

    let free = free_bytes(&vol.mnt);
    let out = dedupscan().arg(&vol.mnt).json().db(vol.db()).expect(1).run();
    validate_report(&out.json);
    let r = &out.json;
    assert!(out.stderr.contains(&warning), "no `{warning}` in: {}", out.stderr);
    assert!(!out.stderr.contains("refused"), "a copy blamed: {}", out.stderr);
    assert_eq!(num(r, "deduped_bytes"), 12 * MIB, "{r:#}");
    assert_eq!(r["dedupe_status"]["errors"]["EIO"].as_u64(), Some(1), "{r:#}");
    contents_kept(&vol, &data, &pair);
    shared_but_a(&vol, &a_blocks);
    let freed = free_bytes(&vol.mnt) - free;
    assert!(freed >= 12 * MIB - MIB / 2, "freed {freed}");

    // Planned again (a full plan), the copies are found shared already:
    // nothing is submitted or read twice.
    let again = dedupscan().arg(&vol.mnt).arg("--rehash").json().db(vol.db()).expect(1).run();
    assert_eq!(num(&again.json, "deduped_bytes"), 0, "{:#}", again.json);
    contents_kept(&vol, &data, &pair);
}

#[test]
fn btrfs_a_copy_unreadable_when_shared_is_named_and_left_as_it_is() {
    let Some((vol, data, pair, f_blocks)) = damaged_after_scan("f", 2 * MIB) else { return };

    let out = dedupscan().arg(&vol.mnt).json().db(vol.db()).expect(1).run();
    let r = &out.json;
    let named = format!("{}: cannot be read (Input/output error (os error 5)); not shared", vol.path("f").display());
    assert!(out.stderr.contains(&named), "no `{named}` in: {}", out.stderr);
    assert!(!out.stderr.contains(&format!("{}:", vol.path("a").display())), "the source blamed: {}", out.stderr);
    assert_eq!(num(r, "deduped_bytes"), 12 * MIB, "{r:#}");
    assert_eq!(r["dedupe_status"]["errors"]["EIO"].as_u64(), Some(1), "{r:#}");
    let p = |n| vol.path(n);
    assert!(same_physical(&p("a"), 0, &p("b"), 0, 8 * MIB) && same_physical(&p("c"), 0, &p("e"), 0, 4 * MIB));
    assert_eq!(physical_blocks(&p("f"), 0, 8 * MIB), f_blocks, "f moved");
    assert!(std::fs::read(p("f")).is_err(), "f reads again");
    for (name, bytes) in [("a", &data), ("b", &data), ("c", &pair), ("e", &pair)] {
        assert!(std::fs::read(p(name)).unwrap() == *bytes, "{name} changed");
    }
}
