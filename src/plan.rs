//! Planning: which ranges to share, from which source, into which destinations.
//!
//! Pure logic, no I/O. In: per-file block fingerprint maps, groups of
//! whole-file duplicates, and groups of *anchor* occurrences (blocks whose
//! fingerprint is sampled into the database's index). Out: a [`Plan`], a list
//! of `(source range, destination range)` pairs with equal fingerprints.
//!
//! Every duplicate block is given exactly one *root*: the copy all others
//! will share. A match found on one anchor is extended forward and backward
//! along both files' block maps (the *diagonal*), tolerating short runs of
//! differing blocks, so a 4 KiB-granular match costs one index lookup, and
//! two VM images that differ in scattered blocks are matched in one pass.
//! Roots are resolved transitively (A→B, B→C becomes A→C, B→C), so the order
//! in which the executor runs the ranges does not matter and no extent is
//! kept alive by a chain of copies.

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
use crate::types::FileId;

/// One file as the planner sees it.
#[derive(Debug, Clone)]
pub struct PlanFile {
    pub id: FileId,
    /// Preference as a source: the lowest rank in a group keeps its extents
    /// and every other copy shares them. The database ranks files hashed by
    /// earlier runs first (they are already shared among themselves), then
    /// by path, so the choice is deterministic.
    pub rank: u64,
    pub size: u64,
    /// Fingerprint per block ([`short_fp`]); 0 for holes and zero blocks.
    pub blocks: Vec<Fp>,
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
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions { block_size: 4096, gap_blocks: 32, min_blocks: 1 }
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

/// Indices of the *sampled* anchors of `blocks`, the ones the database
/// indexes: every block whose fingerprint falls in 1/2^[`ANCHOR_SHIFT`] of
/// the hash space.
pub fn sampled_anchors(blocks: &[Fp]) -> impl Iterator<Item = u64> + '_ {
    blocks.iter().enumerate().filter(|(_, &fp)| fp != 0 && fp & ANCHOR_MASK == 0).map(|(i, _)| i as u64)
}

/// Index of the block with the smallest fingerprint, unless it is sampled
/// already: so that every file with data has at least one anchor, and two
/// small files that share most of their blocks share an anchor too. Found
/// again from the block maps at plan time, never stored.
pub fn min_anchor(blocks: &[Fp]) -> Option<u64> {
    let (i, &fp) = blocks.iter().enumerate().filter(|(_, &fp)| fp != 0).min_by_key(|(_, &fp)| fp)?;
    (fp & ANCHOR_MASK != 0).then_some(i as u64)
}

/// Every anchor of `blocks`, sampled and smallest, in block order.
pub fn anchors(blocks: &[Fp]) -> Vec<u64> {
    let mut out: Vec<u64> = sampled_anchors(blocks).chain(min_anchor(blocks)).collect();
    out.sort_unstable();
    out
}

type Loc = (u32, u64); // (index into files, block index)

struct Planner<'a> {
    files: &'a [PlanFile],
    index: FxHashMap<FileId, u32>,
    /// Every linked block → its root. The hottest map of a run: FxHash,
    /// because the keys are small integers chosen by us, not by an attacker.
    parent: FxHashMap<Loc, Loc>,
    opts: PlanOptions,
}

impl Planner<'_> {
    fn fp(&self, (f, b): Loc) -> Fp {
        self.files[f as usize].blocks[b as usize]
    }

    fn find(&self, mut at: Loc) -> Loc {
        while let Some(&p) = self.parent.get(&at) {
            at = p;
        }
        at
    }

    /// Make `dst` share `src` (through `src`'s root). Refuses when `dst`
    /// already has a root, or when that would close a cycle.
    fn link(&mut self, dst: Loc, src: Loc) -> bool {
        if dst == src || self.parent.contains_key(&dst) {
            return false;
        }
        let root = self.find(src);
        if root == dst {
            return false;
        }
        self.parent.insert(dst, root);
        true
    }

    fn whole_file_group(&mut self, ids: &[FileId]) {
        let mut members: Vec<u32> = ids.iter().filter_map(|id| self.index.get(id).copied()).collect();
        members.sort_unstable_by_key(|&i| self.files[i as usize].rank);
        let Some((&canon, rest)) = members.split_first() else { return };
        for &d in rest {
            if self.files[d as usize].blocks != self.files[canon as usize].blocks {
                continue; // digests collided or rows disagree: never trust blindly
            }
            for b in 0..self.files[d as usize].blocks.len() as u64 {
                if self.fp((d, b)) != 0 {
                    self.link((d, b), (canon, b));
                }
            }
        }
    }

    fn anchor_group(&mut self, occurrences: &[(FileId, u64)]) {
        let mut occ: Vec<Loc> = occurrences
            .iter()
            .filter_map(|(id, b)| {
                let f = *self.index.get(id)?;
                ((*b as usize) < self.files[f as usize].blocks.len()).then_some((f, *b))
            })
            .collect();
        occ.sort_unstable_by_key(|&(f, b)| (self.files[f as usize].rank, b));
        occ.dedup();
        let Some((&canon, rest)) = occ.split_first() else { return };
        let fp = self.fp(canon);
        if fp == 0 {
            return;
        }
        for &d in rest {
            if self.fp(d) != fp || self.parent.contains_key(&d) {
                continue;
            }
            self.extend(canon, d);
        }
    }

    /// Walk the diagonal through `s` and `d` both ways, linking every block
    /// of `d`'s side that equals the block at the same distance on `s`'s side.
    fn extend(&mut self, s: Loc, d: Loc) {
        let ns = self.files[s.0 as usize].blocks.len() as i64;
        let nd = self.files[d.0 as usize].blocks.len() as i64;
        for dir in [1i64, -1] {
            let mut k: i64 = if dir == 1 { 0 } else { -1 };
            let mut miss = 0u64;
            loop {
                let (si, di) = (s.1 as i64 + k, d.1 as i64 + k);
                if si < 0 || di < 0 || si >= ns || di >= nd {
                    break;
                }
                let (sl, dl) = ((s.0, si as u64), (d.0, di as u64));
                let (a, b) = (self.fp(sl), self.fp(dl));
                if a == b && a != 0 && sl != dl && self.tails_compatible(sl, dl) {
                    self.link(dl, sl);
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
    }

    /// A partial last block may only be shared with another partial last
    /// block of the same length (the kernel allows an unaligned length only
    /// when it ends at both files' EOF).
    fn tails_compatible(&self, a: Loc, b: Loc) -> bool {
        let tail = |(f, blk): Loc| -> Option<u64> {
            let file = &self.files[f as usize];
            let end = (blk + 1) * self.opts.block_size;
            (end > file.size).then(|| file.size - blk * self.opts.block_size)
        };
        tail(a) == tail(b)
    }

    fn finish(self) -> Plan {
        let bs = self.opts.block_size;
        let mut dests: Vec<Loc> = self.parent.keys().copied().collect();
        dests.sort_unstable();
        let mut ranges: Vec<Range> = Vec::new();
        // (dest file, dest first block, src file, src first block, blocks)
        let mut cur: Option<(u32, u64, u32, u64, u64)> = None;
        let flush = |c: (u32, u64, u32, u64, u64), ranges: &mut Vec<Range>| {
            let (df, db, sf, sb, n) = c;
            let (dfile, sfile) = (&self.files[df as usize], &self.files[sf as usize]);
            let len = ((db + n) * bs).min(dfile.size) - db * bs;
            let whole_file = db == 0 && len == dfile.size;
            if n < self.opts.min_blocks && !whole_file {
                return;
            }
            debug_assert!(sb * bs + len <= sfile.size);
            ranges.push(Range { src: sfile.id, src_off: sb * bs, len, dest: dfile.id, dest_off: db * bs });
        };
        for d in dests {
            let r = self.find(d);
            cur = match cur {
                Some((df, db, sf, sb, n))
                    if df == d.0 && db + n == d.1 && sf == r.0 && sb + n == r.1
                        // within one file, source and destination must not overlap
                        && (sf != df || (db + n < sb || sb + n < db)) =>
                {
                    Some((df, db, sf, sb, n + 1))
                }
                other => {
                    if let Some(c) = other {
                        flush(c, &mut ranges);
                    }
                    Some((d.0, d.1, r.0, r.1, 1))
                }
            };
        }
        if let Some(c) = cur {
            flush(c, &mut ranges);
        }
        ranges.sort_unstable_by_key(|r| (r.src, r.src_off, r.len, r.dest, r.dest_off));
        Plan { ranges }
    }
}

/// Build the plan. `whole_groups` are sets of files with equal size and
/// digest; `anchor_groups` are the occurrences of one anchor fingerprint each.
pub fn plan(
    files: &[PlanFile],
    whole_groups: &[Vec<FileId>],
    anchor_groups: &[Vec<(FileId, u64)>],
    opts: PlanOptions,
) -> Plan {
    let index = files.iter().enumerate().map(|(i, f)| (f.id, i as u32)).collect();
    let mut p = Planner { files, index, parent: FxHashMap::default(), opts };
    for g in whole_groups {
        p.whole_file_group(g);
    }
    for g in anchor_groups {
        p.anchor_group(g);
    }
    p.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const BS: u64 = 4096;

    fn file(id: i64, blocks: &[Fp]) -> PlanFile {
        PlanFile { id: FileId(id), rank: id as u64, size: blocks.len() as u64 * BS, blocks: blocks.to_vec() }
    }

    /// Anchor groups the way the database builds them: every anchor
    /// fingerprint that occurs more than once.
    fn anchor_groups(files: &[PlanFile]) -> Vec<Vec<(FileId, u64)>> {
        let mut by_fp: HashMap<Fp, Vec<(FileId, u64)>> = HashMap::new();
        for f in files {
            for i in anchors(&f.blocks) {
                by_fp.entry(f.blocks[i as usize]).or_default().push((f.id, i));
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
            for (i, &fp) in f.blocks.iter().enumerate() {
                if fp != 0 {
                    by_fp.entry(fp).or_default().push((f.id, i as u64));
                }
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
                name: "shared first half",
                files: vec![file(1, &[1, 2, 3, 4]), file(2, &[1, 2, 7, 8])],
                want: vec![r(1, 0, 2, 2, 0)],
            },
            Case {
                name: "shifted by one block",
                files: vec![file(1, &[1, 2, 3, 4]), file(2, &[9, 1, 2, 3, 4])],
                want: vec![r(1, 0, 4, 2, 1)],
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
    fn lowest_rank_is_the_source() {
        let mut files = vec![file(1, &[1, 2, 3]), file(2, &[1, 2, 3])];
        files[1].rank = 0;
        let got = plan(&files, &[vec![FileId(1), FileId(2)]], &[], PlanOptions::default());
        assert_eq!(got.ranges, vec![r(2, 0, 3, 1, 0)]);
        let got = plan(&files, &[], &all_blocks_groups(&files), PlanOptions::default());
        assert_eq!(got.ranges, vec![r(2, 0, 3, 1, 0)]);
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
        assert!(got.ranges.iter().all(|r| r.src == FileId(1)), "{got:?}");
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
        assert_eq!(shared_blocks(&got), 5000 + 2500);
        assert!(got.ranges.contains(&r(1, 0, 5000, 2, 1)));
        assert!(got.ranges.contains(&r(1, 0, 2500, 3, 0)));
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
}
