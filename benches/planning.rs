//! Planning cost: `dedupscan::plan::plan` on synthetic block maps shaped like
//! the database's output (whole-file groups by size and digest, groups of
//! equal blocks by fingerprint, whole-file duplicates left out of them), so
//! the planner is measured alone, without SQLite.
//!
//! Cases:
//! - `vm_pair_200k_2pct`: two 200,000-block (781 MiB) images, 2% of the
//!   blocks of the second changed at random: one long diagonal with many
//!   short gaps;
//! - `small_files_50k`: 50,000 files of 1–6 blocks; a third are whole copies
//!   of earlier files and a tenth are copies with one block changed (partial
//!   matches found through anchors);
//! - `anchors_200k`: choosing the anchors of one 200,000-block map (done once
//!   per hashed file, on the db writer thread).
//!
//! Kept short (10 samples, ~3 s each) so that `cargo bench` stays under two
//! minutes on a 2-core machine.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use dedupscan::blockmap::{short_fp, Fp};
use dedupscan::corpus::Rng;
use dedupscan::file::FileId;
use dedupscan::hash::ZERO_FP;
use dedupscan::plan::{anchors, plan, PlanFile, PlanOptions};

const BS: u64 = 4096;

/// The planner's input, as `Db::plan` assembles it from the database.
struct Input {
    files: Vec<PlanFile>,
    whole: Vec<Vec<FileId>>,
    anchor_groups: Vec<Vec<(FileId, u64)>>,
}

impl Input {
    fn blocks(&self) -> u64 {
        self.files.iter().map(|f| f.blocks.len()).sum()
    }
}

fn fp(rng: &mut Rng) -> Fp {
    short_fp(rng.next_u64().max(ZERO_FP + 1))
}

fn plan_file(id: i64, blocks: Vec<Fp>) -> PlanFile {
    PlanFile::dense(FileId(id), id as u64, blocks.len() as u64 * BS, &blocks)
}

fn dense(f: &PlanFile) -> Vec<Fp> {
    f.blocks.to_dense(u64::MAX).expect("a small map")
}

/// Group files the way the database does: whole-file groups by content,
/// then every block of the files that are not already a whole-file copy
/// grouped by fingerprint (the exact block groups of `plan::group`).
fn input(files: Vec<PlanFile>) -> Input {
    let mut by_content: BTreeMap<(u64, Vec<Fp>), Vec<FileId>> = BTreeMap::new();
    for f in &files {
        by_content.entry((f.size, dense(f))).or_default().push(f.id);
    }
    let whole: Vec<Vec<FileId>> = by_content.into_values().filter(|g| g.len() > 1).collect();
    let covered: std::collections::HashSet<FileId> = whole.iter().flat_map(|g| g[1..].iter().copied()).collect();
    let mut occ: Vec<(Fp, FileId, u64)> = Vec::new();
    for f in files.iter().filter(|f| !covered.contains(&f.id)) {
        occ.extend(f.blocks.data_blocks().map(|(b, fp)| (fp, f.id, b)));
    }
    occ.sort_unstable();
    let anchor_groups = occ
        .chunk_by(|a, b| a.0 == b.0)
        .filter(|g| g.len() > 1)
        .map(|g| g.iter().map(|o| (o.1, o.2)).collect())
        .collect();
    Input { whole, anchor_groups, files }
}

fn vm_pair(n: usize, changed_per_mille: u64) -> Input {
    let mut rng = Rng::new(7);
    let a: Vec<Fp> = (0..n).map(|_| fp(&mut rng)).collect();
    let b: Vec<Fp> = a.iter().map(|&x| if rng.below(1000) < changed_per_mille { fp(&mut rng) } else { x }).collect();
    input(vec![plan_file(1, a), plan_file(2, b)])
}

fn small_files(n: usize) -> Input {
    let mut rng = Rng::new(8);
    let mut files: Vec<PlanFile> = Vec::with_capacity(n);
    for i in 0..n {
        let id = i as i64 + 1;
        let roll = rng.below(30);
        let blocks = if !files.is_empty() && roll < 10 {
            // whole copy of an earlier file
            dense(&files[rng.below(files.len() as u64) as usize])
        } else if !files.is_empty() && roll < 13 {
            // edited copy: one block changed
            let mut b = dense(&files[rng.below(files.len() as u64) as usize]);
            let at = rng.below(b.len() as u64) as usize;
            b[at] = fp(&mut rng);
            b
        } else {
            let len = 1 + rng.below(6) as usize;
            (0..len).map(|_| fp(&mut rng)).collect()
        };
        files.push(plan_file(id, blocks));
    }
    input(files)
}

fn planning(c: &mut Criterion) {
    let mut g = c.benchmark_group("plan");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for (name, inp) in [("vm_pair_200k_2pct", vm_pair(200_000, 20)), ("small_files_50k", small_files(50_000))] {
        let once =
            plan(&inp.files, &inp.whole, &inp.anchor_groups, PlanOptions { exact_groups: true, ..Default::default() });
        eprintln!(
            "{name}: {} files, {} blocks, {} whole-file groups, {} anchor groups -> {} ranges, {} blocks shared",
            inp.files.len(),
            inp.blocks(),
            inp.whole.len(),
            inp.anchor_groups.len(),
            once.ranges.len(),
            once.bytes() / BS
        );
        // Throughput in blocks (of 4 KiB) considered, so cases compare.
        g.throughput(Throughput::Elements(inp.blocks()));
        g.bench_function(name, |b| {
            b.iter(|| {
                black_box(plan(
                    &inp.files,
                    &inp.whole,
                    &inp.anchor_groups,
                    PlanOptions { exact_groups: true, ..Default::default() },
                ))
            })
        });
    }
    let mut rng = Rng::new(9);
    let map: Vec<Fp> = (0..200_000).map(|_| fp(&mut rng)).collect();
    g.throughput(Throughput::Elements(map.len() as u64));
    g.bench_function("anchors_200k", |b| b.iter(|| black_box(anchors(&map))));
    g.finish();
}

criterion_group!(benches, planning);
criterion_main!(benches);
