//! A group of files too large to plan in one piece is planned in parts,
//! and frees what the plan in one piece frees (issue 14: hold less).
//!
//! Files linked by duplicate blocks (a *component*) are planned together,
//! their block maps and the planner's arrays in memory: about 16 bytes a
//! block, so a golden VM image and twenty 40 GiB clones of it took GBs.
//! Past `plan::Limits::component_blocks` a component is now planned in
//! parts, each with its largest file (the *hub*) and the last file of the
//! part before (the *bridge*), both taken as sources
//! (`plan::links::Component::split`).
//!
//! Attacked here, with the budget lowered (`DEDUPSCAN_TEST_COMPONENT_BLOCKS`,
//! a test-only switch that can only lower it) so that every part holds one
//! new file: a chain of copies each made from the one before and changed a
//! little (backups of one image: blocks the hub never held, carried from
//! file to file across the parts), and a star of clones of the hub. The
//! same files on a second volume are planned in one piece; the split run
//! must free as much, submit no byte twice, and lose nothing. Without the
//! bridge the chain's carried blocks stayed twice; sharing into the hub and
//! bridge again submitted them twice.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;

use common::*;

const BLOCK: u64 = 4096;
const BLOCKS: u64 = 256;

/// Rewrite `n` blocks of `path` chosen by `seed` with data of their own.
fn rewrite(path: &Path, seed: u64, n: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let mut rng = dedupscan::corpus::Rng::new(seed);
    for _ in 0..n {
        let at = rng.next_u64() % BLOCKS;
        f.write_all_at(&rng.bytes(BLOCK as usize), at * BLOCK).unwrap();
    }
}

/// A hub, a chain of four copies each from the one before with 4 blocks
/// rewritten, and three clones of the hub with 4 blocks of their own: one
/// component of eight files, ~2,000 blocks in groups.
fn images(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let hub = dir.join("golden.img");
    std::fs::write(&hub, dedupscan::corpus::Rng::new(1).bytes((BLOCKS * BLOCK) as usize)).unwrap();
    let mut prev = hub.clone();
    for i in 1..=4 {
        let next = dir.join(format!("backup{i}.img"));
        std::fs::write(&next, std::fs::read(&prev).unwrap()).unwrap();
        rewrite(&next, 10 + i, 4);
        prev = next;
    }
    for i in 1..=3 {
        let clone = dir.join(format!("clone{i}.img"));
        std::fs::write(&clone, std::fs::read(&hub).unwrap()).unwrap();
        rewrite(&clone, 20 + i, 4);
    }
    sh(std::process::Command::new("sync").arg("-f").arg(dir));
}

/// Run on a fresh volume holding [`images`], with the component budget
/// `budget` if any; the report, stderr, statfs's freed bytes, the ideal.
fn run(fs: Fs, budget: Option<&str>) -> (serde_json::Value, String, u64, u64) {
    let vol = Volume::new(fs, 300).expect("checked by the caller");
    let d = vol.path("images");
    images(&d);
    let ideal = ideal_dup_bytes(&d);
    let before = Snapshot::take(&d);
    vol.remount();
    let free = free_bytes(&d);
    let mut cmd = dedupscan().arg("-v").arg(&d).db(vol.db()).json().expect(0);
    if let Some(b) = budget {
        cmd = cmd.env("DEDUPSCAN_TEST_COMPONENT_BLOCKS", b);
    }
    let out = cmd.run();
    validate_report(&out.json);
    before.assert_same(&Snapshot::take(&d));
    sh(std::process::Command::new("sync").arg("-f").arg(&d));
    let freed = free_bytes(&d).saturating_sub(free);
    (out.json, out.stderr, freed, ideal)
}

fn a_component_past_the_budget_frees_what_one_piece_does(fs: Fs) {
    if Volume::new(fs, 300).is_none() {
        return;
    }
    let (whole, whole_err, whole_freed, ideal) = run(fs, None);
    let (split, split_err, split_freed, _) = run(fs, Some("600"));
    eprintln!("ideal {ideal}, freed in one piece {whole_freed}, in parts {split_freed}");
    assert!(!whole_err.contains("planned in parts"), "{whole_err}");
    assert!(split_err.contains("1 group(s) of files planned in parts"), "{split_err}");
    // Every duplicate block found and shared once: no byte submitted twice
    // (the hub and the bridge are never destinations again).
    for r in [&whole, &split] {
        assert_eq!(num(r, "duplicate_bytes"), num(&whole, "duplicate_bytes"), "{r:#}");
        assert_eq!(num(r, "deduped_bytes"), num(r, "duplicate_bytes"), "{r:#}");
    }
    assert!(num(&split, "duplicate_bytes") >= ideal, "{split:#}");
    // Freed as much, within a few blocks of metadata.
    assert!(split_freed + 16 * BLOCK >= whole_freed, "in parts {split_freed}, in one piece {whole_freed}");
    assert!(split_freed >= ideal * 95 / 100, "freed {split_freed} of {ideal}");
}

#[test]
fn xfs_a_component_past_the_budget_frees_what_one_piece_does() {
    a_component_past_the_budget_frees_what_one_piece_does(Fs::Xfs);
}

#[test]
fn btrfs_a_component_past_the_budget_frees_what_one_piece_does() {
    a_component_past_the_budget_frees_what_one_piece_does(Fs::Btrfs);
}
