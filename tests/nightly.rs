//! Nightly runs that meet new copies of data an earlier run shared.

mod common;

use common::*;
use dedupscan::corpus::Rng;

const MIB: usize = 1 << 20;

/// The next default run over `data`: its report and what it freed
/// (statfs), checked to have changed no file and met no error.
fn night(vol: &Volume, data: &std::path::Path) -> (serde_json::Value, i64) {
    let before = Snapshot::take(data);
    let free = free_bytes(data);
    let night = run_json(vol, &[s(data)]);
    let freed = free_bytes(data) as i64 - free as i64;
    before.assert_same(&Snapshot::take(data));
    assert_eq!(num(&night, "errors"), 0, "{night:#}");
    (night, freed)
}

/// A disk image whose first MiB is a file of a tree (and of its copy
/// beside it), shared by a first run; then a new copy of the image,
/// changed in a few blocks and one MiB longer, shared by a nightly run.
///
/// The first run shares the tree's files from the image (their blocks
/// then lie in the image's extent). Sharing changes no time, so the
/// nightly run does not hash the image or the tree again, and their
/// recorded runs still say they share nothing. Without the record of the
/// sources (`sources` table), the new copy, larger, was taken as the
/// source and the image as a destination, whose extent the tree's copy
/// (a whole-file copy, outside the batch) keeps: on btrfs nothing freed
/// and the image left pending `referenced_outside_run`; on XFS the
/// tree's MiB stayed stored twice.
fn a_new_copy_of_data_shared_before_is_shared_into(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let data = vol.path("data");
    let mut rng = Rng::new(51);
    let (file, own) = (rng.bytes(MIB), rng.bytes(3 * MIB));
    for p in ["tree/a.bin", "tree/copy/a.bin"] {
        std::fs::create_dir_all(data.join(p).parent().unwrap()).unwrap();
        std::fs::write(data.join(p), &file).unwrap();
    }
    let image = [file.as_slice(), own.as_slice()].concat();
    std::fs::create_dir_all(data.join("img")).unwrap();
    std::fs::write(data.join("img/disk.img"), &image).unwrap();
    let first = run_json(&vol, &[s(&data)]);
    assert_eq!(num(&first, "errors"), 0, "{first:#}");
    assert!(same_physical(&data.join("tree/a.bin"), 0, &data.join("img/disk.img"), 0, MIB as u64), "{first:#}");

    // The new copy: eight blocks changed in the image's own part, one MiB more.
    let mut copy = image.clone();
    for k in 0..8 {
        let at = 2 * MIB + k * 64 * 4096;
        copy[at..at + 4096].copy_from_slice(&rng.bytes(4096));
    }
    copy.extend(rng.bytes(MIB));
    std::fs::create_dir_all(data.join("new")).unwrap();
    std::fs::write(data.join("new/disk-copy.img"), &copy).unwrap();
    let (night, freed) = night(&vol, &data);
    assert!(night["pending"].as_object().unwrap().is_empty(), "nothing left pending: {night:#}");
    // Every block the copy has in common with the image now lies in the
    // image's extents: the copy is the destination.
    let (img, new) = (data.join("img/disk.img"), data.join("new/disk-copy.img"));
    let same = 4 * MIB as u64 - 8 * 4096;
    assert!(same_physical(&img, 0, &new, 0, 2 * MIB as u64), "{night:#}");
    let common = physical_blocks(&new, 0, 4 * MIB as u64)
        .iter()
        .zip(physical_blocks(&img, 0, 4 * MIB as u64))
        .filter(|(a, b)| a.is_some() && **a == *b)
        .count() as u64;
    assert_eq!(common * 4096, same, "{night:#}");
    assert!(freed >= same as i64 - MIB as i64 / 4, "freed {freed} of {same} (statfs): {night:#}");
}

#[test]
fn btrfs_a_new_copy_of_data_shared_before_is_shared_into() {
    a_new_copy_of_data_shared_before_is_shared_into(Fs::Btrfs);
}

#[test]
fn xfs_a_new_copy_of_data_shared_before_is_shared_into() {
    a_new_copy_of_data_shared_before_is_shared_into(Fs::Xfs);
}

/// Four copies of a file on the night two of them are new: one, moved in,
/// has a lower inode number than the copy the first run shared from.
///
/// The planner takes the copy an earlier run shared from first
/// (`sources`), and a group of more than three copies is planned with
/// its first two, the others following the second's ranges. Ranked by
/// inode alone there, the copy shared from was the followers' template:
/// it has no ranges (it is the source), and the new copy following it was
/// never shared (backup generations on XFS: 7 MiB left stored twice).
fn copies_beyond_the_third_follow_a_copy_that_has_ranges(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let (data, aside) = (vol.path("data"), vol.path("aside"));
    let body = Rng::new(52).bytes(64 * 4096);
    std::fs::create_dir_all(&aside).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    // Made first: the lowest inode number of the four.
    std::fs::write(aside.join("c.bin"), &body).unwrap();
    for name in ["a.bin", "b.bin"] {
        std::fs::write(data.join(name), &body).unwrap();
    }
    let first = run_json(&vol, &[s(&data)]);
    assert!(same_physical(&data.join("a.bin"), 0, &data.join("b.bin"), 0, body.len() as u64), "{first:#}");

    std::fs::rename(aside.join("c.bin"), data.join("c.bin")).unwrap();
    std::fs::write(data.join("d.bin"), &body).unwrap();
    let (night, freed) = night(&vol, &data);
    for name in ["b.bin", "c.bin", "d.bin"] {
        let shared = same_physical(&data.join("a.bin"), 0, &data.join(name), 0, body.len() as u64);
        assert!(shared, "{name} shares a.bin's blocks: {night:#}");
    }
    assert!(freed >= 2 * body.len() as i64, "freed {freed} (statfs): {night:#}");
}

#[test]
fn btrfs_copies_beyond_the_third_follow_a_copy_that_has_ranges() {
    copies_beyond_the_third_follow_a_copy_that_has_ranges(Fs::Btrfs);
}

#[test]
fn xfs_copies_beyond_the_third_follow_a_copy_that_has_ranges() {
    copies_beyond_the_third_follow_a_copy_that_has_ranges(Fs::Xfs);
}

/// Write `parts` one after another into a new file at `path`, each flushed
/// to disk before the next, so that each lies in an extent of its own.
fn write_in_extents(path: &std::path::Path, parts: &[&[u8]]) {
    use std::io::Write;
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut f = std::fs::File::create(path).unwrap();
    for p in parts {
        f.write_all(p).unwrap();
        f.sync_all().unwrap();
    }
}

/// A tarball a first run shared a tree's file from, then an image with
/// the same file inside (larger, with blocks of its own) on the next night.
///
/// The tarball stays on disk (its own blocks) and is held (the first run
/// shared from it), and so does the image: the planner's rule of what
/// stays ranked the two alike and took the larger image as the source.
/// The tarball, a destination whose extent stays, and the tree's file,
/// lying in it, then freed nothing, and the image's copy stayed stored
/// twice (on btrfs; XFS frees the tarball's blocks either way). The
/// night's other files (an image made of files found elsewhere) make that
/// rule the one chosen. The image's copy is written as an extent of its
/// own, so that sharing into it frees it on btrfs too.
fn a_file_shared_from_a_tarball_is_shared_from_it_into_a_new_image(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let data = vol.path("data");
    let mut rng = Rng::new(53);
    let y = rng.bytes(MIB);
    write_in_extents(&data.join("tar/t.tar"), &[&[rng.bytes(2 * MIB), y.clone(), rng.bytes(3 * MIB)].concat()]);
    write_in_extents(&data.join("tree/y.bin"), &[&y]);
    let first = run_json(&vol, &[s(&data)]);
    assert!(
        same_physical(&data.join("tree/y.bin"), 0, &data.join("tar/t.tar"), 2 * MIB as u64, MIB as u64),
        "{first:#}"
    );

    write_in_extents(&data.join("img/j.img"), &[&rng.bytes(4 * MIB), &y, &rng.bytes(4 * MIB)]);
    let (x2, g) = (rng.bytes(64 << 10), rng.bytes(MIB));
    write_in_extents(&data.join("tar2/t2.tar"), &[&[rng.bytes(2 * MIB), x2.clone(), rng.bytes(2 * MIB)].concat()]);
    write_in_extents(&data.join("tree2/x2.bin"), &[&x2]);
    write_in_extents(&data.join("tree2/g.bin"), &[&g]);
    write_in_extents(&data.join("img2/i.img"), &[&[rng.bytes(4096), x2, g].concat()]);
    let (night, freed) = night(&vol, &data);
    assert!(night["pending"].as_object().unwrap().is_empty(), "nothing left pending: {night:#}");
    let (tar, img) = (data.join("tar/t.tar"), data.join("img/j.img"));
    assert!(same_physical(&img, 4 * MIB as u64, &tar, 2 * MIB as u64, MIB as u64), "{night:#}");
    let expected = 2 * MIB as i64 + (64 << 10);
    assert!(freed >= expected - MIB as i64 / 4, "freed {freed} of {expected} (statfs): {night:#}");
}

#[test]
fn btrfs_a_file_shared_from_a_tarball_is_shared_from_it_into_a_new_image() {
    a_file_shared_from_a_tarball_is_shared_from_it_into_a_new_image(Fs::Btrfs);
}

#[test]
fn xfs_a_file_shared_from_a_tarball_is_shared_from_it_into_a_new_image() {
    a_file_shared_from_a_tarball_is_shared_from_it_into_a_new_image(Fs::Xfs);
}

/// Eight pairs of copies that a first night shared, each from the copy
/// of lower inode (`z/`), which earlier runs had not hashed; on the next
/// night, a tarball holding all eight contents.
///
/// The copy shared from keeps extents for the other: the plan takes it
/// as the source, so the tarball's pieces are shared into it and it stays
/// where it is. It was held only when it was its group's first copy, the
/// one of lower row id, and row ids follow the order the scan hashed the
/// files in: here the other copies (`a/`, hashed by a run before) came
/// first, the tarball became the source of both copies, and a copy of
/// the same volume hashed in another order was planned otherwise (two
/// fresh copies of FULL planned 4,025 and 3,983 ranges on the same night).
fn the_copy_shared_from_stays_the_source_whatever_its_row_id(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let data = vol.path("data");
    let mut rng = Rng::new(57);
    let contents: Vec<Vec<u8>> = (0..8).map(|_| rng.bytes(256 << 10)).collect();
    for dir in ["z", "a"] {
        for (i, c) in contents.iter().enumerate() {
            write_in_extents(&data.join(dir).join(format!("f{i}")), &[c]);
        }
    }
    let early = run_json(&vol, &[s(&data.join("a"))]);
    assert_eq!(num(&early, "errors"), 0, "{early:#}");
    let first = run_json(&vol, &[s(&data)]);
    let held: Vec<_> = (0..8).map(|i| data.join(format!("z/f{i}"))).collect();
    for (i, z) in held.iter().enumerate() {
        let a = data.join(format!("a/f{i}"));
        assert!(same_physical(z, 0, &a, 0, 256 << 10), "pair {i} not shared: {first:#}");
    }
    let before: Vec<_> = held.iter().map(|z| physical_blocks(z, 0, 256 << 10)).collect();

    let tar: Vec<u8> = contents.iter().flat_map(|c| [rng.bytes(4096), c.clone()].concat()).collect();
    write_in_extents(&data.join("tar/t.tar"), &[&tar]);
    let (night, freed) = night(&vol, &data);
    assert!(night["pending"].as_object().unwrap().is_empty(), "nothing left pending: {night:#}");
    for (i, z) in held.iter().enumerate() {
        assert_eq!(physical_blocks(z, 0, 256 << 10), before[i], "z/f{i} was shared into: {night:#}");
        let at = (i as u64) * ((256 << 10) + 4096) + 4096;
        assert!(same_physical(&data.join("tar/t.tar"), at, z, 0, 256 << 10), "tar piece {i}: {night:#}");
    }
    assert!(freed >= 8 * (256 << 10) * 7 / 8, "freed {freed} of 2 MiB (statfs): {night:#}");
}

#[test]
fn btrfs_the_copy_shared_from_stays_the_source_whatever_its_row_id() {
    the_copy_shared_from_stays_the_source_whatever_its_row_id(Fs::Btrfs);
}

#[test]
fn xfs_the_copy_shared_from_stays_the_source_whatever_its_row_id() {
    the_copy_shared_from_stays_the_source_whatever_its_row_id(Fs::Xfs);
}

/// A file and three `cp --reflink` clones of it (one extent, four
/// holders), shared with nothing on the first night; on the next, a disk
/// image holding the file arrives, written in one pass.
///
/// The nightly plan met the file through the image's blocks but not its
/// clones (no clone is fresh or grouped with fresh data): the share phase
/// found them holding the file's extent and left the file pending on
/// btrfs, and XFS shared the file alone into the image, freeing nothing,
/// until the weekly full plan. Now the copies of a file grouped with fresh
/// data are planned with it.
fn clones_of_a_file_a_new_image_holds_are_freed_the_same_night(fs: Fs) {
    let Some(vol) = Volume::new(fs, 320) else { return };
    let data = vol.path("data");
    std::fs::create_dir_all(data.join("tree")).unwrap();
    let mut rng = Rng::new(55);
    let f = rng.bytes(MIB);
    std::fs::write(data.join("tree/f"), &f).unwrap();
    for k in 1..=3 {
        reflink(&data.join("tree/f"), &data.join(format!("tree/f{k}")));
    }
    let first = run_json(&vol, &[s(&data)]);
    assert_eq!(num(&first, "errors"), 0, "{first:#}");

    write_in_extents(&data.join("img/i.img"), &[&[rng.bytes(4 * MIB), f, rng.bytes(4 * MIB)].concat()]);
    let (night, freed) = night(&vol, &data);
    assert!(night["pending"].as_object().unwrap().is_empty(), "nothing left pending: {night:#}");
    let clones: Vec<_> = ["f", "f1", "f2", "f3"].iter().map(|n| data.join("tree").join(n)).collect();
    assert_in_image(&data.join("img/i.img"), 4 * MIB as u64, &clones, MIB as u64, &night);
    assert!(freed >= MIB as i64 * 7 / 8, "freed {freed} of {MIB} (statfs): {night:#}");
}

#[test]
fn btrfs_clones_of_a_file_a_new_image_holds_are_freed_the_same_night() {
    clones_of_a_file_a_new_image_holds_are_freed_the_same_night(Fs::Btrfs);
}

#[test]
fn xfs_clones_of_a_file_a_new_image_holds_are_freed_the_same_night() {
    clones_of_a_file_a_new_image_holds_are_freed_the_same_night(Fs::Xfs);
}
