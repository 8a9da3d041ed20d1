//! The planner's sparse block map: data runs, never the holes between them.
//!
//! The database stores a block map as 4 bytes per block with a run of zero
//! blocks or holes as `0, run length` (`db::encode_blocks`). Expanding that
//! would cost 4 bytes per block of *apparent* size: 8 GiB of memory for an
//! 8 TiB sparse file with a few MiB of data. [`BlockMap`] keeps the
//! non-zero fingerprints only, in runs of consecutive blocks, so memory
//! follows the data, and every block of data has a dense *data index*
//! (its position among the file's data blocks) that the planner uses to
//! number blocks without a hash map.
//!
//! (Another helper adds a sparse type for the hashing side, `blockmap.rs`;
//! this one is the planner's own until the two are unified.)

use super::Fp;

/// One run of consecutive non-zero blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    /// First block of the run.
    start: u64,
    /// Index of its first fingerprint in [`BlockMap::fps`].
    at: u32,
}

/// A file's block fingerprints without its zero blocks and holes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockMap {
    /// Blocks in the file, holes included.
    blocks: u64,
    runs: Vec<Run>,
    /// Every non-zero fingerprint, in block order; run `i` owns
    /// `fps[runs[i].at .. runs[i + 1].at]`.
    fps: Vec<Fp>,
}

impl BlockMap {
    /// From one fingerprint per block (0 for zero blocks and holes).
    pub fn from_dense(blocks: &[Fp]) -> BlockMap {
        let mut m = BlockMap::default();
        for &fp in blocks {
            m.push(fp, 1);
        }
        m
    }

    /// From the database's encoding (`db::encode_blocks`), without ever
    /// expanding a run of zeros.
    pub fn from_blob(blob: &[u8]) -> BlockMap {
        let mut m = BlockMap { fps: Vec::with_capacity(blob.len() / 4), ..Default::default() };
        let mut words = blob.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")));
        while let Some(fp) = words.next() {
            let n = if fp == 0 { words.next().unwrap_or(1) as u64 } else { 1 };
            m.push(fp, n);
        }
        m
    }

    /// Append `n` blocks of `fp` (`n` > 1 only for zeros).
    fn push(&mut self, fp: Fp, n: u64) {
        if fp != 0 {
            let contiguous =
                self.runs.last().is_some_and(|r| r.start + (self.fps.len() as u64 - r.at as u64) == self.blocks);
            if !contiguous {
                self.runs.push(Run { start: self.blocks, at: self.fps.len() as u32 });
            }
            self.fps.push(fp);
        }
        self.blocks += n;
    }

    /// Blocks in the file, holes and zero blocks included.
    pub fn len(&self) -> u64 {
        self.blocks
    }

    pub fn is_empty(&self) -> bool {
        self.blocks == 0
    }

    /// Blocks with data (non-zero fingerprints).
    pub fn data_len(&self) -> u32 {
        self.fps.len() as u32
    }

    /// Run `i`'s first block and its fingerprints.
    fn run(&self, i: usize) -> (u64, &[Fp]) {
        let end = self.runs.get(i + 1).map_or(self.fps.len(), |r| r.at as usize);
        let r = self.runs[i];
        (r.start, &self.fps[r.at as usize..end])
    }

    /// Which run holds block `b`, if any.
    fn run_of(&self, b: u64) -> Option<usize> {
        let i = match self.runs.len() {
            0 => return None,
            1 => 0,
            _ => self.runs.partition_point(|r| r.start <= b).checked_sub(1)?,
        };
        let (start, fps) = self.run(i);
        (b >= start && b - start < fps.len() as u64).then_some(i)
    }

    /// Data index of block `b`, or `None` for a hole or zero block.
    pub fn data_index(&self, b: u64) -> Option<u32> {
        let i = self.run_of(b)?;
        Some(self.runs[i].at + (b - self.runs[i].start) as u32)
    }

    /// Fingerprint of block `b` (0 for holes, zero blocks and past the end).
    pub fn get(&self, b: u64) -> Fp {
        self.data_index(b).map_or(0, |d| self.fps[d as usize])
    }

    /// Every data block as `(block, fingerprint)`, in order; the data index
    /// of the n-th is n.
    pub fn data(&self) -> impl Iterator<Item = (u64, Fp)> + '_ {
        (0..self.runs.len()).flat_map(move |i| {
            let (start, fps) = self.run(i);
            fps.iter().enumerate().map(move |(k, &fp)| (start + k as u64, fp))
        })
    }

    /// The fingerprints of the data blocks alone (for hashing a map).
    pub fn data_fps(&self) -> &[Fp] {
        &self.fps
    }

    /// Block of the data block with data index `d`.
    pub fn block_of(&self, d: u32) -> u64 {
        let i = self.runs.partition_point(|r| r.at <= d) - 1;
        self.runs[i].start + (d - self.runs[i].at) as u64
    }

    /// The runs of data as `(first block, block count)`.
    pub fn runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (0..self.runs.len()).map(|i| {
            let (s, f) = self.run(i);
            (s, f.len() as u64)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn sparse_decode_matches_dense() {
        let dense = [5, 6, 0, 0, 0, 7, 0, 8, 9];
        let enc = blob(&[5, 6, 0, 3, 7, 0, 1, 8, 9]);
        let (a, b) = (BlockMap::from_dense(&dense), BlockMap::from_blob(&enc));
        assert_eq!(a, b);
        assert_eq!(a.len(), 9);
        assert_eq!(a.data_len(), 5);
        assert_eq!((0..9).map(|i| a.get(i)).collect::<Vec<_>>(), dense);
        assert_eq!(a.data().collect::<Vec<_>>(), vec![(0, 5), (1, 6), (5, 7), (7, 8), (8, 9)]);
        assert_eq!(a.runs().collect::<Vec<_>>(), vec![(0, 2), (5, 1), (7, 2)]);
        assert_eq!((a.data_index(7), a.data_index(3), a.block_of(3)), (Some(3), None, 7));
        assert_eq!(a.get(100), 0);
    }

    #[test]
    fn an_8_tib_sparse_file_costs_its_data_only() {
        // 2^31 blocks of 4 KiB: one block of data, a hole, one block.
        let enc = blob(&[3, 0, u32::MAX, 0, u32::MAX, 4]);
        let m = BlockMap::from_blob(&enc);
        assert_eq!(m.len(), 2 + 2 * u32::MAX as u64);
        assert_eq!(m.data_len(), 2);
        assert_eq!(m.get(m.len() - 1), 4);
        assert_eq!(m.runs().count(), 2);
        assert!(std::mem::size_of_val(m.data_fps()) < 64);
    }
}
