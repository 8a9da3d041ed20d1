//! A seeded, synthetic corpus with every kind of duplication dedupscan must
//! find: whole-file copies, aligned partial overlaps, block-shifted copies,
//! a snapshot pair differing in 2% of its blocks, sparse files, files with
//! unaligned sizes and many small files.
//!
//! Used by the integration tests, the README's demo volume and the
//! benchmarks, so all three measure the same shapes of data. The same seed
//! and scale always give the same bytes.

use std::fs;
use std::io::{self, Seek, SeekFrom, Write};
use std::path::Path;

const BLOCK: usize = 4096;

/// splitmix64: tiny, fast, good enough for test data.
pub struct Rng(u64);

impl Rng {
    /// A generator whose stream is fixed by `seed` (same seed, same corpus).
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// `len` random bytes (never an all-zero block in practice).
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(len);
        v
    }
}

/// Build the corpus under `dir`. `scale` multiplies the sizes: 1 gives about
/// 40 MiB, enough for tests on a small loop volume.
pub fn build(dir: &Path, seed: u64, scale: usize) -> io::Result<()> {
    let mut rng = Rng::new(seed);
    let mib = 1 << 20;
    let s = scale.max(1);
    for d in ["whole/a", "whole/b", "whole/c", "partial", "shifted", "images", "sparse", "small", "tails"] {
        fs::create_dir_all(dir.join(d))?;
    }
    // Whole-file duplicates: three originals, copied into two more trees.
    for (i, size) in [3 * mib, mib + 5000, 256 * 1024].into_iter().enumerate() {
        let data = rng.bytes(size * s);
        for tree in ["a", "b", "c"] {
            fs::write(dir.join(format!("whole/{tree}/file{i}.bin")), &data)?;
        }
    }
    // Aligned partial overlap: two files share their first half.
    let shared = rng.bytes(2 * mib * s);
    let mut x = shared.clone();
    x.extend(rng.bytes(2 * mib * s));
    let mut y = shared;
    y.extend(rng.bytes(2 * mib * s));
    fs::write(dir.join("partial/first.bin"), &x)?;
    fs::write(dir.join("partial/second.bin"), &y)?;
    // Block-shifted copy: one new block in front of the original.
    let orig = rng.bytes(3 * mib * s);
    let mut shifted = rng.bytes(BLOCK);
    shifted.extend_from_slice(&orig);
    fs::write(dir.join("shifted/original.bin"), &orig)?;
    fs::write(dir.join("shifted/shifted.bin"), &shifted)?;
    // Snapshot pair: 2% of the blocks changed.
    let img = rng.bytes(8 * mib * s);
    let mut snap = img.clone();
    for blk in 0..snap.len() / BLOCK {
        if rng.below(50) == 0 {
            let new = rng.bytes(BLOCK);
            snap[blk * BLOCK..(blk + 1) * BLOCK].copy_from_slice(&new);
        }
    }
    fs::write(dir.join("images/vm-monday.img"), &img)?;
    fs::write(dir.join("images/vm-tuesday.img"), &snap)?;
    // Sparse files: data islands in holes, twice, plus one with written zeros.
    let islands: Vec<(u64, Vec<u8>)> = (0..4).map(|i| (i * 2 * mib as u64 * s as u64, rng.bytes(256 * 1024))).collect();
    for name in ["disk1.raw", "disk2.raw"] {
        let mut f = fs::File::create(dir.join("sparse").join(name))?;
        for (off, data) in &islands {
            f.seek(SeekFrom::Start(*off))?;
            f.write_all(data)?;
        }
        f.set_len(8 * mib as u64 * s as u64)?;
    }
    // Many small files, a third of them duplicates of earlier ones.
    let mut smalls: Vec<Vec<u8>> = Vec::new();
    for i in 0..300 * s {
        let data = if i % 3 == 2 && !smalls.is_empty() {
            smalls[rng.below(smalls.len() as u64) as usize].clone()
        } else {
            let len = 1 + rng.below(6 * BLOCK as u64) as usize;
            let d = rng.bytes(len);
            smalls.push(d.clone());
            d
        };
        fs::write(dir.join(format!("small/f{i:04}.dat")), data)?;
    }
    // Unaligned sizes: identical files whose last block is partial.
    let t = rng.bytes(5 * BLOCK + 123);
    fs::write(dir.join("tails/one.txt"), &t)?;
    fs::write(dir.join("tails/two.txt"), &t)?;
    Ok(())
}
