//! Planning: which ranges to share, from which source, into which destinations.
//!
//! Pure logic, no I/O. In: per-file block fingerprint maps, groups of
//! whole-file duplicates, and groups of *anchor* occurrences (blocks whose
//! fingerprint is sampled into the database's index). Out: a [`Plan`], a list
//! of `(source range, destination range)` pairs with equal fingerprints.
//!
//! Every distinct duplicate content ends with exactly one copy, its
//! *source*. A match found on one anchor is extended forward and backward
//! along both files' block maps (the *diagonal*), tolerating short runs of
//! differing blocks, so a 4 KiB-granular match costs one index lookup, and
//! two VM images that differ in scattered blocks are matched in one pass.
//! Equal blocks are joined in a union-find, so whole-file groups, runs
//! inside images and repeats within one file that hold the same content end
//! in one class with one source, and no extent is kept alive by a chain of
//! copies. The plan depends on the data alone (see [`plan`]), and the source
//! is chosen by layout: the copy whose extent stays referenced anyway.

use rustc_hash::FxHashMap;

use crate::hash::ZERO_FP;

/// What the planner and the block maps keep of a block's fingerprint: the
/// high 32 bits of the 64-bit fingerprint, never 0 except for zero blocks.
/// Along a diagonal, a false equal has odds of 2^-32 per comparison, and the
/// kernel's compare catches it; anchor groups use the full 64 bits.
pub type Fp = u32;

/// The block-map fingerprint of a 64-bit fingerprint.
pub fn short_fp(fp64: u64) -> Fp {
    match fp64 {
        ZERO_FP => 0,
        f => ((f >> 32) as u32).max(1),
    }
}
use crate::file::FileId;

mod map;
pub use map::BlockMap;

/// One file as the planner sees it.
#[derive(Debug, Clone)]
pub struct PlanFile {
    pub id: FileId,
    /// Inode number: the last tie-break between copies with identical
    /// contents. Never the row id or the path: row ids follow the order in
    /// which hashing threads finished, and paths change with a rename; fresh
    /// copies of one volume image keep their inode numbers.
    pub ino: u64,
    pub size: u64,
    /// Fingerprint per block ([`short_fp`]), holes and zero blocks left out.
    pub blocks: BlockMap,
}

impl PlanFile {
    /// A file from one fingerprint per block (tests, benchmarks).
    pub fn dense(id: FileId, ino: u64, size: u64, blocks: &[Fp]) -> PlanFile {
        PlanFile { id, ino, size, blocks: BlockMap::from_dense(blocks) }
    }
}

/// Tunables of the planner.
#[derive(Debug, Clone, Copy)]
pub struct PlanOptions {
    pub block_size: u64,
    /// How many consecutive differing blocks an extension walks over before
    /// it gives up on a diagonal.
    pub gap_blocks: u64,
    /// Shortest range worth sharing, in blocks (a range that is a whole
    /// destination file is always kept).
    pub min_blocks: u64,
    /// The anchor groups hold every block with a given fingerprint (as
    /// `Db::plan` builds them), not a sample: their members are joined
    /// directly, without walking diagonals (which could find nothing more).
    pub exact_groups: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions { block_size: 4096, gap_blocks: 32, min_blocks: 1, exact_groups: false }
    }
}

/// One range to share: the destination's bytes become the source's extents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Range {
    pub src: FileId,
    pub src_off: u64,
    pub len: u64,
    pub dest: FileId,
    pub dest_off: u64,
}

/// The planner's output, ordered by source so the executor reads sources
/// sequentially.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub ranges: Vec<Range>,
}

impl Plan {
    /// Bytes the plan would share.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.len).sum()
    }
}

/// Sample rate of anchors: a block is an anchor when the low bits of its
/// fingerprint are zero, so identical blocks are sampled alike in every file.
pub const ANCHOR_SHIFT: u32 = 4;

const ANCHOR_MASK: Fp = (1 << ANCHOR_SHIFT) - 1;

/// Whether a block-map fingerprint is a sampled anchor.
pub fn is_sampled(fp: Fp) -> bool {
    fp != 0 && fp & ANCHOR_MASK == 0
}

/// Indices of the *sampled* anchors of `blocks`, the ones the database
/// indexes: every block whose fingerprint falls in 1/2^[`ANCHOR_SHIFT`] of
/// the hash space.
pub fn sampled_anchors(blocks: &[Fp]) -> impl Iterator<Item = u64> + '_ {
    blocks.iter().enumerate().filter(|(_, &fp)| is_sampled(fp)).map(|(i, _)| i as u64)
}

/// Index of the block with the smallest fingerprint, unless it is sampled
/// already: so that every file with data has at least one anchor, and two
/// small files that share most of their blocks share an anchor too. Found
/// again from the block maps at plan time, never stored.
pub fn min_anchor(blocks: &[Fp]) -> Option<u64> {
    let (i, &fp) = blocks.iter().enumerate().filter(|(_, &fp)| fp != 0).min_by_key(|(_, &fp)| fp)?;
    (fp & ANCHOR_MASK != 0).then_some(i as u64)
}

/// [`min_anchor`] of a sparse map: `(block, fingerprint)`.
pub fn min_anchor_sparse(map: &BlockMap) -> Option<(u64, Fp)> {
    let (b, fp) = map.data().min_by_key(|&(_, fp)| fp)?;
    (fp & ANCHOR_MASK != 0).then_some((b, fp))
}

/// Every anchor of `blocks`, sampled and smallest, in block order.
pub fn anchors(blocks: &[Fp]) -> Vec<u64> {
    let mut out: Vec<u64> = sampled_anchors(blocks).chain(min_anchor(blocks)).collect();
    out.sort_unstable();
    out
}

/// A stable digest of a file's size and block map: equal contents, equal
/// digests, in every process (SipHash with fixed keys). Orders files by
/// content, so that nothing the planner decides depends on row ids.
pub fn content_digest(size: u64, map: &BlockMap) -> u64 {
    use std::hash::{Hash, Hasher};
    #[allow(deprecated)] // SipHasher: fixed keys are the point here
    let mut h = std::hash::SipHasher::new();
    size.hash(&mut h);
    for (b, fp) in map.data() {
        (b, fp).hash(&mut h);
    }
    h.finish()
}

/// Position of a block: (file in canonical order, block index).
type Loc = (u32, u64);

/// Where a file stands as a source; smaller is preferred. Files with blocks
/// that no other copy has keep their extents referenced whatever we do
/// (images, tarballs, archives), so their copy of a shared block is the one
/// to keep; among those, and among wholly duplicate files, the larger
/// file, then the content order (which ends on the inode number).
type Preference = (bool, std::cmp::Reverse<u32>, u32);

struct Planner<'a> {
    /// The files in canonical order: by size, content digest, inode, so
    /// that the order the database returns them in never matters.
    files: Vec<&'a PlanFile>,
    /// Global number of each file's first data block; a block's number is
    /// `base[f] + its data index` (sparse files cost only their data).
    base: Vec<u32>,
    /// Union-find over block numbers: blocks known to hold the same content.
    parent: Vec<u32>,
    /// Diagonals already walked, `(file a, file b, block_b - block_a)` →
    /// intervals of `a`'s blocks covered, so that each stretch of a diagonal
    /// is walked once whatever the order of the anchors that lead to it.
    walked: FxHashMap<(u32, u32, i64), Vec<(u64, u64)>>,
    opts: PlanOptions,
}

impl<'a> Planner<'a> {
    fn new(input: &'a [PlanFile], opts: PlanOptions) -> Planner<'a> {
        // (size, content digest, inode, id): the id only separates copies
        // that agree on everything else, whose order changes nothing.
        type Key = (u64, u64, u64, FileId);
        let mut keyed: Vec<(Key, &PlanFile)> =
            input.iter().map(|f| ((f.size, content_digest(f.size, &f.blocks), f.ino, f.id), f)).collect();
        keyed.sort_unstable_by_key(|k| k.0);
        let files: Vec<&PlanFile> = keyed.into_iter().map(|(_, f)| f).collect();
        let mut base = Vec::with_capacity(files.len());
        let mut total: u64 = 0;
        for f in &files {
            base.push(total as u32);
            total += f.blocks.data_len() as u64;
        }
        assert!(total < u32::MAX as u64, "planner: {total} blocks of data in one plan (limit 2^32)");
        Planner { files, base, parent: (0..total as u32).collect(), walked: FxHashMap::default(), opts }
    }

    fn fp(&self, (f, b): Loc) -> Fp {
        self.files[f as usize].blocks.get(b)
    }

    fn num(&self, (f, b): Loc) -> Option<u32> {
        Some(self.base[f as usize] + self.files[f as usize].blocks.data_index(b)?)
    }

    fn find(&mut self, mut x: u32) -> u32 {
        while self.parent[x as usize] != x {
            let up = self.parent[self.parent[x as usize] as usize];
            self.parent[x as usize] = up;
            x = up;
        }
        x
    }

    /// Record that two blocks hold the same content. The representative
    /// is the smaller number: deterministic, though nothing depends on it.
    fn union(&mut self, a: u32, b: u32) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            let (lo, hi) = (ra.min(rb), ra.max(rb));
            self.parent[hi as usize] = lo;
        }
    }

    fn whole_file_group(&mut self, ord: &FxHashMap<FileId, u32>, ids: &[FileId]) {
        let mut members: Vec<u32> = ids.iter().filter_map(|id| ord.get(id).copied()).collect();
        members.sort_unstable();
        members.dedup();
        let Some((&canon, rest)) = members.split_first() else { return };
        let c = self.files[canon as usize];
        for &d in rest {
            let df = self.files[d as usize];
            if df.blocks != c.blocks || df.size != c.size {
                continue; // map hashes collided or rows disagree: never trust blindly
            }
            let (bc, bd) = (self.base[canon as usize], self.base[d as usize]);
            for k in 0..c.blocks.data_len() {
                self.union(bc + k, bd + k);
            }
            self.walked.entry((canon, d, 0)).or_default().push((0, c.blocks.len()));
        }
    }

    fn anchor_group(&mut self, occ: &[Loc]) {
        let Some(&first) = occ.first() else { return };
        if self.opts.exact_groups {
            // Every equal block is in the group: join each member with the
            // first one whose tail agrees (a partial last block only with a
            // partial last block of the same length).
            let mut firsts: Vec<Loc> = Vec::new();
            for &l in occ {
                match firsts.iter().find(|&&f| self.tails_compatible(f, l)) {
                    Some(&f) => {
                        let (x, y) = (self.num(f).expect("data"), self.num(l).expect("data"));
                        self.union(x, y);
                    }
                    None => firsts.push(l),
                }
            }
            return;
        }
        for &d in &occ[1..] {
            self.extend(first, d);
        }
        // Neighbours too: two images holding a tree's file also share what
        // lies around it, which the tree's copy cannot lead to.
        for w in occ.windows(2).skip(1) {
            self.extend(w[0], w[1]);
        }
    }

    /// Walk the diagonal through `s` and `d` both ways, joining every pair
    /// of equal blocks at the same distance from them, over gaps of up to
    /// `gap_blocks` differing blocks. A stretch already walked is skipped.
    fn extend(&mut self, s: Loc, d: Loc) {
        let (s, d) = if s <= d { (s, d) } else { (d, s) };
        if s == d {
            return;
        }
        // Repeats within one file already joined need no walk: a file of one
        // repeated block would otherwise walk itself once per repeat.
        if s.0 == d.0 {
            let (x, y) = (self.num(s).expect("data"), self.num(d).expect("data"));
            if self.find(x) == self.find(y) {
                return;
            }
        }
        let key = (s.0, d.0, d.1 as i64 - s.1 as i64);
        if self.walked.get(&key).is_some_and(|iv| iv.iter().any(|&(lo, hi)| lo <= s.1 && s.1 < hi)) {
            return;
        }
        let ns = self.files[s.0 as usize].blocks.len() as i64;
        let nd = self.files[d.0 as usize].blocks.len() as i64;
        let (mut lo, mut hi) = (s.1, s.1 + 1);
        for dir in [1i64, -1] {
            let mut k: i64 = if dir == 1 { 0 } else { -1 };
            let mut miss = 0u64;
            loop {
                let (si, di) = (s.1 as i64 + k, d.1 as i64 + k);
                if si < 0 || di < 0 || si >= ns || di >= nd {
                    break;
                }
                let (sl, dl) = ((s.0, si as u64), (d.0, di as u64));
                lo = lo.min(si as u64);
                hi = hi.max(si as u64 + 1);
                let (a, b) = (self.fp(sl), self.fp(dl));
                if a == b && a != 0 && self.tails_compatible(sl, dl) {
                    let (x, y) = (self.num(sl).expect("data"), self.num(dl).expect("data"));
                    self.union(x, y);
                    miss = 0;
                } else {
                    miss += 1;
                    if miss > self.opts.gap_blocks {
                        break;
                    }
                }
                k += dir;
            }
        }
        self.walked.entry(key).or_default().push((lo, hi));
    }

    /// A partial last block may only be shared with another partial last
    /// block of the same length (the kernel allows an unaligned length only
    /// when it ends at both files' EOF).
    fn tails_compatible(&self, a: Loc, b: Loc) -> bool {
        let tail = |(f, blk): Loc| -> Option<u64> {
            let file = self.files[f as usize];
            let end = (blk + 1) * self.opts.block_size;
            (end > file.size).then(|| file.size - blk * self.opts.block_size)
        };
        tail(a) == tail(b)
    }

    /// File and block of block number `g`.
    fn loc(&self, g: u32) -> Loc {
        // The last file starting at or before `g` (files without data share
        // their base with the next one, so this is the one holding `g`).
        let f = self.base.partition_point(|&b| b <= g) - 1;
        (f as u32, self.files[f].blocks.block_of(g - self.base[f]))
    }

    fn finish(mut self) -> Plan {
        let total = self.parent.len() as u32;
        for g in 0..total {
            let r = self.find(g);
            self.parent[g as usize] = r;
        }
        // Class sizes, then which files have blocks nobody else has.
        let mut count = vec![0u32; total as usize];
        for g in 0..total as usize {
            count[self.parent[g] as usize] += 1;
        }
        let n = self.files.len();
        let mut has_unique = vec![false; n];
        for (f, u) in has_unique.iter_mut().enumerate() {
            let (b, len) = (self.base[f] as usize, self.files[f].blocks.data_len() as usize);
            *u = (b..b + len).any(|g| count[self.parent[g] as usize] == 1);
        }
        let pref =
            |f: usize| -> Preference { (!has_unique[f], std::cmp::Reverse(self.files[f].blocks.data_len()), f as u32) };
        // The source of each class: the best file's first block in it.
        // Blocks are numbered in file order, then block order, so the first
        // member seen of the best file is its lowest block.
        let mut best = count; // reused: class root → chosen block number
        best.fill(u32::MAX);
        let mut best_file = vec![0u32; total as usize]; // class root → its file
        for f in 0..n {
            let (b, len) = (self.base[f], self.files[f].blocks.data_len());
            let p = pref(f);
            for g in b..b + len {
                let r = self.parent[g as usize] as usize;
                if best[r] == u32::MAX || p < pref(best_file[r] as usize) {
                    best[r] = g;
                    best_file[r] = f as u32;
                }
            }
        }
        drop(best_file);
        let bs = self.opts.block_size;
        let mut ranges: Vec<Range> = Vec::new();
        // (dest file, dest first block, src file, src first block, blocks)
        let mut cur: Option<(u32, u64, u32, u64, u64)> = None;
        let flush = |c: (u32, u64, u32, u64, u64), ranges: &mut Vec<Range>| {
            let (df, db, sf, sb, n) = c;
            let (dfile, sfile) = (self.files[df as usize], self.files[sf as usize]);
            let len = ((db + n) * bs).min(dfile.size) - db * bs;
            let whole_file = db == 0 && len == dfile.size;
            if n < self.opts.min_blocks && !whole_file {
                return;
            }
            debug_assert!(sb * bs + len <= sfile.size);
            ranges.push(Range { src: sfile.id, src_off: sb * bs, len, dest: dfile.id, dest_off: db * bs });
        };
        for df in 0..n as u32 {
            let file = self.files[df as usize];
            for (k, (db, _)) in file.blocks.data().enumerate() {
                let g = self.base[df as usize] + k as u32;
                let src = best[self.parent[g as usize] as usize];
                if src == g {
                    continue;
                }
                let (sf, sb) = self.loc(src);
                cur = match cur {
                    Some((cf, cb, csf, csb, n))
                        if cf == df && cb + n == db && csf == sf && csb + n == sb
                        // within one file, source and destination must not overlap
                        && (csf != cf || (cb + n < csb || csb + n < cb)) =>
                    {
                        Some((cf, cb, csf, csb, n + 1))
                    }
                    other => {
                        if let Some(c) = other {
                            flush(c, &mut ranges);
                        }
                        Some((df, db, sf, sb, 1))
                    }
                };
            }
        }
        if let Some(c) = cur {
            flush(c, &mut ranges);
        }
        ranges.sort_unstable_by_key(|r| (r.src, r.src_off, r.len, r.dest, r.dest_off));
        Plan { ranges }
    }
}

/// Build the plan. `whole_groups` are sets of files with equal size and
/// block map; `anchor_groups` are the occurrences of one anchor fingerprint
/// each. The result is a function of the files' contents, sizes and inode
/// numbers alone: the order of files and groups and the file ids do not
/// change which blocks are shared or which copy is the source.
///
/// Every block that equals another one found through a whole-file group or
/// an anchor ends in one class (union-find), whatever mix of whole files,
/// runs inside images and repeats within a file led to it; each class has
/// one source and every other member is a destination of it.
pub fn plan(
    files: &[PlanFile],
    whole_groups: &[Vec<FileId>],
    anchor_groups: &[Vec<(FileId, u64)>],
    opts: PlanOptions,
) -> Plan {
    let mut p = Planner::new(files, opts);
    let ord: FxHashMap<FileId, u32> = p.files.iter().enumerate().map(|(i, f)| (f.id, i as u32)).collect();
    // Whole-file groups in content order (a group's first member is its
    // smallest in canonical order).
    let mut whole: Vec<Vec<u32>> = whole_groups
        .iter()
        .map(|g| {
            let mut m: Vec<u32> = g.iter().filter_map(|id| ord.get(id).copied()).collect();
            m.sort_unstable();
            m
        })
        .collect();
    whole.sort_unstable();
    for g in &whole {
        let ids: Vec<FileId> = g.iter().map(|&i| p.files[i as usize].id).collect();
        p.whole_file_group(&ord, &ids);
    }
    // Anchor groups in a canonical order: by fingerprint, then occurrences.
    let mut groups: Vec<(Fp, Vec<Loc>)> = anchor_groups
        .iter()
        .filter_map(|g| {
            let mut occ: Vec<Loc> = g
                .iter()
                .filter_map(|(id, b)| {
                    let f = *ord.get(id)?;
                    (p.fp((f, *b)) != 0).then_some((f, *b))
                })
                .collect();
            occ.sort_unstable();
            occ.dedup();
            let fp = p.fp(*occ.first()?);
            occ.retain(|&l| p.fp(l) == fp);
            (occ.len() > 1).then_some((fp, occ))
        })
        .collect();
    groups.sort_unstable();
    for (_, occ) in &groups {
        p.anchor_group(occ);
    }
    p.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const BS: u64 = 4096;

    fn file(id: i64, blocks: &[Fp]) -> PlanFile {
        PlanFile::dense(FileId(id), id as u64, blocks.len() as u64 * BS, blocks)
    }

    fn dense(f: &PlanFile) -> Vec<Fp> {
        (0..f.blocks.len()).map(|b| f.blocks.get(b)).collect()
    }

    /// Anchor groups the way the database builds them: every anchor
    /// fingerprint that occurs more than once.
    fn anchor_groups(files: &[PlanFile]) -> Vec<Vec<(FileId, u64)>> {
        let mut by_fp: HashMap<Fp, Vec<(FileId, u64)>> = HashMap::new();
        for f in files {
            let blocks = dense(f);
            for i in anchors(&blocks) {
                by_fp.entry(blocks[i as usize]).or_default().push((f.id, i));
            }
        }
        let mut g: Vec<_> = by_fp.into_values().filter(|v| v.len() > 1).collect();
        g.sort();
        g
    }

    /// Every block as an anchor: what the planner finds when sampling misses nothing.
    fn all_blocks_groups(files: &[PlanFile]) -> Vec<Vec<(FileId, u64)>> {
        let mut by_fp: HashMap<Fp, Vec<(FileId, u64)>> = HashMap::new();
        for f in files {
            for (i, fp) in f.blocks.data() {
                by_fp.entry(fp).or_default().push((f.id, i));
            }
        }
        let mut g: Vec<_> = by_fp.into_values().filter(|v| v.len() > 1).collect();
        g.sort();
        g
    }

    fn r(src: i64, src_blk: u64, blocks: u64, dest: i64, dest_blk: u64) -> Range {
        Range { src: FileId(src), src_off: src_blk * BS, len: blocks * BS, dest: FileId(dest), dest_off: dest_blk * BS }
    }

    /// A pseudo-random fingerprint stream (xorshift), never zero.
    fn fps(seed: u64, n: usize) -> Vec<Fp> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                short_fp(x | 0x100)
            })
            .collect()
    }

    fn shared_blocks(p: &Plan) -> u64 {
        p.bytes() / BS
    }

    #[test]
    fn table_of_simple_cases() {
        struct Case {
            name: &'static str,
            files: Vec<PlanFile>,
            want: Vec<Range>,
        }
        let cases = vec![
            Case { name: "no duplicates", files: vec![file(1, &[1, 2]), file(2, &[3, 4])], want: vec![] },
            Case {
                // The larger file keeps its extents and is the source.
                name: "shared first half",
                files: vec![file(1, &[1, 2, 3, 4, 5]), file(2, &[1, 2, 7, 8])],
                want: vec![r(1, 0, 2, 2, 0)],
            },
            Case {
                name: "shifted by one block",
                files: vec![file(1, &[1, 2, 3, 4]), file(2, &[9, 1, 2, 3, 4])],
                want: vec![r(2, 1, 4, 1, 0)],
            },
            Case {
                name: "zero blocks are never matched",
                files: vec![file(1, &[1, 0, 2]), file(2, &[1, 0, 2])],
                want: vec![r(1, 0, 1, 2, 0), r(1, 2, 1, 2, 2)],
            },
            Case {
                name: "repeat inside one file, no overlap",
                files: vec![file(1, &[5, 6, 5, 6])],
                want: vec![r(1, 0, 2, 1, 2)],
            },
        ];
        for c in cases {
            let got = plan(&c.files, &[], &all_blocks_groups(&c.files), PlanOptions::default());
            assert_eq!(got.ranges, c.want, "case {}", c.name);
        }
    }

    #[test]
    fn a_partly_matched_copy_is_the_source() {
        // File 1 is wholly a copy; file 2 also holds blocks of its own, so its
        // extent stays referenced anyway: it is the source, whatever the ids.
        for (a, b) in [(1, 2), (2, 1)] {
            let files = vec![file(a, &[1, 2, 3]), file(b, &[1, 2, 3, 4])];
            let got = plan(&files, &[], &all_blocks_groups(&files), PlanOptions::default());
            assert_eq!(got.ranges, vec![r(b, 0, 3, a, 0)]);
        }
    }

    #[test]
    fn whole_file_group_maps_every_copy_to_the_oldest() {
        let files = vec![file(3, &[1, 2, 3]), file(1, &[1, 2, 3]), file(2, &[1, 2, 3])];
        let got = plan(&files, &[vec![FileId(3), FileId(1), FileId(2)]], &[], PlanOptions::default());
        assert_eq!(got.ranges, vec![r(1, 0, 3, 2, 0), r(1, 0, 3, 3, 0)]);
    }

    #[test]
    fn chains_resolve_to_one_root() {
        // 2 shares a run with 1, 3 shares the same run with 2 only through
        // anchors found in 2: everything must point at 1.
        let files = vec![file(1, &[1, 2, 3]), file(2, &[9, 1, 2, 3]), file(3, &[1, 2, 3, 8])];
        let got = plan(&files, &[], &all_blocks_groups(&files), PlanOptions::default());
        assert!(got.ranges.iter().all(|r| r.src == got.ranges[0].src), "{got:?}");
        assert_eq!(shared_blocks(&got), 6);
    }

    #[test]
    fn partial_tail_only_matches_a_partial_tail_of_the_same_length() {
        let mut a = file(1, &[1, 2]);
        a.size = BS + 100;
        let mut b = file(2, &[1, 2]);
        b.size = BS + 100;
        let got =
            plan(&[a.clone(), b], &[], &all_blocks_groups(&[a.clone(), file(2, &[1, 2])]), PlanOptions::default());
        assert_eq!(got.ranges, vec![Range { src: FileId(1), src_off: 0, len: BS + 100, dest: FileId(2), dest_off: 0 }]);
        // Same fingerprint but a full block on one side: only block 0 matches.
        let c = file(3, &[1, 2]);
        let got = plan(&[a.clone(), c.clone()], &[], &all_blocks_groups(&[a, c]), PlanOptions::default());
        assert_eq!(got.ranges, vec![r(1, 0, 1, 3, 0)]);
    }

    #[test]
    fn sampled_anchors_find_two_percent_changed_images() {
        let n = 20_000;
        let a = fps(7, n);
        let mut b = a.clone();
        let noise = fps(99, n);
        let mut changed = 0;
        for i in 0..n {
            if noise[i].is_multiple_of(50) {
                b[i] = noise[i] ^ 0xdead_0001;
                changed += 1;
            }
        }
        let files = vec![file(1, &a), file(2, &b)];
        let got = plan(&files, &[], &anchor_groups(&files), PlanOptions::default());
        let want = (n - changed) as u64;
        assert!(shared_blocks(&got) >= want * 99 / 100, "found {} of {want}", shared_blocks(&got));
        assert!(shared_blocks(&got) <= want);
    }

    #[test]
    fn sampled_anchors_find_shifted_and_half_shared_copies() {
        let a = fps(11, 5000);
        let mut shifted = vec![42];
        shifted.extend_from_slice(&a);
        let mut half = a[..2500].to_vec();
        half.extend(fps(12, 2500));
        let files = vec![file(1, &a), file(2, &shifted), file(3, &half)];
        let got = plan(&files, &[], &anchor_groups(&files), PlanOptions::default());
        // The shifted copy is the largest file with blocks of its own.
        assert_eq!(shared_blocks(&got), 5000 + 2500);
        assert!(got.ranges.contains(&r(2, 1, 5000, 1, 0)), "{got:?}");
        assert!(got.ranges.contains(&r(2, 1, 2500, 3, 0)), "{got:?}");
    }

    #[test]
    fn min_blocks_drops_short_ranges() {
        let files = vec![file(1, &[1, 2, 3, 4, 5]), file(2, &[1, 9, 3, 4, 5])];
        let opts = PlanOptions { min_blocks: 2, ..Default::default() };
        let got = plan(&files, &[], &all_blocks_groups(&files), opts);
        assert_eq!(got.ranges, vec![r(1, 2, 3, 2, 2)]);
    }

    #[test]
    fn every_file_with_data_has_an_anchor() {
        assert_eq!(anchors(&[0, 0]), Vec::<u64>::new());
        assert_eq!(anchors(&[3 | 1]).len(), 1);
        let big = fps(5, 16000);
        let n = anchors(&big).len();
        assert!((800..1300).contains(&n), "{n} anchors of 16000");
    }

    /// Anchor groups the way `Db::plan` builds them: sampled anchors, each
    /// file's smallest anchor, and every block equal to a smallest anchor.
    fn db_like_groups(files: &[PlanFile]) -> Vec<Vec<(FileId, u64)>> {
        let mut by_fp: HashMap<Fp, Vec<(FileId, u64)>> = HashMap::new();
        let mins: std::collections::HashSet<Fp> =
            files.iter().filter_map(|f| min_anchor_sparse(&f.blocks)).map(|m| m.1).collect();
        for f in files {
            for (b, fp) in f.blocks.data() {
                if is_sampled(fp) || mins.contains(&fp) {
                    by_fp.entry(fp).or_default().push((f.id, b));
                }
            }
        }
        let mut g: Vec<_> = by_fp.into_values().filter(|v| v.len() > 1).collect();
        g.sort();
        g
    }

    /// Where each destination block's content is kept: `(dest, block)` →
    /// `(src, block)`.
    fn sources(p: &Plan) -> HashMap<(FileId, u64), (FileId, u64)> {
        let mut out = HashMap::new();
        for r in &p.ranges {
            for k in 0..r.len.div_ceil(BS) {
                out.insert((r.dest, r.dest_off / BS + k), (r.src, r.src_off / BS + k));
            }
        }
        out
    }

    #[test]
    fn whole_file_pair_and_the_same_content_in_two_images_keep_one_copy() {
        // X: a 3-block file in two trees (a whole-file group) and inside two
        // images at different offsets, each image also holding data of its
        // own. None of X's blocks is a sampled anchor.
        let x: Vec<Fp> = vec![0x1001, 0x2001, 0x3001];
        let mut i1 = fps(21, 40);
        i1.splice(10..10, x.iter().copied());
        let mut i2 = fps(22, 50);
        i2.splice(31..31, x.iter().copied());
        let (i1, i2): (Vec<Fp>, Vec<Fp>) =
            (i1.into_iter().map(|f| f | 1).collect(), i2.into_iter().map(|f| f | 1).collect());
        let files = vec![file(1, &x), file(2, &x), file(3, &i1), file(4, &i2)];
        let got = plan(&files, &[vec![FileId(1), FileId(2)]], &db_like_groups(&files), PlanOptions::default());
        let src = sources(&got);
        // Every copy of X's block k, but one, is a destination, and all point
        // at that one: four copies, one source each block.
        let copies = |k: u64| [(FileId(1), k), (FileId(2), k), (FileId(3), 10 + k), (FileId(4), 31 + k)];
        for k in 0..3 {
            let dests: Vec<_> = copies(k).into_iter().filter(|c| src.contains_key(c)).collect();
            assert_eq!(dests.len(), 3, "block {k}: {got:?}");
            let roots: std::collections::HashSet<_> = dests.iter().map(|c| src[c]).collect();
            assert_eq!(roots.len(), 1, "block {k}: {got:?}");
            let root = *roots.iter().next().unwrap();
            assert!(copies(k).contains(&root) && !src.contains_key(&root));
            // An image keeps its extents anyway: it is the source.
            assert!(root.0 == FileId(3) || root.0 == FileId(4), "{got:?}");
        }
        assert_eq!(shared_blocks(&got), 9);
    }

    #[test]
    fn a_block_repeated_inside_one_file_is_shared_even_in_a_whole_file_group() {
        let files = vec![file(1, &[5, 6, 7, 5, 6, 8])];
        let got = plan(&files, &[], &db_like_groups(&files), PlanOptions::default());
        assert_eq!(got.ranges, vec![r(1, 0, 2, 1, 3)]);
        // The same file twice: one copy of 5 and of 6 for all four places.
        let files = vec![file(1, &[5, 6, 7, 5, 6, 8]), file(2, &[5, 6, 7, 5, 6, 8])];
        let got = plan(&files, &[vec![FileId(1), FileId(2)]], &db_like_groups(&files), PlanOptions::default());
        assert_eq!(shared_blocks(&got), 6 + 2, "{got:?}");
        let src = sources(&got);
        let roots: std::collections::HashSet<_> =
            [(1, 0), (1, 3), (2, 0), (2, 3)].iter().filter_map(|&(f, b)| src.get(&(FileId(f), b))).collect();
        assert_eq!(roots.len(), 1, "{got:?}");
    }

    /// A mixed input: images holding files at various offsets, whole copies,
    /// repeats, holes, unaligned tails.
    fn mixed(seed: u64) -> Vec<PlanFile> {
        let mut rng = crate::corpus::Rng::new(seed);
        let mut contents: Vec<Vec<Fp>> = (0..12).map(|i| fps(seed * 100 + i, 1 + rng.below(8) as usize)).collect();
        for i in 0..4 {
            let mut img = fps(seed * 100 + 50 + i, 30);
            for _ in 0..6 {
                let c = &contents[rng.below(12) as usize];
                let at = rng.below(img.len() as u64) as usize;
                img.splice(at..at, c.iter().copied());
                if rng.below(3) == 0 {
                    img.splice(at..at, [0, 0, 0]);
                }
            }
            contents.push(img);
        }
        let mut files = Vec::new();
        let mut id = 0;
        for c in &contents {
            for _ in 0..1 + rng.below(3) {
                id += 1;
                files.push(file(id, c));
            }
        }
        files
    }

    fn whole_groups(files: &[PlanFile]) -> Vec<Vec<FileId>> {
        let mut by: HashMap<(u64, Vec<Fp>), Vec<FileId>> = HashMap::new();
        for f in files {
            by.entry((f.size, dense(f))).or_default().push(f.id);
        }
        by.into_values().filter(|g| g.len() > 1).collect()
    }

    /// The plan in terms of inode numbers, which survive a new database.
    fn by_ino(files: &[PlanFile], p: &Plan) -> Vec<(u64, u64, u64, u64, u64)> {
        let ino: HashMap<FileId, u64> = files.iter().map(|f| (f.id, f.ino)).collect();
        let mut v: Vec<_> =
            p.ranges.iter().map(|r| (ino[&r.src], r.src_off, r.len, ino[&r.dest], r.dest_off)).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn permuting_input_order_and_file_ids_gives_the_identical_plan() {
        for seed in 1..6 {
            let files = mixed(seed);
            let want = plan(&files, &whole_groups(&files), &db_like_groups(&files), PlanOptions::default());
            assert!(shared_blocks(&want) > 0);
            let mut rng = crate::corpus::Rng::new(seed + 1000);
            for _ in 0..4 {
                // New ids (as rows written in another order), files and
                // groups in another order; inode numbers stay.
                let mut perm: Vec<PlanFile> = files.clone();
                for i in (1..perm.len()).rev() {
                    perm.swap(i, rng.below(i as u64 + 1) as usize);
                }
                for (i, f) in perm.iter_mut().enumerate() {
                    f.id = FileId(1000 + i as i64);
                }
                let mut groups = db_like_groups(&perm);
                groups.reverse();
                for g in &mut groups {
                    g.reverse();
                }
                let got = plan(&perm, &whole_groups(&perm), &groups, PlanOptions::default());
                assert_eq!(by_ino(&perm, &got), by_ino(&files, &want), "seed {seed}");
            }
        }
    }

    #[test]
    fn every_duplicate_block_of_the_mixed_input_keeps_exactly_one_copy() {
        for seed in 1..6 {
            let files = mixed(seed);
            // Every block an anchor: what is found is then everything (with
            // sampling, a fragment of a file split inside an image by more
            // than the gap and holding no anchor is missed).
            let got = plan(&files, &whole_groups(&files), &all_blocks_groups(&files), PlanOptions::default());
            // Distinct contents after the plan: each block is either a source
            // or not mentioned (kept) or a destination; count what stays.
            let src = sources(&got);
            let mut kept: HashMap<Fp, usize> = HashMap::new();
            let mut copies: HashMap<Fp, usize> = HashMap::new();
            for f in &files {
                for (b, fp) in f.blocks.data() {
                    *copies.entry(fp).or_default() += 1;
                    if !src.contains_key(&(f.id, b)) {
                        *kept.entry(fp).or_default() += 1;
                    }
                }
            }
            for (fp, n) in &kept {
                assert_eq!(*n, 1, "seed {seed}: content {fp:#x} ({} copies) kept {n} times", copies[fp]);
            }
        }
    }

    #[test]
    fn sparse_files_of_8_tib_are_planned_by_their_data_alone() {
        // Two files of 2^31 blocks (8 TiB): four blocks at the start and
        // four at the end, the rest holes; the second's data is also in a
        // small file. Holes are never expanded (this would need 16 GiB).
        let end = 1u64 << 31;
        let enc = |fps: &[u32]| -> Vec<u8> {
            let mut w: Vec<u32> = fps[..4].to_vec();
            w.extend([0, (end - 8) as u32]);
            w.extend(&fps[4..]);
            w.iter().flat_map(|x| x.to_le_bytes()).collect()
        };
        let data: Vec<Fp> = (1..=8).map(|i| i * 0x101).collect();
        let big = |id: i64| PlanFile {
            id: FileId(id),
            ino: id as u64,
            size: end * BS,
            blocks: BlockMap::from_blob(&enc(&data)),
        };
        let small = file(3, &data[4..]);
        let files = vec![big(1), big(2), small];
        let got = plan(&files, &[vec![FileId(1), FileId(2)]], &db_like_groups(&files), PlanOptions::default());
        let src = sources(&got);
        assert_eq!(shared_blocks(&got), 8 + 4, "{got:?}");
        let tail: std::collections::HashSet<_> =
            [(1, end - 4), (2, end - 4), (3, 0)].iter().filter_map(|&(f, b)| src.get(&(FileId(f), b))).collect();
        assert_eq!(tail.len(), 1, "{got:?}");
    }

    #[test]
    fn exact_groups_joined_directly_plan_what_walking_them_plans() {
        for seed in 1..6 {
            let files = mixed(seed);
            let groups = all_blocks_groups(&files);
            let walked = plan(&files, &whole_groups(&files), &groups, PlanOptions::default());
            let exact = PlanOptions { exact_groups: true, ..Default::default() };
            assert_eq!(plan(&files, &whole_groups(&files), &groups, exact), walked, "seed {seed}");
        }
    }
}
