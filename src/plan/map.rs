//! The planner's view of a block map: random access by block and by data
//! index, over the one [`BlockMap`] type (never a second copy of it).
//!
//! A [`BlockMap`] is its stored encoding, read front to back. The planner
//! walks diagonals and so asks "the fingerprint of block `b`" and "the
//! number of block `b` among the file's data blocks" for arbitrary `b`;
//! [`MapView`] answers both by a binary search over the map's data runs,
//! borrowing their fingerprints from the encoding. Holes are never
//! expanded, so memory follows the data: an 8 TiB sparse file with a few
//! MiB of data costs a few MiB.

use crate::blockmap::{BlockMap, DataRun, Fp};

/// A borrowed, indexed view of one [`BlockMap`].
#[derive(Debug, Clone)]
pub struct MapView<'a> {
    /// Blocks covered, holes included.
    len: u64,
    /// The data runs in block order, each with the data index of its first
    /// block (its position among the file's data blocks).
    runs: Vec<(DataRun<'a>, u32)>,
    /// Data blocks in all.
    data: u32,
}

impl<'a> MapView<'a> {
    /// Index `map`'s data runs (one pass over its encoding).
    pub fn new(map: &'a BlockMap) -> MapView<'a> {
        let mut data = 0u32;
        let runs = map
            .runs()
            .map(|r| {
                let at = data;
                data += r.len() as u32;
                (r, at)
            })
            .collect();
        MapView { len: map.len(), runs, data }
    }

    /// Blocks in the file, holes and zero blocks included.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a file of no blocks.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Blocks with data (non-zero fingerprints).
    pub fn data_len(&self) -> u32 {
        self.data
    }

    /// Which run holds block `b`, if any.
    fn run_of(&self, b: u64) -> Option<usize> {
        let i = self.runs.partition_point(|(r, _)| r.start <= b).checked_sub(1)?;
        (b < self.runs[i].0.end()).then_some(i)
    }

    /// Data index of block `b`, or `None` for a hole or zero block.
    pub fn data_index(&self, b: u64) -> Option<u32> {
        let (r, at) = &self.runs[self.run_of(b)?];
        Some(at + (b - r.start) as u32)
    }

    /// Fingerprint of block `b` (0 for holes, zero blocks and past the end).
    pub fn get(&self, b: u64) -> Fp {
        self.run_of(b).map_or(0, |i| {
            let r = &self.runs[i].0;
            r.fp(b - r.start)
        })
    }

    /// Block of the data block with data index `d`.
    pub fn block_of(&self, d: u32) -> u64 {
        let i = self.runs.partition_point(|(_, at)| *at <= d) - 1;
        let (r, at) = &self.runs[i];
        r.start + (d - at) as u64
    }

    /// Every data block as `(block, fingerprint)`, in order; the data index
    /// of the n-th is n.
    pub fn data(&self) -> impl Iterator<Item = (u64, Fp)> + '_ {
        self.runs.iter().flat_map(|(r, _)| r.fps().enumerate().map(move |(k, fp)| (r.start + k as u64, fp)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::blockmap::{encode_words as blob, FP_MAX};

    #[test]
    fn random_access_matches_the_dense_map() {
        let dense = [5, 6, 0, 0, 0, 7, 0, 8, 9];
        let (a, b) = (BlockMap::from_short(&dense), BlockMap::from_blob(&blob(&[5, 6, 0, 3, 7, 0, 1, 8, 9])).unwrap());
        assert_eq!(a, b);
        let v = MapView::new(&a);
        assert_eq!(v.len(), 9);
        assert_eq!(v.data_len(), 5);
        assert_eq!((0..9).map(|i| v.get(i)).collect::<Vec<_>>(), dense);
        assert_eq!(v.data().collect::<Vec<_>>(), vec![(0, 5), (1, 6), (5, 7), (7, 8), (8, 9)]);
        assert_eq!((v.data_index(7), v.data_index(3), v.block_of(3)), (Some(3), None, 7));
        assert_eq!(v.get(100), 0);
    }

    #[test]
    fn an_8_tib_sparse_file_costs_its_data_only() {
        // 2^31 blocks of 4 KiB: one block of data, a hole, one block.
        let m = BlockMap::from_blob(&blob(&[3, 0, FP_MAX, 0, FP_MAX, 4])).unwrap();
        let v = MapView::new(&m);
        assert_eq!(v.len(), 2 + 2 * FP_MAX);
        assert_eq!(v.data_len(), 2);
        assert_eq!(v.get(v.len() - 1), 4);
        assert_eq!(v.block_of(1), v.len() - 1);
        assert!(m.as_bytes().len() <= 36);
    }
}
