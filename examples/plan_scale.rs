//! How the plan's cost grows with the volume, without the volume: a
//! database of synthetic block maps, written through the real database
//! writer, then the plan of all of it, timed. Used for docs/BENCHMARKS.md
//! (session 26); not part of the test suite.
//!
//! `cargo run --release --example plan_scale -- DIR FILES BLOCKS [SHAPE]`
//!
//! Shapes:
//! - `pairs` (default): `FILES` files of `BLOCKS` random blocks, every
//!   second one sharing its first eighth with the one before; a full plan;
//! - `near`: `FILES` near-copies of one image (1% of each file's blocks its
//!   own); an incremental plan, the last file fresh (a VM image store the
//!   night one image changed);
//! - `versions`: `FILES` families of 100 versions of a file of `BLOCKS`
//!   blocks (each version one block different); an incremental plan, the
//!   last version of every family fresh (a build machine's new tree among
//!   a hundred older ones).
//!
//! The database is kept in `DIR` and reused by the next run with the same
//! arguments (delete it to change them).

use std::collections::HashSet;
use std::path::Path;
use std::time::Instant;

use dedupscan::corpus::Rng;
use dedupscan::db::writer::{self, WriteOp};
use dedupscan::db::Db;
use dedupscan::file::FileId;
use dedupscan::hash::{FileHash, MapBytes};
use dedupscan::plan::{self, Limits, PlanOptions};

/// Versions of each file in the `versions` shape.
const VERSIONS: u64 = 100;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (dir, files, blocks, shape) = match &args[..] {
        [_, dir, files, blocks] => (dir, files, blocks, "pairs"),
        [_, dir, files, blocks, shape] if ["pairs", "near", "versions"].contains(&shape.as_str()) => {
            (dir, files, blocks, shape.as_str())
        }
        _ => {
            eprintln!("usage: plan_scale DIR FILES BLOCKS [pairs|near|versions]");
            std::process::exit(2);
        }
    };
    let (files, blocks): (u64, u64) = (files.parse().unwrap(), blocks.parse().unwrap());
    let path = Path::new(dir).join("plan-scale.sqlite");
    let fresh_db = !path.exists();
    let mut db = Db::open(&path, "plan-scale").unwrap();
    if fresh_db {
        let t = Instant::now();
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        let writer = std::thread::spawn(move || writer::run(db, 1, rx, &MapBytes::default()).unwrap().0);
        let mut n = 0;
        shape_maps(shape, files, blocks, &mut Rng::new(7)).for_each(|fps| {
            let map = dedupscan::blockmap::BlockMap::from_fps(&fps);
            let hash = FileHash { map, ..FileHash::empty(fps.len() as u64 * 4096, 1) };
            let path = format!("/f{n}").into();
            tx.send(WriteOp::Hashed { id: None, dev: 1, ino: n + 100, path, mtime: 0, ctime: 0, hash }).unwrap();
            n += 1;
        });
        drop(tx);
        db = writer.join().unwrap();
        eprintln!("wrote {n} maps in {:.1?}", t.elapsed());
    }
    let all = db.all_ids().unwrap();
    // Row ids follow the order of writing, from 1.
    let fresh: HashSet<FileId> = match shape {
        "near" => [FileId(files as i64)].into(),
        "versions" => (1..=files).map(|f| FileId((f * VERSIONS) as i64)).collect(),
        _ => HashSet::new(),
    };
    let fresh = (!fresh.is_empty()).then_some(&fresh);
    let t = Instant::now();
    let (mut ranges, mut bytes) = (0u64, 0u64);
    let stats = plan::from_db_with(&db, &all, fresh, PlanOptions::default(), Limits::default(), |p: plan::Plan| {
        ranges += p.ranges.len() as u64;
        bytes += p.ranges.iter().map(|r| r.len).sum::<u64>();
        Ok::<(), rusqlite::Error>(())
    })
    .unwrap();
    eprintln!("plan: {:.2?}, {} batches, {ranges} ranges, {} MiB", t.elapsed(), stats.batches, bytes >> 20);
}

/// Each file's fingerprints, in order of writing.
fn shape_maps<'a>(
    shape: &'a str,
    files: u64,
    blocks: u64,
    rng: &'a mut Rng,
) -> Box<dyn Iterator<Item = Vec<u64>> + 'a> {
    let random = |rng: &mut Rng, n: u64| -> Vec<u64> { (0..n).map(|_| rng.next_u64() | 1).collect() };
    match shape {
        "near" => {
            let golden = random(rng, blocks);
            Box::new((0..files).map(move |_| {
                (golden.iter())
                    .map(|&g| if rng.next_u64().is_multiple_of(100) { rng.next_u64() | 1 } else { g })
                    .collect()
            }))
        }
        "versions" => Box::new((0..files).flat_map(move |_| {
            let base = random(rng, blocks);
            let own = random(rng, VERSIONS);
            (0..VERSIONS).map(move |v| {
                let mut fps = base.clone();
                fps[(v % blocks) as usize] = own[v as usize];
                fps
            })
        })),
        _ => {
            let mut prev: Vec<u64> = Vec::new();
            Box::new((0..files).map(move |i| {
                let mut fps = random(rng, blocks);
                if i % 2 == 1 {
                    // The first eighth equals the previous file's, in place.
                    fps[..blocks as usize / 8].copy_from_slice(&prev[..blocks as usize / 8]);
                }
                prev = fps.clone();
                fps
            }))
        }
    }
}
