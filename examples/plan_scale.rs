//! How the plan's cost grows with the volume, without the volume: a
//! database of synthetic block maps (`FILES` files of `BLOCKS` blocks each,
//! every second file sharing its first eighth with the file before it), then
//! the plan of all of it, timed. Used for docs/BENCHMARKS.md ("the first
//! grouping at scale"); not part of the test suite.
//!
//! `cargo run --release --example plan_scale -- DIR FILES BLOCKS`

use std::path::Path;
use std::time::Instant;

use dedupscan::corpus::Rng;
use dedupscan::db::writer::{self, WriteOp};
use dedupscan::db::Db;
use dedupscan::hash::{FileHash, MapBytes};
use dedupscan::plan::{self, Limits, PlanOptions};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, files, blocks] = &args[..] else {
        eprintln!("usage: plan_scale DIR FILES BLOCKS");
        std::process::exit(2);
    };
    let (files, blocks): (u64, u64) = (files.parse().unwrap(), blocks.parse().unwrap());
    let path = Path::new(dir).join("plan-scale.sqlite");
    let fresh_db = !path.exists();
    let db = Db::open(&path, "plan-scale").unwrap();
    let db = if fresh_db {
        let t = Instant::now();
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        let writer = std::thread::spawn(move || writer::run(db, 1, rx, &MapBytes::default()).unwrap().0);
        let mut rng = Rng::new(7);
        let mut prev: Vec<u64> = Vec::new();
        for i in 0..files {
            let mut fps: Vec<u64> = (0..blocks).map(|_| rng.next_u64() | 1).collect();
            if i % 2 == 1 {
                // The first eighth equals the previous file's, in place.
                fps[..blocks as usize / 8].copy_from_slice(&prev[..blocks as usize / 8]);
            }
            let map = dedupscan::blockmap::BlockMap::from_fps(&fps);
            let hash = FileHash { map, ..FileHash::empty(blocks * 4096, 1) };
            let path = format!("/f{i}").into();
            tx.send(WriteOp::Hashed { id: None, dev: 1, ino: i + 100, path, mtime: 0, ctime: 0, hash }).unwrap();
            prev = fps;
        }
        drop(tx);
        let db = writer.join().unwrap();
        eprintln!("wrote {files} maps of {blocks} blocks in {:.1?}", t.elapsed());
        db
    } else {
        db
    };
    let all = db.all_ids().unwrap();
    let t = Instant::now();
    let (mut ranges, mut bytes) = (0u64, 0u64);
    let stats = plan::from_db_with(&db, &all, None, PlanOptions::default(), Limits::default(), |p: plan::Plan| {
        ranges += p.ranges.len() as u64;
        bytes += p.ranges.iter().map(|r| r.len).sum::<u64>();
        Ok::<(), rusqlite::Error>(())
    })
    .unwrap();
    eprintln!("plan: {:.2?}, {} batches, {ranges} ranges, {} MiB", t.elapsed(), stats.batches, bytes >> 20);
}
