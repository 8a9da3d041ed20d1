//! Block maps: a file's fingerprints, one per block, without its holes.
//!
//! The fingerprint vocabulary ([`Fp`], [`short_fp`], [`ZERO_FP`]) and the one
//! block-map type ([`BlockMap`]) shared by the hasher, the database and the
//! planner. A base module: it imports no pipeline stage.
//!
//! In: fingerprints pushed in block order by the hasher, or a stored BLOB.
//! Out: the same bytes the `files.blocks` column stores, and sparse
//! iterators over them for the planner and the reports (the planner's
//! random-access view, `plan::map`, is built over these).
//!
//! The in-memory form *is* the stored form: per block the 6-byte block-map
//! fingerprint ([`short_fp`], [`FP_BYTES`]), little endian; a 0 (zero block
//! or hole) is followed by the length of the run of zero blocks it starts,
//! in a word of the same width (at most 2⁴⁸ − 1, a longer run continues in
//! the next pair). So a map costs 6 bytes per data block and 12 bytes per
//! run of holes, whatever the file's
//! apparent size: `truncate -s 8T` is one pair, not two billion entries
//! (issue 12: a dense `Vec` per block of apparent size made one user's sparse
//! file exhaust a root run's memory). Nothing here ever materialises a run of
//! zeros; [`BlockMap::to_dense`] is the one expansion, bounded and fallible,
//! for callers that index blocks directly.
//!
//! The encoding is canonical (zero runs are always merged), so two files
//! have the same map exactly when their encodings are byte-for-byte equal:
//! equality and hashing of maps are those of the bytes.

use std::collections::TryReserveError;
use std::fmt;

/// Fingerprint of a block that is a hole or all zeros: never matched.
pub const ZERO_FP: u64 = 0;

/// What the planner and the block maps keep of a block's fingerprint: the
/// high 48 bits of the 64-bit fingerprint ([`FP_BITS`]), never 0 except for
/// zero blocks.
///
/// Why 48: the planner groups every block outside whole-file copies by this
/// value, so N distinct blocks give about N²/2^(bits+1) false pairs. Each
/// one is a request the kernel refuses after reading two random blocks,
/// a part rewritten on btrfs so it does not pin its extent, and a link that
/// joins two unrelated files into one planning component (memory follows
/// the largest component). With 32 bits that was ~100 pairs on the
/// benchmark's million blocks but ~8 million at 1 TiB of distinct data,
/// enough to join a volume into one component; 48 bits leave ~130 at
/// 1 TiB and ~13,000 at 10 TiB, for 2 bytes more per 4 KiB block in the
/// database (0.15% of the data instead of 0.1%).
pub type Fp = u64;

/// Bits of a block-map fingerprint.
pub const FP_BITS: u32 = 48;

/// Bytes of a block-map fingerprint in a map's encoding.
pub const FP_BYTES: usize = FP_BITS as usize / 8;

/// Largest block-map fingerprint (and longest run of zeros in one pair).
pub const FP_MAX: Fp = (1 << FP_BITS) - 1;

/// The block-map fingerprint of a 64-bit fingerprint.
pub fn short_fp(fp64: u64) -> Fp {
    match fp64 {
        ZERO_FP => 0,
        f => (f >> (64 - FP_BITS)).max(1),
    }
}

/// Largest encoded map we build, in bytes: 6 bytes per data block, so
/// about 610 GiB of data per file with 4 KiB blocks. SQLite refuses values
/// over 10⁹ bytes (`SQLITE_MAX_LENGTH`), which would fail the whole batch
/// in the writer; a file past this is reported and skipped instead.
pub const MAX_MAP_BYTES: usize = 960_000_000;

/// The bound in force: [`MAX_MAP_BYTES`], or less when the tests ask
/// (`DEDUPSCAN_TEST_MAX_MAP_BYTES`, so that a file "too large" fits on a
/// test volume). It can only lower the bound, never raise it past what
/// SQLite stores.
pub fn max_map_bytes() -> usize {
    static BOUND: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BOUND.get_or_init(|| {
        std::env::var("DEDUPSCAN_TEST_MAX_MAP_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(MAX_MAP_BYTES, |v: usize| v.min(MAX_MAP_BYTES))
    })
}

/// Why a block map could not be built or expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// The allocator refused the memory (address-space limit, cgroup).
    #[error("not enough memory for the block map of {blocks} blocks")]
    OutOfMemory {
        /// Blocks of the map that did not fit.
        blocks: u64,
    },
    /// The map would exceed [`MAX_MAP_BYTES`] (or the caller's bound).
    #[error("block map of {blocks} blocks is larger than this build handles ({limit} bytes)")]
    TooLarge {
        /// Blocks of the map refused.
        blocks: u64,
        /// The bound it exceeded, in bytes.
        limit: usize,
    },
}

impl MapError {
    fn oom(blocks: u64) -> impl FnOnce(TryReserveError) -> MapError {
        move |_| MapError::OutOfMemory { blocks }
    }
}

/// One file's block map, sparse (see the module documentation).
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct BlockMap {
    /// The stored encoding.
    enc: Vec<u8>,
    /// Blocks the map covers, holes included.
    blocks: u64,
    /// Byte offset in `enc` of the length word of the trailing zero run,
    /// while the map ends in one (so the next zero extends it).
    tail_run: Option<usize>,
}

impl fmt::Debug for BlockMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockMap({} blocks, {} bytes", self.blocks, self.enc.len())?;
        if self.enc.len() <= 64 {
            write!(f, ", runs {:?}", self.runs().map(|r| (r.start, r.fps().collect::<Vec<_>>())).collect::<Vec<_>>())?;
        }
        write!(f, ")")
    }
}

/// A run of consecutive data blocks (none of them zero).
#[derive(Debug, Clone, Copy)]
pub struct DataRun<'a> {
    /// Index of its first block in the file.
    pub start: u64,
    words: &'a [u8],
}

impl<'a> DataRun<'a> {
    /// Number of blocks in the run.
    pub fn len(&self) -> u64 {
        (self.words.len() / W) as u64
    }

    /// Never true: a data run holds at least one block.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// One past its last block.
    pub fn end(&self) -> u64 {
        self.start + self.len()
    }

    /// The fingerprints of its blocks, in order.
    pub fn fps(&self) -> impl Iterator<Item = Fp> + 'a {
        self.words.chunks_exact(W).map(word)
    }

    /// The fingerprint of block `start + i`.
    pub fn fp(&self, i: u64) -> Fp {
        word(&self.words[i as usize * W..i as usize * W + W])
    }
}

/// Width of a word of the encoding (a fingerprint or a run length).
const W: usize = FP_BYTES;

/// A word of the encoding (little endian, [`W`] bytes).
fn word(c: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[..W].copy_from_slice(&c[..W]);
    u64::from_le_bytes(b)
}

/// The encoding of `v` (at most [`FP_MAX`]).
fn put(v: u64) -> [u8; W] {
    debug_assert!(v <= FP_MAX);
    v.to_le_bytes()[..W].try_into().expect("W bytes")
}

impl BlockMap {
    /// An empty map (a file of no blocks).
    pub fn new() -> BlockMap {
        BlockMap::default()
    }

    /// Blocks covered, holes included.
    pub fn len(&self) -> u64 {
        self.blocks
    }

    /// True for a map of no blocks.
    pub fn is_empty(&self) -> bool {
        self.blocks == 0
    }

    /// The stored encoding.
    pub fn as_bytes(&self) -> &[u8] {
        &self.enc
    }

    /// The stored encoding, without a copy.
    pub fn into_bytes(self) -> Vec<u8> {
        self.enc
    }

    /// Append one block's 64-bit fingerprint ([`ZERO_FP`] for a zero block).
    pub fn push(&mut self, fp64: u64) -> Result<(), MapError> {
        self.push_short(short_fp(fp64))
    }

    /// Append one block's block-map fingerprint (0 for a zero block).
    pub fn push_short(&mut self, fp: Fp) -> Result<(), MapError> {
        if fp == 0 {
            return self.push_zeros(1);
        }
        debug_assert!(fp <= FP_MAX, "not a block-map fingerprint: {fp:#x}");
        self.grow(W)?;
        self.enc.extend_from_slice(&put(fp));
        self.blocks += 1;
        self.tail_run = None;
        Ok(())
    }

    /// Append `n` zero blocks or holes, merged into the trailing zero run.
    /// Costs at most 12 bytes per 2⁴⁸ blocks, whatever `n` is.
    pub fn push_zeros(&mut self, mut n: u64) -> Result<(), MapError> {
        while n > 0 {
            let room = match self.tail_run {
                Some(at) => FP_MAX - word(&self.enc[at..at + W]),
                None => 0,
            };
            if room == 0 {
                self.grow(2 * W)?;
                self.enc.extend_from_slice(&put(0));
                self.tail_run = Some(self.enc.len());
                self.enc.extend_from_slice(&put(0));
                continue;
            }
            let at = self.tail_run.expect("room > 0");
            let take = n.min(room);
            let len = word(&self.enc[at..at + W]) + take;
            self.enc[at..at + W].copy_from_slice(&put(len));
            self.blocks += take;
            n -= take;
        }
        Ok(())
    }

    fn grow(&mut self, extra: usize) -> Result<(), MapError> {
        let max = max_map_bytes();
        if self.enc.len() + extra > max {
            return Err(MapError::TooLarge { blocks: self.blocks, limit: max });
        }
        if self.enc.capacity() - self.enc.len() < extra {
            // Amortised doubling, but fallible: a map is sized by file data.
            let want = self.enc.len().max(64).min(max - self.enc.len()).max(extra);
            self.enc.try_reserve(want).map_err(MapError::oom(self.blocks))?;
        }
        Ok(())
    }

    /// A map of 64-bit fingerprints (tests, benches).
    pub fn from_fps(fps: &[u64]) -> BlockMap {
        let mut m = BlockMap::new();
        for &f in fps {
            m.push(f).expect("small map");
        }
        m
    }

    /// A map of block-map fingerprints, one per block, 0 for a zero block
    /// or hole (tests, benches).
    pub fn from_short(fps: &[Fp]) -> BlockMap {
        let mut m = BlockMap::new();
        for &f in fps {
            m.push_short(f).expect("small map");
        }
        m
    }

    /// A map from its stored encoding. A trailing 0 without its run length
    /// counts as one zero block (as the dense decoder always read it); a
    /// stored encoding is canonical as long as this module wrote it.
    pub fn from_bytes(enc: Vec<u8>) -> BlockMap {
        let mut m = BlockMap { enc, blocks: 0, tail_run: None };
        let whole = m.enc.len() / W * W;
        m.enc.truncate(whole);
        let mut i = 0;
        while i < m.enc.len() {
            let fp = word(&m.enc[i..i + W]);
            i += W;
            if fp == 0 {
                if i + W > m.enc.len() {
                    m.enc.extend_from_slice(&put(1));
                }
                m.blocks += word(&m.enc[i..i + W]);
                m.tail_run = Some(i);
                i += W;
            } else {
                m.blocks += 1;
                m.tail_run = None;
            }
        }
        m
    }

    /// Like [`BlockMap::from_bytes`], from a borrowed BLOB (fallible copy).
    pub fn from_blob(blob: &[u8]) -> Result<BlockMap, MapError> {
        let mut enc = Vec::new();
        enc.try_reserve_exact(blob.len()).map_err(MapError::oom((blob.len() / W) as u64))?;
        enc.extend_from_slice(blob);
        Ok(BlockMap::from_bytes(enc))
    }

    /// The data runs, in block order (zero runs are skipped, never
    /// expanded).
    pub fn runs(&self) -> Runs<'_> {
        Runs { enc: &self.enc, pos: 0, block: 0 }
    }

    /// Every non-zero block as `(block index, fingerprint)`, in order.
    pub fn data_blocks(&self) -> impl Iterator<Item = (u64, Fp)> + '_ {
        data_blocks_of(&self.enc)
    }

    /// Number of non-zero blocks.
    pub fn data_len(&self) -> u64 {
        self.runs().map(|r| r.len()).sum()
    }

    /// The fingerprint of block `b` (0 for a zero block or past the end).
    /// Walks the encoding: O(size of the map). For repeated lookups use
    /// [`BlockMap::runs`].
    pub fn get(&self, b: u64) -> Fp {
        for r in self.runs() {
            if b < r.start {
                return 0;
            }
            if b < r.end() {
                return r.fp(b - r.start);
            }
        }
        0
    }

    /// A hash of the map (of its encoding): equal maps, equal hashes. Only
    /// compared within one process.
    pub fn hash64(&self) -> u64 {
        hash_encoding(&self.enc)
    }

    /// One fingerprint per block, holes as 0, for callers that index
    /// blocks directly. Refused past `max_blocks` blocks and when the
    /// allocator says no: the caller decides what to do without the map
    /// instead of aborting.
    pub fn to_dense(&self, max_blocks: u64) -> Result<Vec<Fp>, MapError> {
        if self.blocks > max_blocks {
            return Err(MapError::TooLarge { blocks: self.blocks, limit: (max_blocks * W as u64) as usize });
        }
        let mut out = Vec::new();
        out.try_reserve_exact(self.blocks as usize).map_err(MapError::oom(self.blocks))?;
        let mut at = 0;
        for r in self.runs() {
            out.resize(r.start as usize, 0);
            out.extend(r.fps());
            at = r.end();
        }
        debug_assert!(at <= self.blocks);
        out.resize(self.blocks as usize, 0);
        Ok(out)
    }
}

/// Hash of an encoded block map, as [`BlockMap::hash64`].
pub fn hash_encoding(enc: &[u8]) -> u64 {
    use std::hash::{DefaultHasher, Hasher};
    let mut h = DefaultHasher::new();
    h.write(enc);
    h.finish()
}

/// Iterator over the data runs of an encoding; see [`BlockMap::runs`].
pub struct Runs<'a> {
    enc: &'a [u8],
    pos: usize,
    block: u64,
}

impl<'a> Iterator for Runs<'a> {
    type Item = DataRun<'a>;

    fn next(&mut self) -> Option<DataRun<'a>> {
        // Skip zero runs.
        while self.pos + W <= self.enc.len() && word(&self.enc[self.pos..self.pos + W]) == 0 {
            let len = self.enc.get(self.pos + W..self.pos + 2 * W).map_or(1, word);
            self.block += len;
            self.pos += 2 * W;
        }
        if self.pos + W > self.enc.len() {
            return None;
        }
        let start = self.pos;
        while self.pos + W <= self.enc.len() && word(&self.enc[self.pos..self.pos + W]) != 0 {
            self.pos += W;
        }
        let run = DataRun { start: self.block, words: &self.enc[start..self.pos] };
        self.block += run.len();
        Some(run)
    }
}

/// The raw encoding of `words`, each a fingerprint or a run length, as
/// [`BlockMap::as_bytes`] would hold them (tests that build a BLOB by
/// hand, e.g. a zero run of a given length).
pub fn encode_words(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|&w| put(w)).collect()
}

/// Iterate the data runs of a stored BLOB without copying it.
pub fn runs_of(blob: &[u8]) -> Runs<'_> {
    Runs { enc: &blob[..blob.len() / W * W], pos: 0, block: 0 }
}

/// Every non-zero block of a stored BLOB as `(block index, fingerprint)`,
/// in order, without copying it (as [`BlockMap::data_blocks`]).
pub fn data_blocks_of(blob: &[u8]) -> impl Iterator<Item = (u64, Fp)> + '_ {
    runs_of(blob).flat_map(|r| r.fps().enumerate().map(move |(i, fp)| (r.start + i as u64, fp)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: one block-map fingerprint per block.
    fn dense(fps: &[u64]) -> Vec<Fp> {
        fps.iter().map(|&f| short_fp(f)).collect()
    }

    fn sample() -> Vec<u64> {
        vec![0x1234_5678_0000_0001, 0, 0, 0, 7 << 40, 0, 9 << 33, 0x10 << 32, 0x30 << 32, 0]
    }

    #[test]
    fn encoding_is_the_stored_format() {
        let fps = [0x1234_5678_0000_0001u64, 0, 0, 0, 7 << 40, 0, 9 << 33];
        let m = BlockMap::from_fps(&fps);
        // Seven blocks, two zero runs: 6 + 12 + 6 + 12 + 6 bytes.
        assert_eq!(m.as_bytes().len(), 42);
        assert_eq!(m.len(), 7);
        assert_eq!(m.to_dense(u64::MAX).unwrap(), dense(&fps));
        let round = BlockMap::from_bytes(m.as_bytes().to_vec());
        assert_eq!(round, m);
    }

    #[test]
    fn holes_cost_nothing_whatever_their_length() {
        let mut m = BlockMap::new();
        m.push_zeros(1 << 31).unwrap(); // 8 TiB of 4 KiB blocks
        m.push(0xdead_beef_0000_0000).unwrap();
        m.push_zeros((1 << 49) + 5).unwrap(); // past FP_MAX: three pairs
        assert_eq!(m.len(), (1 << 31) + 1 + (1 << 49) + 5);
        assert!(m.as_bytes().len() <= 12 + 6 + 12 * 3, "{m:?}");
        assert_eq!(m.data_blocks().collect::<Vec<_>>(), vec![(1 << 31, 0xdead_beef_0000)]);
        assert_eq!(BlockMap::from_bytes(m.as_bytes().to_vec()), m);
        assert!(matches!(m.to_dense(1 << 20), Err(MapError::TooLarge { .. })));
        assert_eq!(m.get(1 << 31), 0xdead_beef_0000);
        assert_eq!(m.get(5), 0);
    }

    #[test]
    fn zero_runs_merge_so_equal_maps_encode_equal() {
        let mut a = BlockMap::new();
        a.push_zeros(3).unwrap();
        a.push(0).unwrap();
        a.push_zeros(2).unwrap();
        let mut b = BlockMap::new();
        b.push_zeros(6).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.hash64(), b.hash64());
    }

    #[test]
    fn sparse_iterators_match_the_dense_map() {
        let fps = sample();
        let m = BlockMap::from_fps(&fps);
        let d = dense(&fps);
        let want: Vec<(u64, Fp)> = d.iter().enumerate().filter(|p| *p.1 != 0).map(|(b, &f)| (b as u64, f)).collect();
        assert_eq!(m.data_blocks().collect::<Vec<_>>(), want);
        assert_eq!(data_blocks_of(m.as_bytes()).collect::<Vec<_>>(), want);
        assert_eq!(m.data_len(), want.len() as u64);
        assert_eq!(BlockMap::from_short(&d), m);
        let runs: Vec<(u64, u64)> = m.runs().map(|r| (r.start, r.len())).collect();
        assert_eq!(runs, vec![(0, 1), (4, 1), (6, 3)]);
    }

    #[test]
    fn a_truncated_blob_reads_as_the_dense_decoder_read_it() {
        // A trailing 0 without a length: one zero block.
        let blob = [put(7), put(0)].concat();
        let m = BlockMap::from_bytes(blob.clone());
        assert_eq!(m.to_dense(10).unwrap(), vec![7, 0]);
        assert_eq!(runs_of(&blob).count(), 1);
    }
}
