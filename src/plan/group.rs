//! Grouping: which files are whole copies of each other, and which blocks
//! hold equal fingerprints. Pure functions over block maps; the database
//! only streams the rows (`db::maps`), [`super::from_db`] feeds them here.
//!
//! Whole files are grouped by size and a hash of the block map, 24 bytes
//! per file, in partitions of the hash space of at most [`WHOLE_BUDGET`]
//! files each ([`partitions`]; one more pass over the maps per partition),
//! so that ten million files cost no more than one million. Every block of every file outside those copies
//! is then grouped by fingerprint — exactly, not sampled: a one-block file
//! padded to 4 KiB inside two disk images, or a fragment of a file split by
//! an image's allocator, has no anchor to be found from, and these were
//! most of what sampling missed. Grouping takes 16 bytes per block, so it
//! runs in slices of the fingerprint space of at most [`GROUP_BUDGET`]
//! blocks each ([`slices_within`]; written out by one pass over the maps for many
//! slices, [`super::spill`]). An
//! incremental plan groups only the fingerprints of the fresh files' blocks.

use std::collections::HashSet;

use rustc_hash::FxHashSet;

use super::claims::Skipper;
use crate::blockmap::{data_blocks_of, hash_encoding, Fp};
use crate::file::FileId;

/// Most blocks grouped at once (16 bytes each: 64 MiB, to stay within
/// issue 14's 256 MB for ten million files); more are grouped in slices of
/// the fingerprint space, one pass over the maps each (the FULL
/// benchmark's million blocks take one).
pub const GROUP_BUDGET: u64 = 4 << 20;

/// One block of a group: a file's id and the block's index in it, packed
/// in 12 bytes (48 bits each) where the pair took 16. When the volume's
/// groups were alive through every batch's plan they were the largest item
/// at the plan's peak (heaptrack on FULL: 6.3 of 21.8 MB); now a batch's
/// are, one slice at a time.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Member([u32; 3]);

impl Member {
    /// Ids and block indices below this fit (a database row id is its
    /// table's largest plus one; a block index past it is data more than
    /// 1 EiB into a sparse file, which [`SliceGrouper`] does not group).
    pub const LIMIT: u64 = 1 << 48;

    /// `None` when the id or the block does not fit in 48 bits.
    pub fn new(id: FileId, block: u64) -> Option<Member> {
        let f = u64::try_from(id.0).ok().filter(|&f| f < Member::LIMIT)?;
        let packed = [f as u32, (f >> 32) as u32 | ((block as u32) << 16), (block >> 16) as u32];
        (block < Member::LIMIT).then_some(Member(packed))
    }

    /// The file.
    pub fn file(self) -> FileId {
        FileId((self.0[0] as u64 | ((self.0[1] & 0xffff) as u64) << 32) as i64)
    }

    /// The block's index in the file.
    pub fn block(self) -> u64 {
        (self.0[1] >> 16) as u64 | (self.0[2] as u64) << 16
    }

    /// As a pair.
    pub fn pair(self) -> (FileId, u64) {
        (self.file(), self.block())
    }
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({}, {})", self.file().0, self.block())
    }
}

/// Groups of equal blocks, as [`Member`]s: at least two each.
///
/// Stored flat, one array of members and one of where each group ends: 12
/// bytes a member and 8 a group. A `Vec` per group cost 24 bytes more a
/// group plus the allocator's own (heaptrack on FULL, mostly pairs, when
/// the volume's groups were kept for the whole plan: 7.9 MB as `Vec`s).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BlockGroups {
    members: Vec<Member>,
    ends: Vec<usize>,
}

impl BlockGroups {
    /// Append a group; members that do not fit a [`Member`] are left out
    /// (never shared), and a group left with fewer than two is dropped.
    pub fn push(&mut self, group: impl IntoIterator<Item = (FileId, u64)>) {
        let start = self.members.len();
        self.members.extend(group.into_iter().filter_map(|(id, b)| Member::new(id, b)));
        if self.members.len() < start + 2 {
            self.members.truncate(start);
            return;
        }
        self.ends.push(self.members.len());
    }

    /// Number of groups.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when there is no group.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Group `i`.
    pub fn get(&self, i: usize) -> &[Member] {
        let start = i.checked_sub(1).map_or(0, |j| self.ends[j]);
        &self.members[start..self.ends[i]]
    }

    /// The groups in order.
    pub fn iter(&self) -> impl Iterator<Item = &[Member]> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }
}

impl From<Vec<Vec<(FileId, u64)>>> for BlockGroups {
    fn from(groups: Vec<Vec<(FileId, u64)>>) -> BlockGroups {
        let mut out = BlockGroups::default();
        groups.into_iter().for_each(|g| out.push(g));
        out
    }
}

/// Most whole-file keys grouped at once (24 bytes each: 24 MiB); more
/// files are grouped in partitions of the map-hash space, one pass over
/// the maps each.
pub const WHOLE_BUDGET: u64 = 1 << 20;

/// A whole-file duplicate group: the size of its files and their ids,
/// sorted, at least two.
pub type WholeGroup = (u64, Vec<FileId>);

/// How many partitions of the map-hash space grouping `files` whole files
/// takes with at most `budget` keys at once.
pub fn partitions(files: u64, budget: u64) -> u64 {
    files.div_ceil(budget.max(1)).max(1)
}

/// The key whole-file copies share: size and hash of the encoded map.
pub fn whole_key(size: u64, map: &[u8]) -> (u64, u64) {
    (size, hash_encoding(map))
}

/// Most fingerprints of fresh files an incremental plan groups by (a set
/// of 8-byte keys: 16–32 MB). A nightly run after every VM image of a store
/// changed has fresh files the size of the store, and the set took 16–32
/// bytes a fresh block; past this many, every block is grouped (in slices,
/// see [`slices_within`]) and the groups without a fresh file dropped: the same
/// groups, in bounded memory.
pub const FRESH_KEYS: u64 = 1 << 20;

/// What one pass over every block map gathers before grouping.
#[derive(Debug)]
pub struct MapPass {
    /// Data blocks of the files seen (sets the number of [`slices_within`]).
    pub data_blocks: u64,
    /// Fingerprints of the fresh files' blocks (incremental plans), while
    /// there are at most `budget`.
    fresh_fps: FxHashSet<Fp>,
    budget: u64,
    /// There were more: `fresh_fps` is given up.
    too_many: bool,
}

impl MapPass {
    /// A pass keeping at most `budget` fresh fingerprints ([`FRESH_KEYS`]).
    pub fn new(budget: u64) -> MapPass {
        MapPass { data_blocks: 0, fresh_fps: FxHashSet::default(), budget, too_many: false }
    }

    /// Take in one file's encoded map; `fresh`: the file was hashed by this
    /// run (its fingerprints bound an incremental plan).
    pub fn add(&mut self, map: &[u8], fresh: bool) {
        let mut n = 0u64;
        for (_, fp) in data_blocks_of(map) {
            n += 1;
            if fresh && !self.too_many {
                self.fresh_fps.insert(fp);
                if self.fresh_fps.len() as u64 > self.budget {
                    self.too_many = true;
                    self.fresh_fps = FxHashSet::default();
                }
            }
        }
        self.data_blocks += n;
    }

    /// The fresh files' fingerprints, the only ones an incremental plan
    /// need group; `None` when there were too many to keep.
    pub fn keys(&self) -> Option<&FxHashSet<Fp>> {
        (!self.too_many).then_some(&self.fresh_fps)
    }
}

/// Whole-file duplicate groups from `(size, map hash, id)` keys: each group
/// sorted by id, at least two files.
pub fn group_whole_files(mut keys: Vec<(u64, u64, FileId)>) -> Vec<WholeGroup> {
    keys.sort_unstable();
    keys.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1))
        .filter(|g| g.len() > 1)
        .map(|g| (g[0].0, g.iter().map(|k| k.2).collect()))
        .collect()
}

/// How many slices of the fingerprint space grouping `data_blocks` blocks
/// takes to stay within `budget` blocks a slice ([`GROUP_BUDGET`] for the
/// first grouping). An incremental plan, which groups only the fresh
/// files' fingerprints, is sliced the same way: those fingerprints bound
/// the blocks grouped only with their copies, which can be many, in many
/// small components (a build machine's new tree among a hundred older
/// versions: 160 Ki fresh blocks gathered 16 Mi copies in one slice, 266
/// MB; 84 MB in four: `examples/plan_scale.rs versions`); slices of only
/// the fresh fingerprints' copies cost a few bytes on disk
/// ([`super::spill`]).
pub fn slices_within(data_blocks: u64, budget: u64) -> u32 {
    data_blocks.div_ceil(budget.max(1)).max(1) as u32
}

/// Groups the blocks of one slice of the fingerprint space: feed it every
/// file's map with [`SliceGrouper::add`], then [`SliceGrouper::finish_each`].
pub struct SliceGrouper<'k> {
    slice: u32,
    slices: u32,
    keys: Option<&'k FxHashSet<Fp>>,
    /// (fingerprint, index in `ids`, block) packed in 16 bytes per block,
    /// in that order of significance (so they sort as the triple would):
    /// see [`Occ`].
    occ: Vec<u128>,
    ids: Vec<FileId>,
    /// Blocks of the slice left out as already shared (see
    /// [`super::claims`]).
    skipped: u64,
}

/// One block's place in a slice, packed: the 48-bit fingerprint, the file's
/// index in the slice (32 bits), the block's index in its file (48 bits).
/// A tuple of the three took 24 bytes a block, and the slice's blocks are
/// the plan's largest array before the lone ones are dropped.
struct Occ;

impl Occ {
    /// Blocks at or past this index (data more than 1 EiB into a sparse
    /// file, 4 KiB blocks) are not grouped: never matched, never shared.
    const BLOCK_LIMIT: u64 = 1 << 48;

    fn pack(fp: Fp, at: u32, block: u64) -> u128 {
        debug_assert!(fp <= crate::blockmap::FP_MAX && block < Occ::BLOCK_LIMIT);
        (fp as u128) << 80 | (at as u128) << 48 | block as u128
    }

    fn fp(o: u128) -> Fp {
        (o >> 80) as Fp
    }

    fn at(o: u128) -> usize {
        (o >> 48) as u32 as usize
    }

    fn block(o: u128) -> u64 {
        o as u64 & (Occ::BLOCK_LIMIT - 1)
    }
}

impl<'k> SliceGrouper<'k> {
    /// Slice `slice` of `slices`; with `keys`, only blocks whose
    /// fingerprint is one of them.
    pub fn new(slice: u32, slices: u32, keys: Option<&'k FxHashSet<Fp>>) -> SliceGrouper<'k> {
        SliceGrouper { slice, slices, keys, occ: Vec::new(), ids: Vec::new(), skipped: 0 }
    }

    /// Take in the blocks of file `id` (encoded map) that fall in the slice,
    /// but those in `skip` (sorted `[start, end)` block ranges another file
    /// holds the same physical blocks of: [`super::claims::Claims::skips`]).
    pub fn add(&mut self, id: FileId, map: &[u8], skip: &[(u64, u64)]) {
        self.add_as(id, map, skip, |b| b);
    }

    /// [`Self::add`], with each block taken as `block(its index)` (linking
    /// needs only a mark: [`super::links`]).
    pub fn add_as(&mut self, id: FileId, map: &[u8], skip: &[(u64, u64)], block: impl Fn(u64) -> u64) {
        let (n, at) = (self.occ.len(), self.ids.len() as u32);
        let (slice, slices) = (self.slice as Fp, self.slices as Fp);
        let skipped = &mut self.skipped;
        self.occ.extend(blocks_to_group(map, skip, self.keys, |fp| fp % slices == slice).filter_map(|(b, fp, out)| {
            *skipped += u64::from(out);
            (!out).then(|| Occ::pack(fp, at, block(b)))
        }));
        if self.occ.len() > n {
            self.ids.push(id);
        }
    }

    /// Room for `n` more blocks, exactly (a slice read back knows its
    /// size; grown by doubling, its 64 MiB took up to 128).
    pub fn reserve(&mut self, n: usize) {
        self.occ.reserve_exact(n);
    }

    /// Take in one block of file `id` read back from where the slice was
    /// written out ([`super::spill`]): the blocks of one file come
    /// together, in the order [`Self::add`] would have taken them.
    pub fn add_one(&mut self, id: FileId, fp: Fp, block: u64) {
        if self.ids.last() != Some(&id) {
            self.ids.push(id);
        }
        self.occ.push(Occ::pack(fp, self.ids.len() as u32 - 1, block));
    }

    /// Count `n` blocks left out as already shared by whoever took in the
    /// slice's blocks for it ([`super::spill`]).
    pub fn add_skipped(&mut self, n: u64) {
        self.skipped += n;
    }

    /// The slice's groups of two or more equal blocks appended to `out`
    /// (tests: the plan takes them one at a time, [`Self::finish_each`]);
    /// how many blocks were left out as already shared.
    #[cfg(test)]
    pub fn finish(self, out: &mut BlockGroups) -> u64 {
        self.finish_each(|g| out.push(g.iter().map(|m| m.pair())))
    }

    /// Hand each of the slice's groups of two or more equal blocks to
    /// `each`, keeping none (a caller that only links files holds no group
    /// beside the slice's blocks); returns how many blocks were left out as
    /// already shared.
    pub fn finish_each(mut self, mut each: impl FnMut(&[Member])) -> u64 {
        self.occ.sort_unstable();
        // Blocks found once go first, in place, and their room is handed
        // back before the groups are built: the slice's blocks and its
        // groups were both alive here, the run's peak once the plan's own
        // arrays were freed early (heaptrack on FULL: 17.3 MB of blocks,
        // of which 3.4 MB in groups, beside 8.7 MB of groups).
        let mut kept = 0;
        let mut at = 0;
        while at < self.occ.len() {
            let fp = Occ::fp(self.occ[at]);
            let end = at + self.occ[at..].iter().take_while(|&&o| Occ::fp(o) == fp).count();
            if end - at > 1 {
                self.occ.copy_within(at..end, kept);
                kept += end - at;
            }
            at = end;
        }
        self.occ.truncate(kept);
        self.occ.shrink_to_fit();
        let ids = &self.ids;
        let mut one = BlockGroups::default();
        for g in self.occ.chunk_by(|&a, &b| Occ::fp(a) == Occ::fp(b)) {
            one.members.clear();
            one.ends.clear();
            one.push(g.iter().map(|&o| (ids[Occ::at(o)], Occ::block(o))));
            if !one.is_empty() {
                each(one.get(0));
            }
        }
        self.skipped
    }
}

/// The blocks of one file's map that a grouping takes, as `(block,
/// fingerprint, left out)`: those whose fingerprint `wanted` accepts (its
/// slices), below the packed block limit, and one of `keys` when given;
/// left out if in `skip` (see [`SliceGrouper::add`]): not grouped, counted.
pub fn blocks_to_group<'a>(
    map: &'a [u8],
    skip: &'a [(u64, u64)],
    keys: Option<&'a FxHashSet<Fp>>,
    wanted: impl Fn(Fp) -> bool + 'a,
) -> impl Iterator<Item = (u64, Fp, bool)> + 'a {
    let mut skipper = Skipper::new(skip);
    data_blocks_of(map)
        .filter(move |&(b, fp)| wanted(fp) && b < Occ::BLOCK_LIMIT && keys.is_none_or(|k| k.contains(&fp)))
        .map(move |(b, fp)| (b, fp, skipper.skips(b)))
}

/// Whether an incremental plan keeps a group: it holds a fresh file (or
/// the plan is not incremental).
pub fn keeps(fresh: Option<&HashSet<FileId>>, mut ids: impl Iterator<Item = FileId>) -> bool {
    fresh.is_none_or(|f| ids.any(|id| f.contains(&id)))
}

/// Every file of the whole-file groups and `files`, sorted, once each.
pub fn involved(whole: &[Vec<FileId>], files: &[FileId]) -> Vec<FileId> {
    let mut ids: Vec<FileId> = whole.iter().flatten().chain(files).copied().collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blockmap::BlockMap;

    fn map(seed: u64, n: u64) -> Vec<u64> {
        (1..=n).map(|i| ((seed * 1000 + i) << 36) | 1 << 32).collect()
    }

    fn pairs(g: &[Member]) -> Vec<(FileId, u64)> {
        g.iter().map(|m| m.pair()).collect()
    }

    fn sorted(g: BlockGroups) -> Vec<Vec<(FileId, u64)>> {
        let mut g: Vec<Vec<(FileId, u64)>> = g.iter().map(pairs).collect();
        g.iter_mut().for_each(|x| x.sort());
        g.sort();
        g
    }

    fn group(files: &[(FileId, Vec<u8>)], slices: u32, keys: Option<&FxHashSet<Fp>>) -> Vec<Vec<(FileId, u64)>> {
        let mut out = BlockGroups::default();
        for s in 0..slices {
            let mut g = SliceGrouper::new(s, slices, keys);
            for (id, enc) in files {
                g.add(*id, enc, &[]);
            }
            g.finish(&mut out);
        }
        sorted(out)
    }

    #[test]
    fn block_groups_are_the_same_in_one_slice_or_several() {
        let (a, b) = (map(1, 40), map(2, 40));
        let mut c = a[10..30].to_vec();
        c.extend(&b[..7]);
        c.push(a[3]);
        let a3 = crate::blockmap::short_fp(a[3]);
        let files: Vec<(FileId, Vec<u8>)> = [a, b, c]
            .iter()
            .enumerate()
            .map(|(i, m)| (FileId(i as i64 + 1), BlockMap::from_fps(m).into_bytes()))
            .collect();
        let one = group(&files, 1, None);
        // a[3] twice, a[10..30] and b[..7]: every block of c is in a group.
        assert_eq!(one.len(), 20 + 7 + 1);
        assert_eq!(one, group(&files, 3, None));
        assert_eq!(slices_within(3 * GROUP_BUDGET, GROUP_BUDGET), 3);
        assert_eq!(slices_within(3 * GROUP_BUDGET + 1, GROUP_BUDGET), 4);
        assert_eq!(slices_within(0, GROUP_BUDGET), 1);
        // Keyed: only the fresh file's fingerprints.
        let mut pass = MapPass::new(u64::MAX);
        pass.add(&files[2].1, true);
        assert_eq!(pass.data_blocks, 28);
        assert_eq!(group(&files, 1, pass.keys()), one);
        let keys: FxHashSet<Fp> = [a3].into_iter().collect();
        assert_eq!(group(&files, 1, Some(&keys)), vec![vec![(FileId(1), 3), (FileId(3), 27)]]);
        // More fresh fingerprints than the budget: none kept, blocks counted.
        let mut over = MapPass::new(27);
        over.add(&files[2].1, true);
        assert!(over.keys().is_none() && over.data_blocks == 28);
        let mut stale = MapPass::new(27);
        stale.add(&files[2].1, false);
        assert!(stale.keys().is_some_and(|k| k.is_empty()));
    }

    #[test]
    fn blocks_left_out_are_not_grouped_but_counted() {
        let a = map(1, 10);
        let files: Vec<(FileId, Vec<u8>)> = (1..=3).map(|i| (FileId(i), BlockMap::from_fps(&a).into_bytes())).collect();
        let skip: [&[(u64, u64)]; 3] = [&[], &[(0, 10)], &[(2, 4), (8, 9)]];
        let (mut out, mut left_out) = (BlockGroups::default(), 0);
        for s in 0..2 {
            let mut g = SliceGrouper::new(s, 2, None);
            for ((id, enc), skip) in files.iter().zip(skip) {
                g.add(*id, enc, skip);
            }
            left_out += g.finish(&mut out);
        }
        // File 2 is left out whole, file 3 at blocks 2, 3 and 8: those
        // blocks of file 1 have no partner left.
        assert_eq!(left_out, 10 + 3);
        let sizes: Vec<usize> = sorted(out).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![2; 7]);
    }

    #[test]
    fn whole_files_group_by_size_and_map() {
        let keys = vec![(8, 1, FileId(3)), (8, 1, FileId(1)), (8, 2, FileId(2)), (9, 1, FileId(4)), (9, 1, FileId(5))];
        let whole = group_whole_files(keys);
        assert_eq!(whole, vec![(8, vec![FileId(1), FileId(3)]), (9, vec![FileId(4), FileId(5)])]);
        let ids: Vec<Vec<FileId>> = whole.into_iter().map(|g| g.1).collect();
        let blocks =
            BlockGroups::from(vec![vec![(FileId(1), 0), (FileId(7), 2)], vec![(FileId(8), 0), (FileId(9), 0)]]);
        assert_eq!(involved(&ids, &[7, 1, 9].map(FileId)), [1, 3, 4, 5, 7, 9].map(FileId).to_vec());
        let fresh: HashSet<FileId> = [FileId(7)].into_iter().collect();
        assert!(keeps(Some(&fresh), blocks.get(0).iter().map(|o| o.file())));
        assert!(!keeps(Some(&fresh), ids[0].iter().copied()));
        assert!(keeps(None, ids[0].iter().copied()));
        assert_eq!((partitions(0, 4), partitions(4, 4), partitions(5, 4)), (1, 1, 2));
    }

    #[test]
    fn flat_groups_keep_their_members_and_order() {
        let f = FileId;
        let all = vec![
            vec![(f(1), 0), (f(2), 0)],
            vec![(f(3), 5), (f(4), 6), (f(5), 7)],
            vec![(f(6), 1), (f(7), 1)],
            vec![(f(8), 2), (f(3), 9)],
        ];
        let g = BlockGroups::from(all.clone());
        assert_eq!((g.len(), pairs(g.get(1))), (4, all[1].clone()));
        assert_eq!(g.iter().map(pairs).collect::<Vec<_>>(), all);
        assert!(!g.is_empty() && BlockGroups::default().is_empty());
        // A member that does not fit is left out, and its group with it
        // when one member is left.
        let mut g = BlockGroups::default();
        g.push([(f(1), 0), (f(2), Member::LIMIT)]);
        g.push([(f(1), 0), (f(1 << 48), 3), (f(2), 1), (f(-1), 0)]);
        assert_eq!(g.iter().map(pairs).collect::<Vec<_>>(), vec![vec![(f(1), 0), (f(2), 1)]]);
    }

    #[test]
    fn members_pack_48_bit_ids_and_blocks_in_12_bytes() {
        assert_eq!(std::mem::size_of::<Member>(), 12);
        let max = Member::LIMIT - 1;
        for (id, b) in
            [(1, 0), (max as i64, max), (0x1234_5678_9abc, 0xfedc_ba98_7654), (1 << 32, 1 << 16), (7, 65_535)]
        {
            assert_eq!(Member::new(FileId(id), b).map(Member::pair), Some((FileId(id), b)));
        }
        assert_eq!(Member::new(FileId(max as i64 + 1), 0), None);
        assert_eq!(Member::new(FileId(1), max + 1), None);
        assert_eq!(Member::new(FileId(-5), 0), None);
    }
}
