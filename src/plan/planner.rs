//! The planner proper: a union-find over every data block of the files,
//! fed by whole-file groups and anchor groups, read out into ranges.

use rustc_hash::{FxHashMap, FxHashSet};

use super::map::MapView;
use super::unionfind::UnionFind;
use super::{Plan, PlanFile, PlanOptions, Range};
use crate::blockmap::{BlockMap, Fp};
use crate::file::FileId;

/// A stable digest of a file's size and block map: equal contents, equal
/// digests, in every process (SipHash with fixed keys). Orders files by
/// content, so that nothing the planner decides depends on row ids.
pub fn content_digest(size: u64, map: &BlockMap) -> u64 {
    use std::hash::{Hash, Hasher};
    #[allow(deprecated)] // SipHasher: fixed keys are the point here
    let mut h = std::hash::SipHasher::new();
    size.hash(&mut h);
    for (b, fp) in map.data_blocks() {
        (b, fp).hash(&mut h);
    }
    h.finish()
}

/// Position of a block: (file in canonical order, block index).
pub(super) type Loc = (u32, u64);

/// Where a file stands as a source; smaller is preferred: a tier (see
/// [`Planner::sources`]), then the larger file, then the content order
/// (which ends on the inode number).
type Preference = (u8, std::cmp::Reverse<u32>, u32);

/// The state of one planning: see [`super::plan`].
pub(super) struct Planner<'a> {
    /// The files in canonical order: by size, content digest, inode, so
    /// that the order the database returns them in never matters.
    pub(super) files: Vec<&'a PlanFile>,
    /// Their block maps, indexed for random access (same order).
    pub(super) maps: Vec<MapView<'a>>,
    /// Global number of each file's first data block; a block's number is
    /// `base[f] + its data index` (sparse files cost only their data).
    pub(super) base: Vec<u32>,
    /// Union-find over block numbers: blocks known to hold the same content.
    pub(super) uf: UnionFind,
    /// Diagonals already walked, `(file a, file b, block_b - block_a)` →
    /// intervals of `a`'s blocks covered, so that each stretch of a diagonal
    /// is walked once whatever the order of the anchors that lead to it.
    walked: FxHashMap<(u32, u32, i64), Vec<(u64, u64)>>,
    opts: PlanOptions,
}

impl<'a> Planner<'a> {
    pub(super) fn new(input: &'a [PlanFile], opts: PlanOptions) -> Planner<'a> {
        // (size, content digest, inode, id): the id only separates copies
        // that agree on everything else, whose order changes nothing.
        type Key = (u64, u64, u64, FileId);
        let mut keyed: Vec<(Key, &PlanFile)> =
            input.iter().map(|f| ((f.size, content_digest(f.size, &f.blocks), f.ino, f.id), f)).collect();
        keyed.sort_unstable_by_key(|k| k.0);
        let files: Vec<&PlanFile> = keyed.into_iter().map(|(_, f)| f).collect();
        let maps: Vec<MapView<'a>> = files.iter().map(|f| MapView::new(&f.blocks)).collect();
        let mut base = Vec::with_capacity(files.len());
        let mut total: u64 = 0;
        for m in &maps {
            base.push(total as u32);
            total += m.data_len() as u64;
        }
        assert!(total < u32::MAX as u64, "planner: {total} blocks of data in one plan (limit 2^32)");
        Planner { files, maps, base, uf: UnionFind::new(total as u32), walked: FxHashMap::default(), opts }
    }

    pub(super) fn fp(&self, (f, b): Loc) -> Fp {
        self.maps[f as usize].get(b)
    }

    pub(super) fn num(&self, (f, b): Loc) -> Option<u32> {
        Some(self.base[f as usize] + self.maps[f as usize].data_index(b)?)
    }

    /// Record that two blocks hold the same content.
    fn union(&mut self, a: u32, b: u32) {
        self.uf.union(a, b);
    }

    pub(super) fn whole_file_group(&mut self, ord: &FxHashMap<FileId, u32>, ids: &[FileId]) {
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
            let (data, len) = (self.maps[canon as usize].data_len(), self.maps[canon as usize].len());
            for k in 0..data {
                self.union(bc + k, bd + k);
            }
            // Only diagonal walks read this (sampled anchors); with exact
            // groups it was a map entry per copy kept to the plan's peak.
            if !self.opts.exact_groups {
                self.walked.entry((canon, d, 0)).or_default().push((0, len));
            }
        }
    }

    /// An exact group (every block with one fingerprint, as the database
    /// groups them): each member is joined with the first one whose tail
    /// agrees (a partial last block only with a partial last block of the
    /// same length). Read in place, never copied: one group can be every
    /// block of a file of one repeated block, and a sorted copy of it was
    /// 16 bytes a block at the plan's peak. The classes do not depend on
    /// the order of the unions, and the fingerprint checked against is the
    /// canonical first member's, so neither depends on the group's order.
    pub(super) fn exact_group(&mut self, ord: &FxHashMap<FileId, u32>, g: &[super::group::Member]) {
        let locs = || g.iter().filter_map(|m| Some((*ord.get(&m.file())?, m.block())));
        let Some(fp) = locs().filter(|&l| self.fp(l) != 0).min().map(|l| self.fp(l)) else { return };
        let mut firsts: Vec<Loc> = Vec::new();
        for l in locs() {
            if self.fp(l) != fp {
                continue;
            }
            match firsts.iter().find(|&&f| self.tails_compatible(f, l)) {
                Some(&f) => {
                    let (x, y) = (self.num(f).expect("data"), self.num(l).expect("data"));
                    self.union(x, y);
                }
                None => firsts.push(l),
            }
        }
    }

    /// A group of sampled anchors: walk the diagonals through its members.
    pub(super) fn anchor_group(&mut self, occ: &[Loc]) {
        let Some((&first, rest)) = occ.split_first() else { return };
        for &d in rest {
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
            if self.uf.find(x) == self.uf.find(y) {
                return;
            }
        }
        let key = (s.0, d.0, d.1 as i64 - s.1 as i64);
        if self.walked.get(&key).is_some_and(|iv| iv.iter().any(|&(lo, hi)| lo <= s.1 && s.1 < hi)) {
            return;
        }
        let ns = self.maps[s.0 as usize].len() as i64;
        let nd = self.maps[d.0 as usize].len() as i64;
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
    pub(super) fn loc(&self, g: u32) -> Loc {
        // The last file starting at or before `g` (files without data share
        // their base with the next one, so this is the one holding `g`).
        let f = self.base.partition_point(|&b| b <= g) - 1;
        (f as u32, self.maps[f].block_of(g - self.base[f]))
    }

    /// Read the classes out into ranges, ordered by source.
    pub(super) fn finish(mut self) -> Plan {
        let best = self.sources();
        let kept = self.windows(&best);
        let mut ranges = self.ranges(&best, &kept);
        ranges.sort_unstable_by_key(|r| (r.src, r.src_off, r.len, r.dest, r.dest_off));
        Plan { ranges }
    }

    /// Flatten the union-find and choose each class's source: class root →
    /// the block number of its source.
    ///
    /// On btrfs an extent is freed only when no block of it is referenced,
    /// so the copy to keep is the one whose extent stays referenced anyway.
    /// Two rules, modelling each file as one extent, and the one leaving
    /// fewer shared blocks pinned ([`Planner::pinned_estimate`]) wins (ties:
    /// the first):
    /// 1. files with a block no other copy has first (they keep an extent
    ///    whatever we do);
    /// 2. held files first; then files that stay even as destinations: more
    ///    blocks of their own than `rewrite_ratio` times their duplicates
    ///    (a tarball whose members are rarely 4 KiB-aligned); then wholly
    ///    duplicate files; then the rest (a disk image mostly made of files
    ///    found elsewhere: as a destination it is covered enough for its own
    ///    blocks to be rewritten and its extents freed, where as a source it
    ///    would pin the copies a tarball keeps too). A held file stays
    ///    too, but is ranked apart: as a destination it frees nothing for
    ///    certain (files outside the plan keep its extent; it is left
    ///    pending), where a file kept for its own blocks does so only as
    ///    the estimate models it, one extent: its copy may lie in an extent
    ///    of its own (an image written file by file), freed when shared
    ///    into. Ranked with them, the larger (the image) won.
    ///
    /// Both depend on the contents alone, never on names or row ids.
    fn sources(&mut self) -> Vec<u32> {
        let total = self.uf.parent.len() as u32;
        for g in 0..total {
            let r = self.uf.find(g);
            self.uf.parent[g as usize] = r;
        }
        // Class sizes, then how many blocks of each file nobody else has.
        let mut count = vec![0u32; total as usize];
        for g in 0..total as usize {
            count[self.uf.parent[g] as usize] += 1;
        }
        let n = self.files.len();
        let unique: Vec<u32> = (0..n)
            .map(|f| {
                let (b, len) = (self.base[f] as usize, self.maps[f].data_len() as usize);
                (b..b + len).filter(|&g| count[self.uf.parent[g] as usize] == 1).count() as u32
            })
            .collect();
        drop(count);
        let len = |f: usize| self.maps[f].data_len();
        // Held files first (their extents stay for files left out of the
        // plan), then files with blocks of their own.
        let held = |f: usize| self.files[f].held;
        let by_unique: Vec<Preference> = (0..n)
            .map(|f| (if held(f) { 0 } else { 1 + u8::from(unique[f] == 0) }, std::cmp::Reverse(len(f)), f as u32))
            .collect();
        // One choice of sources in memory at a time (4 bytes a block each):
        // the first is made again if it wins, a pass over the blocks.
        let a = self.pinned_estimate(&self.pick(&by_unique));
        let second = self.by_what_stays(&unique);
        if self.pinned_estimate(&second) < a {
            second
        } else {
            drop(second);
            self.pick(&by_unique)
        }
    }

    /// Rule 2 of [`Planner::sources`]: the files that stay on disk anyway
    /// (`kept`) are preferred as sources. A file stays when it has more
    /// blocks of its own than `rewrite_ratio` times its duplicates, or when
    /// a plan leaves it a source of blocks with too little shared into it
    /// to be freed by a rewrite (one disk image of two identical ones must
    /// keep its extents for the other). The kept set only grows, so this
    /// ends; a few rounds settle it on the corpora measured.
    fn by_what_stays(&self, unique: &[u32]) -> Vec<u32> {
        const ROUNDS: usize = 4;
        let ratio = self.opts.rewrite_ratio;
        let n = self.files.len();
        let len = |f: usize| self.maps[f].data_len();
        let mut kept: Vec<bool> =
            (0..n).map(|f| self.files[f].held || unique[f] as f64 > ratio * (len(f) - unique[f]) as f64).collect();
        let mut round = 0;
        loop {
            let pref: Vec<Preference> = (0..n)
                .map(|f| {
                    let tier = if self.files[f].held {
                        0
                    } else if kept[f] {
                        1
                    } else if unique[f] == 0 {
                        2
                    } else {
                        3
                    };
                    (tier, std::cmp::Reverse(len(f)), f as u32)
                })
                .collect();
            let best = self.pick(&pref);
            round += 1;
            let mut grew = false;
            for f in 0..n {
                let covered = self.covered(&best, f);
                let sources = u64::from(len(f) - unique[f]) - covered;
                if !kept[f] && sources > 0 && self.stays(len(f), covered) {
                    kept[f] = true;
                    grew = true;
                }
            }
            if !grew || round == ROUNDS {
                return best;
            }
        }
    }

    /// Blocks of file `f` that sources `best` share into it.
    fn covered(&self, best: &[u32], f: usize) -> u64 {
        let (b, len) = (self.base[f], self.maps[f].data_len());
        (b..b + len).filter(|&g| best[self.uf.parent[g as usize] as usize] != g).count() as u64
    }

    /// Whether a file of `len` data blocks, `covered` of them shared into
    /// it, keeps its extent (taken as one): its other blocks are more than
    /// `rewrite_ratio` times the covered ones (the executor's bookend rule).
    fn stays(&self, len: u32, covered: u64) -> bool {
        let rest = u64::from(len) - covered;
        covered == 0 || rest as f64 > self.opts.rewrite_ratio * covered as f64
    }

    /// The source of each class under preference `pref` (per file): the
    /// best file's first block in it. Files are visited best first, and a
    /// file's blocks in block order (they are numbered so), so the first
    /// member seen of a class is the one: no second array of who holds it.
    fn pick(&self, pref: &[Preference]) -> Vec<u32> {
        let mut best = vec![u32::MAX; self.uf.parent.len()]; // class root → chosen block number
        let mut order: Vec<u32> = (0..pref.len() as u32).collect();
        order.sort_unstable_by_key(|&f| pref[f as usize]);
        for f in order {
            let (b, len) = (self.base[f as usize], self.maps[f as usize].data_len());
            for g in b..b + len {
                let r = self.uf.parent[g as usize] as usize;
                if best[r] == u32::MAX {
                    best[r] = g;
                }
            }
        }
        best
    }

    /// Blocks that sources `best` would share but leave stored, each file
    /// taken as one extent ([`Planner::stays`]).
    fn pinned_estimate(&self, best: &[u32]) -> u64 {
        (0..self.files.len())
            .map(|f| {
                let covered = self.covered(best, f);
                if covered > 0 && self.stays(self.maps[f].data_len(), covered) {
                    covered
                } else {
                    0
                }
            })
            .sum()
    }

    /// Every block that is not its class's source or kept in a window
    /// ([`super::repeats`]), as ranges of consecutive blocks into
    /// consecutive source blocks; a range goes on through a window's blocks.
    fn ranges(&self, best: &[u32], kept: &FxHashSet<u32>) -> Vec<Range> {
        let mut ranges: Vec<Range> = Vec::new();
        let mut cur: Option<Stretch> = None;
        for df in 0..self.files.len() as u32 {
            for (k, (db, _)) in self.maps[df as usize].data().enumerate() {
                let g = self.base[df as usize] + k as u32;
                let src = best[self.uf.parent[g as usize] as usize];
                if src == g || (!kept.is_empty() && kept.contains(&g)) {
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
                    // Source and destination blocks are disjoint, so a
                    // window's blocks never overlap the range taken from them.
                    Some((cf, cb, csf, csb, n))
                        if cf == df && cb + n == db && self.in_window(kept, (csf, csb + n), g) =>
                    {
                        Some((cf, cb, csf, csb, n + 1))
                    }
                    other => {
                        if let Some(c) = other {
                            self.push_range(c, &mut ranges);
                        }
                        Some((df, db, sf, sb, 1))
                    }
                };
            }
        }
        if let Some(c) = cur {
            self.push_range(c, &mut ranges);
        }
        ranges
    }

    /// Whether block `at` is kept in a window and holds the content of
    /// block number `g`.
    fn in_window(&self, kept: &FxHashSet<u32>, at: Loc, g: u32) -> bool {
        !kept.is_empty()
            && self
                .num(at)
                .is_some_and(|h| kept.contains(&h) && self.uf.parent[h as usize] == self.uf.parent[g as usize])
    }

    /// The range of a stretch, unless it is shorter than `min_blocks` (and
    /// not a whole destination file).
    fn push_range(&self, (df, db, sf, sb, n): Stretch, ranges: &mut Vec<Range>) {
        let bs = self.opts.block_size;
        let (dfile, sfile) = (self.files[df as usize], self.files[sf as usize]);
        let len = ((db + n) * bs).min(dfile.size) - db * bs;
        let whole_file = db == 0 && len == dfile.size;
        if n < self.opts.min_blocks && !whole_file {
            return;
        }
        debug_assert!(sb * bs + len <= sfile.size);
        ranges.push(Range { src: sfile.id, src_off: sb * bs, len, dest: dfile.id, dest_off: db * bs });
    }
}

/// Consecutive destination blocks taken from consecutive source blocks:
/// (dest file, dest first block, src file, src first block, blocks).
type Stretch = (u32, u64, u32, u64, u64);
