//! Written zero blocks become holes (`dedupe::zeros`): a thick file's
//! zeros are freed, its bytes, size, mode and times unchanged; what must
//! stay allocated stays: preallocated (`fallocate`) space, zeros in an
//! extent a reflink also holds with data in it (btrfs; XFS frees block by
//! block; zeros reflinks share are freed when every holder is in the run:
//! each lets go and the last frees them), a `user.nodedup` file, zero runs
//! shorter than 64 KiB, and
//! everything with `--keep-zeros`. A dry run predicts the bytes and changes
//! nothing. On the builds before, nothing was freed (the map gives zeros
//! fingerprint 0, never grouped).

mod common;

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::Command;

use common::*;
use dedupscan::corpus::Rng;

const MIB: u64 = 1 << 20;

/// Bytes allocated to `p` (`st_blocks`).
fn allocated(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

/// A file of `mib` MiB of written zeros, flushed, then `header` written
/// over its start (on btrfs a separate extent, as when an image made with
/// `dd` is filled later) and a 32 KiB burst of data in its middle.
fn thick(p: &Path, mib: u64, header: &[u8]) {
    std::fs::write(p, vec![0u8; (mib * MIB) as usize]).unwrap();
    dedupscan::sys::syncfs(std::fs::File::open(p).unwrap()).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.write_all_at(header, 0).unwrap();
    f.write_all_at(&header[..32 * 1024], mib * MIB / 2).unwrap();
    f.sync_all().unwrap();
}

fn zeros(fs: Fs) {
    let Some(vol) = Volume::new(fs, 512) else { return };
    let d = vol.path("z");
    std::fs::create_dir(&d).unwrap();
    let header = Rng::new(21).bytes(MIB as usize);
    // Two thick files; zeros a reflink also holds; preallocated space; a
    // file marked nodedup; 16 KiB zero gaps between data (under 64 KiB).
    thick(&d.join("thick1"), 48, &header);
    thick(&d.join("thick2"), 32, &header[1..]);
    // Written in one pass: on btrfs its header and zeros share one extent,
    // freed only once the header is rewritten elsewhere.
    let mut onepass = header[4..].to_vec();
    onepass.resize(16 * MIB as usize, 0);
    std::fs::write(d.join("onepass"), &onepass).unwrap();
    // Reflinked pairs: zeros in extents of their own; zeros and data
    // written in one pass, in one extent on btrfs.
    thick(&d.join("cloned"), 16, &header[2..]);
    let mut mixed = header[5..].to_vec();
    mixed.resize(16 * MIB as usize, 0);
    std::fs::write(d.join("mixed"), &mixed).unwrap();
    for (from, to) in [("cloned", "clone"), ("mixed", "mixed2")] {
        sh(Command::new("cp").arg("--reflink=always").arg(d.join(from)).arg(d.join(to)));
    }
    sh(Command::new("fallocate").args(["-l", "16M"]).arg(d.join("prealloc")));
    thick(&d.join("private"), 16, &header[3..]);
    set_nodedup(&d.join("private"));
    let mut gaps = Vec::new();
    for i in 0..64 {
        gaps.extend(Rng::new(100 + i).bytes(48 * 1024));
        gaps.extend(vec![0; 16 * 1024]);
    }
    std::fs::write(d.join("gaps"), &gaps).unwrap();
    dedupscan::sys::syncfs(std::fs::File::open(&d).unwrap()).unwrap();
    // A shared extent with data in it stays on btrfs (its data would have
    // to be rewritten into every holder); XFS frees block by block.
    let xfs = fs == Fs::Xfs;
    let (mixed, mixed_kept): (&[&str], &[&str]) =
        if xfs { (&["mixed", "mixed2"], &[]) } else { (&[], &["mixed", "mixed2"]) };
    let kept: Vec<_> = [mixed_kept, &["prealloc", "private", "gaps"]]
        .concat()
        .into_iter()
        .map(|n| (n, allocated(&d.join(n))))
        .collect();
    let before = Snapshot::take(&d);
    let thick = [&["thick1", "thick2", "onepass", "cloned", "clone"], mixed].concat();
    let thick_alloc: u64 = thick.iter().map(|n| allocated(&d.join(n))).sum();
    // The zeros of thick1 and thick2 around their header and burst, of
    // onepass after its header, of a reflinked pair (counted once), and on
    // XFS of the other pair.
    let expected =
        (48 + 32 - 2) * MIB - 2 * 32 * 1024 + 15 * MIB + (15 * MIB - 32 * 1024) + if xfs { 15 * MIB } else { 0 };

    // --keep-zeros, then a dry run: nothing changes.
    let keep = dedupscan().args([s(&d), "--keep-zeros", "--rehash"]).json().db(vol.db()).expect(0).run();
    assert_eq!(num(&keep.json, "zeros_to_holes_bytes"), 0, "{:#}", keep.json);
    let dry = dedupscan().args([s(&d), "--dry-run", "--rehash"]).json().db(vol.db()).expect(0).run();
    validate_report(&dry.json);
    assert_eq!(num(&dry.json, "zeros_to_holes_bytes"), expected, "{:#}", dry.json);
    assert_eq!(num(&dry.json, "zeros_to_holes_files"), thick.len() as u64, "{:#}", dry.json);
    let alloc: u64 = thick.iter().map(|n| allocated(&d.join(n))).sum();
    assert_eq!(alloc, thick_alloc, "the dry run changed something");
    before.assert_same(&Snapshot::take(&d));

    let free0 = free_bytes(&d);
    let real = dedupscan().args([s(&d), "--rehash"]).json().db(vol.db()).expect(0).run();
    let r = &real.json;
    validate_report(r);
    assert_eq!(num(r, "zeros_to_holes_bytes"), expected, "{r:#}");
    assert_eq!(num(r, "zeros_to_holes_files"), thick.len() as u64, "{r:#}");
    assert_eq!(num(r, "errors"), 0, "{r:#}");
    before.assert_same(&Snapshot::take(&d));
    let freed = free_bytes(&d) - free0;
    assert!(freed >= expected - 2 * MIB, "statfs: freed {freed} of {expected}: {r:#}");
    if fs == Fs::Btrfs {
        // onepass's header, moved out of the extent its zeros shared.
        assert!(num(r, "rewritten_bytes") >= MIB, "{r:#}");
        assert_eq!(num(r, "rewritten_bytes"), num(&dry.json, "rewritten_bytes"), "{r:#}");
    }
    let mut holed = vec![("thick1", 48, true), ("thick2", 32, true), ("onepass", 16, false)];
    holed.extend([("cloned", 16, true), ("clone", 16, true)]);
    if xfs {
        holed.extend([("mixed", 16, false), ("mixed2", 16, false)]);
    }
    for (n, mib, burst) in holed {
        let a = allocated(&d.join(n));
        assert!(a <= 2 * MIB, "{n}: {a} bytes still allocated of {mib} MiB");
        // The header and the burst are data, the rest holes.
        let map = physical_blocks(&d.join(n), 0, mib * MIB);
        let mid = (mib * MIB / 2 / 4096) as usize;
        assert!(map[0].is_some() && map[mid].is_some() == burst, "{n}: data unmapped or zeros mapped");
        assert!(map[(MIB / 4096) as usize + 1].is_none(), "{n}: zeros still mapped");
    }
    for (n, a) in kept {
        assert_eq!(allocated(&d.join(n)), a, "{n}: allocation changed: {r:#}");
    }
    // Nothing left for a rerun.
    let again = dedupscan().args([s(&d), "--rehash"]).json().db(vol.db()).expect(0).run();
    assert_eq!(num(&again.json, "zeros_to_holes_bytes"), 0, "{:#}", again.json);
    before.assert_same(&Snapshot::take(&d));
}

#[test]
fn xfs_written_zeros_become_holes() {
    zeros(Fs::Xfs);
}

#[test]
fn btrfs_written_zeros_become_holes() {
    zeros(Fs::Btrfs);
}

/// btrfs: an image whose zeros were written first (in extents of their
/// own), its reflinked clone then written in place in a few blocks, two of
/// them 36 KiB apart: the clone's zero runs around them are split, one
/// piece shorter than a run. Every holder is in the run, so each lets go
/// of the shared zero extent, the short piece too (compared with zeros by
/// the kernel), and the extent is freed, the parts the header and the
/// burst overwrote with it. Before, shared extents stayed: nothing freed.
#[test]
fn btrfs_zeros_a_clone_written_in_place_shares_are_freed() {
    let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
    let d = vol.path("vm");
    std::fs::create_dir(&d).unwrap();
    thick(&d.join("image"), 16, &Rng::new(6).bytes(MIB as usize));
    sh(Command::new("cp").arg("--reflink=always").arg(d.join("image")).arg(d.join("clone")));
    let f = std::fs::OpenOptions::new().write(true).open(d.join("clone")).unwrap();
    for at in [4 * MIB, 4 * MIB + 40 * 1024, 12 * MIB] {
        f.write_all_at(&Rng::new(at).bytes(4096), at).unwrap();
    }
    f.sync_all().unwrap();
    dedupscan::sys::syncfs(std::fs::File::open(&d).unwrap()).unwrap();
    let before = Snapshot::take(&d);
    let free0 = free_bytes(&vol.mnt);
    // The preview first: it counts the shared zeros once, by disk space,
    // as the run's last holder does (but for the blocks the clone wrote).
    let dry = run_json(&vol, &[s(&d), "--dry-run"]);
    let r = run_json(&vol, &[s(&d)]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    assert!(freed >= 15 * MIB as i64, "freed {freed}: {r:#}");
    assert_eq!((num(&r, "zeros_to_holes_files"), num(&r, "errors")), (2, 0), "{r:#}");
    assert!(num(&r, "zeros_to_holes_bytes") >= 14 * MIB, "{r:#}");
    assert!(num(&r, "rewritten_bytes") <= 64 * 1024, "{r:#}");
    let (previewed, punched) = (num(&dry, "zeros_to_holes_bytes"), num(&r, "zeros_to_holes_bytes"));
    assert!(previewed.abs_diff(punched) <= 64 * 1024, "previewed {previewed}, punched {punched}");
    assert_eq!(num(&dry, "zeros_to_holes_files"), 2, "{dry:#}");
    before.assert_same(&Snapshot::take(&d));
    for n in ["image", "clone"] {
        let map = physical_blocks(&d.join(n), 0, 16 * MIB);
        assert!(map[(2 * MIB / 4096) as usize].is_none(), "{n}: zeros still mapped");
    }
}

/// btrfs: a reflinked pair whose extent holds zero runs with small pieces
/// of data between them (a database's pages between empty ones), written
/// in one pass. The pieces are shorter than a run, so they might have been
/// zeros split by writes in place (above); read first, they are data, the
/// extent stays whatever is punched, and the files are left as they are:
/// punching their runs would only split their items.
#[test]
fn btrfs_a_shared_extent_with_short_data_between_its_zeros_is_left() {
    let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
    let d = vol.path("db");
    std::fs::create_dir(&d).unwrap();
    let mut pages = Vec::new();
    for i in 0..16 {
        pages.extend(vec![0; MIB as usize]);
        pages.extend(Rng::new(40 + i).bytes(16 * 1024));
    }
    std::fs::write(d.join("pages"), &pages).unwrap();
    sh(Command::new("cp").arg("--reflink=always").arg(d.join("pages")).arg(d.join("copy")));
    dedupscan::sys::syncfs(std::fs::File::open(&d).unwrap()).unwrap();
    let before = Snapshot::take(&d);
    let len = pages.len() as u64;
    let maps = || ["pages", "copy"].map(|n| physical_blocks(&d.join(n), 0, len));
    let map0 = maps();
    for args in [&["--dry-run"][..], &[]] {
        let r = run_json(&vol, &[&[s(&d)][..], args].concat());
        let done = ["zeros_to_holes_files", "zeros_to_holes_bytes", "rewritten_bytes", "errors"].map(|k| num(&r, k));
        assert_eq!(done, [0; 4], "{args:?}: {r:#}");
    }
    assert_eq!(maps(), map0, "a file was changed");
    before.assert_same(&Snapshot::take(&d));
}

/// Zeros a reflinked clone outside the run also holds: it keeps them,
/// whatever the run does, and is untouched; nothing is freed or counted
/// freed. btrfs says who holds an extent, so there the files of the run
/// keep their zeros too; XFS cannot, so each holder in the run lets go (a
/// punch changes no byte; the file is sparser).
fn zeros_a_clone_outside_the_run_holds(fs: Fs) {
    let Some(vol) = Volume::new(fs, 512) else { return };
    let (d, outside) = (vol.path("in"), vol.path("outside"));
    std::fs::create_dir(&d).unwrap();
    std::fs::create_dir(&outside).unwrap();
    thick(&d.join("image"), 16, &Rng::new(5).bytes(MIB as usize));
    for to in [d.join("clone"), outside.join("clone")] {
        sh(Command::new("cp").arg("--reflink=always").arg(d.join("image")).arg(to));
    }
    dedupscan::sys::syncfs(std::fs::File::open(&d).unwrap()).unwrap();
    let (before, kept) = (Snapshot::take(&d), Snapshot::take(&outside));
    let kept_map = physical_blocks(&outside.join("clone"), 0, 16 * MIB);
    let free0 = free_bytes(&vol.mnt);
    let r = run_json(&vol, &[s(&d)]);
    assert_eq!((num(&r, "zeros_to_holes_bytes"), num(&r, "errors")), (0, 0), "{r:#}");
    let xfs = fs == Fs::Xfs;
    assert_eq!(num(&r, "zeros_to_holes_files"), if xfs { 2 } else { 0 }, "{r:#}");
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    assert!(freed < MIB as i64, "freed {freed} with the zeros held outside: {r:#}");
    before.assert_same(&Snapshot::take(&d));
    kept.assert_same(&Snapshot::take(&outside));
    assert_eq!(physical_blocks(&outside.join("clone"), 0, 16 * MIB), kept_map, "the clone outside was changed");
    for n in ["image", "clone"] {
        let map = physical_blocks(&d.join(n), 0, 16 * MIB);
        assert_eq!(map[(MIB / 4096) as usize + 1].is_none(), xfs, "{n}: zeros punched on btrfs, or kept on XFS");
    }
}

#[test]
fn xfs_zeros_a_clone_outside_the_run_holds_are_not_counted_freed() {
    zeros_a_clone_outside_the_run_holds(Fs::Xfs);
}

#[test]
fn btrfs_zeros_a_clone_outside_the_run_holds_are_left() {
    zeros_a_clone_outside_the_run_holds(Fs::Btrfs);
}

/// On btrfs, zeros written in one extent with data are freed only once the
/// data is rewritten elsewhere: a copy, within `--keep-free`
/// (`dedupe/headroom.rs`). With no room above the reserve the zeros stay
/// and say so once, not as an error, while zeros in extents of their own
/// still become holes; they are left pending (`zeros_keep_free`), so the
/// next run frees them once there is room, an incremental one included
/// (which used to find nothing new, leaving them to the weekly full plan).
#[test]
fn btrfs_zeros_that_need_a_rewrite_wait_for_room_above_keep_free() {
    let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
    let d = vol.path("z");
    std::fs::create_dir(&d).unwrap();
    let header = Rng::new(22).bytes(MIB as usize);
    let mut onepass = header.clone();
    onepass.resize(16 * MIB as usize, 0);
    std::fs::write(d.join("onepass"), &onepass).unwrap();
    thick(&d.join("thick"), 16, &header[1..]);
    dedupscan::sys::syncfs(std::fs::File::open(&d).unwrap()).unwrap();
    let before = Snapshot::take(&d);

    let preview = dedupscan().args([s(&d), "--keep-free", "100%", "--dry-run"]).json().db(vol.db()).expect(0).run();
    before.assert_same(&Snapshot::take(&d));
    let full = dedupscan().args([s(&d), "--keep-free", "100%"]).json().db(vol.db()).expect(0).run();
    let r = &full.json;
    // The preview counts the copies against the same budget.
    assert_eq!(num(&preview.json, "zeros_to_holes_bytes"), num(r, "zeros_to_holes_bytes"), "{:#}", preview.json);
    validate_report(r);
    // thick's zeros around its header and burst; of onepass's, at most
    // those in extents without its header (writeback may cut it in two).
    let first = num(r, "zeros_to_holes_bytes");
    let thick_zeros = 15 * MIB - 32 * 1024;
    assert!((thick_zeros..thick_zeros + 14 * MIB).contains(&first), "{r:#}");
    assert_eq!((num(r, "rewritten_bytes"), num(r, "errors")), (0, 0), "{r:#}");
    assert_eq!(full.stderr.matches("--keep-free").count(), 1, "{}", full.stderr);
    assert!(allocated(&d.join("onepass")) > 2 * MIB, "onepass: its header's extent was freed without a copy");
    before.assert_same(&Snapshot::take(&d));
    let waiting = &r["pending"]["zeros_keep_free"];
    assert_eq!(waiting["files"].as_u64(), Some(1), "{r:#}");
    assert_eq!(num(waiting, "bytes"), thick_zeros + 15 * MIB - first, "{r:#}");
    assert_eq!(preview.json["pending"], r["pending"], "{:#}", preview.json);

    // Still no room: tried again, still waiting, said once.
    let again = dedupscan().args([s(&d), "--keep-free", "100%", "--incremental"]).json().db(vol.db()).expect(0).run();
    assert_eq!(num(&again.json, "zeros_to_holes_bytes"), 0, "{:#}", again.json);
    assert_eq!(again.json["pending"], r["pending"], "{:#}", again.json);
    // Room: the next incremental run frees them and leaves nothing pending.
    let r = run_json(&vol, &[s(&d), "--incremental"]);
    assert_eq!(first + num(&r, "zeros_to_holes_bytes"), thick_zeros + 15 * MIB, "{r:#}");
    assert!(num(&r, "rewritten_bytes") >= MIB, "{r:#}");
    assert_eq!(num(&r, "pending_bytes"), 0, "{r:#}");
    assert!(allocated(&d.join("onepass")) <= 2 * MIB);
    before.assert_same(&Snapshot::take(&d));

    // A file left waiting, then removed: no longer pending, though the run
    // after plans nothing (its rows were only dropped by a run that shares).
    let mut gone = Rng::new(23).bytes(MIB as usize);
    gone.resize(16 * MIB as usize, 0);
    std::fs::write(d.join("gone"), &gone).unwrap();
    let keep = ["--keep-free", "100%", "--incremental"];
    let r = dedupscan().arg(&d).args(keep).json().db(vol.db()).expect(0).run().json;
    assert_eq!(r["pending"]["zeros_keep_free"]["files"].as_u64(), Some(1), "{r:#}");
    std::fs::remove_file(d.join("gone")).unwrap();
    let r = dedupscan().arg(&d).args(keep).json().db(vol.db()).expect(0).run().json;
    assert_eq!((num(&r, "pending_bytes"), num(&r, "files_removed")), (0, 1), "{r:#}");
    assert_eq!(num(&db_report(&vol), "pending_bytes"), 0);
}

/// A thick image written in one pass, data and zeros in the same
/// extents, then changed in place (a running VM): each 128 MiB extent is
/// split into stretches FIEMAP shows apart. Judged stretch by stretch, the
/// zeros were punched in stretches of extents the data stretches kept, and
/// data was rewritten out of them, for nothing: the volume had more in use
/// after the pass than before. Judged by the extent on disk, its data is
/// rewritten and the extent freed whole.
#[test]
fn btrfs_frees_the_zeros_of_a_thick_image_changed_in_place() {
    let Some(vol) = Volume::new(Fs::Btrfs, 1024) else { return };
    let d = vol.path("vm");
    std::fs::create_dir(&d).unwrap();
    let img = d.join("disk.img");
    let mut rng = Rng::new(61);
    // 256 MiB: 1 MiB of data, 3 MiB of zeros, over and over.
    let mut bytes = Vec::with_capacity((256 * MIB) as usize);
    for _ in 0..64 {
        bytes.extend(rng.bytes(MIB as usize));
        bytes.resize(bytes.len() + 3 * MIB as usize, 0);
    }
    let f = std::fs::File::create(&img).unwrap();
    f.write_all_at(&bytes, 0).unwrap();
    f.sync_all().unwrap();
    // 1% of the blocks written again in place, at random.
    for _ in 0..(256 * MIB / 4096 / 100) {
        let at = rng.below(256 * MIB / 4096) * 4096;
        f.write_all_at(&rng.bytes(4096), at).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    assert!(extents(&img) > 500, "the image's extents must be split: {}", extents(&img));
    let zero_bytes = ideal_zero_bytes(&img);
    let before = Snapshot::take(&d);

    let free0 = free_bytes(&vol.mnt);
    let r = run_json(&vol, &[s(&d)]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    before.assert_same(&Snapshot::take(&d));
    assert!(num(&r, "zeros_to_holes_bytes") >= zero_bytes * 95 / 100, "{r:#}");
    assert!(freed >= zero_bytes as i64 * 95 / 100, "freed {freed} of {zero_bytes} zero bytes: {r:#}");
    // The image holds its data only (and zero runs under 64 KiB).
    assert!(allocated(&img) <= 256 * MIB - zero_bytes * 95 / 100, "{} allocated", allocated(&img));
    let again = run_json(&vol, &[s(&d)]);
    assert_eq!(num(&again, "zeros_to_holes_bytes") + num(&again, "rewritten_bytes"), 0, "{again:#}");
}

/// Bytes of whole 4 KiB blocks of zeros in `p`.
fn ideal_zero_bytes(p: &Path) -> u64 {
    let data = std::fs::read(p).unwrap();
    data.chunks_exact(4096).filter(|b| b.iter().all(|&x| x == 0)).count() as u64 * 4096
}

/// A thick image and a written copy of it (btrfs): the copy's data is
/// shared from the image, and the rest of its extents (its zeros, never
/// grouped) is a remainder to rewrite. The zeros were copied, then
/// punched by the zero pass: as much written again as the image has zeros,
/// for nothing. They are left as holes in the copy now, so sharing it back
/// punches them; a dry run counts them so; `--keep-zeros` copies them.
#[test]
fn btrfs_zeros_in_a_remainder_are_not_copied() {
    let mut rng = Rng::new(71);
    let mut image = Vec::new();
    for _ in 0..16 {
        image.extend(rng.bytes(MIB as usize));
        image.resize(image.len() + MIB as usize, 0);
    }
    let mut copy = image.clone();
    copy[4096..8192].copy_from_slice(&rng.bytes(4096));
    let zeros = 16 * MIB;
    let mut freed_by = Vec::new();
    for args in [&["--dry-run"][..], &[], &["--keep-zeros"]] {
        let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
        let d = vol.path("vm");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("golden.img"), &image).unwrap();
        std::fs::write(d.join("copy.img"), &copy).unwrap();
        let before = Snapshot::take(&d);
        let free0 = free_bytes(&vol.mnt);
        let r = run_json(&vol, &[&[s(&d)][..], args].concat());
        freed_by.push(free_bytes(&vol.mnt) as i64 - free0 as i64);
        before.assert_same(&Snapshot::take(&d));
        let (rewritten, holed) = (num(&r, "rewritten_bytes"), num(&r, "zeros_to_holes_bytes"));
        match args {
            ["--keep-zeros"] => {
                // Copied, and kept: written zeros stay written.
                assert!(rewritten >= zeros && holed == 0, "{r:#}");
                let z = physical_blocks(&d.join("copy.img"), MIB, MIB);
                assert!(z.iter().all(Option::is_some), "--keep-zeros punched zeros");
            }
            ["--dry-run"] => {
                // The copy's zeros as holes, not copies (the image's zeros
                // and data count too: a dry run cannot tell that sharing
                // will leave the image's extents shared, which the zero
                // pass then leaves alone).
                assert!(holed >= zeros && rewritten <= zeros + (64 << 10), "{r:#}");
            }
            _ => {
                // Only the changed block is copied; the copy's zeros are
                // holes.
                assert!(rewritten <= 64 << 10 && holed == zeros, "{r:#}");
                let z = physical_blocks(&d.join("copy.img"), MIB, MIB);
                assert!(z.iter().all(Option::is_none), "zeros kept");
            }
        }
        assert_eq!(num(&r, "errors"), 0, "{r:#}");
    }
    // The run frees the copy's data and zeros; --keep-zeros its data only.
    assert!(freed_by[1] >= (32 * MIB) as i64 * 95 / 100, "{freed_by:?}");
    assert!(freed_by[2] >= 16 * MIB as i64 * 95 / 100, "{freed_by:?}");
}
