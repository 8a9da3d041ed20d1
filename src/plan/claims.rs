//! Blocks already shared: which blocks the plan need not group.
//!
//! The scan records, for each file, the runs of its blocks that lie in
//! extents FIEMAP showed shared (`hash::FileHash::shared_runs`: a reflinked
//! clone, a writable snapshot, a file deduplicated before). Two files whose
//! runs cover the same physical block hold the same bytes there in one
//! place on disk: grouping both would cost memory (12 bytes a member for
//! the whole plan, 16 while grouping) to plan a range the share phase then
//! finds already shared. Each shared physical block is therefore *claimed*,
//! per owner salt, by one file, the one of lowest file key (volume key,
//! inode), and every other file's block there is left out of the groups
//! and counted as already shared; a file's repeat of its own block stays
//! (the planner keeps windows of long repeats). Sixty-four reflinked
//! near-copies of a 1 GiB image took 437 MiB to plan, every block grouped
//! 65 times; now they take what their differing blocks take.
//!
//! The owner is chosen by file key, not by row id or the order rows are
//! read: the plan stays a function of the data (see [`super::plan`]).
//! Pure: the database streams the runs in, [`super::from_db`] asks what
//! to skip and which files hold extents for others ([`held`]). Memory
//! follows the number of runs, not of blocks, and is bounded
//! ([`RUN_BUDGET`]).

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::blockmap::Fp;
use crate::file::{FileId, FileKey, IdSet};
use crate::hash::SharedRun;

/// Most runs claimed in one plan. A run costs about 200 bytes while the
/// claims are built (the run, its claimed interval, the skips it makes),
/// a block grouped 12 bytes for the whole plan and 16 while grouping: a
/// run of one block saves less than it costs, one of sixteen far more. So
/// the plan claims runs of every length while they are few (FULL rerun
/// after a dedupe: most are short, tarball members), and past this many
/// only the longer ones ([`RunCounts::shortest`]): a user who fragments a
/// file into one-block reflinks costs the plan what such a file always
/// did, at most ~50 MB more.
pub const RUN_BUDGET: u64 = 1 << 18;

/// The shortest run lengths tried, in blocks, shortest first; runs of the
/// last are claimed whatever their number (each saves more than it costs).
const MIN_LENGTHS: [u64; 5] = [1, 2, 4, 8, 16];

/// How many runs are at least each of [`MIN_LENGTHS`] long.
#[derive(Debug, Default)]
pub struct RunCounts([u64; MIN_LENGTHS.len()]);

impl RunCounts {
    /// Count a file's runs.
    pub fn add(&mut self, runs: &[SharedRun]) {
        for r in runs {
            for (n, &min) in self.0.iter_mut().zip(&MIN_LENGTHS) {
                *n += u64::from(r.2 >= min);
            }
        }
    }

    /// The shortest length whose runs number at most `budget` (the longest
    /// tried when none does).
    pub fn shortest(&self, budget: u64) -> u64 {
        MIN_LENGTHS.iter().zip(self.0).find(|&(_, n)| n <= budget).map_or(MIN_LENGTHS[MIN_LENGTHS.len() - 1], |p| *p.0)
    }
}

/// Which blocks of which files another file's claim covers.
#[derive(Debug, Default)]
pub struct Claims {
    /// Per file, its left-out blocks as sorted, disjoint `[start, end)`.
    skip: FxHashMap<FileId, Vec<(u64, u64)>>,
    /// Sum of their lengths.
    blocks: u64,
    /// The files holding extents another file's run also covers (see
    /// [`held`]).
    held: FxHashSet<FileId>,
    /// The files an earlier run shared ranges from (`Db::sources`).
    sources: IdSet,
}

impl Claims {
    /// Claims from every file's `(id, file key, owner salt, runs)`, in any
    /// order. Files of different owner salts never claim each other's
    /// blocks: their fingerprints never meet in a group, so leaving one
    /// out for the other would only lose its savings (a user who reflinks
    /// a file they can read must not keep root's copies from being shared).
    pub fn build(files: impl IntoIterator<Item = (FileId, FileKey, Fp, Vec<SharedRun>)>) -> Claims {
        let mut runs: Vec<((Fp, FileKey, FileId), SharedRun)> = files
            .into_iter()
            .flat_map(|(id, key, salt, runs)| runs.into_iter().map(move |r| ((salt, key, id), r)))
            .collect();
        // By owner salt, then lowest file key (volume, inode: a writable
        // snapshot's files have their origin's inode numbers) first; a
        // file's runs in file order. Never by row id, which follows the
        // order hashing threads finished in.
        runs.sort_unstable();
        let mut claimed = Intervals::default();
        let mut salt = None;
        let mut out = Claims::default();
        // Physical ranges: of every run, and of what each file claimed.
        let mut all: Vec<(u64, u64, FileId)> = Vec::with_capacity(runs.len());
        let mut mine: Vec<(u64, u64, FileId)> = Vec::new();
        for ((s, _, id), (block, phys, n)) in runs {
            if salt != Some(s) {
                (salt, claimed) = (Some(s), Intervals::default());
            }
            let Some(end) = phys.checked_add(n) else { continue };
            // A file's own repeat of a block it claimed stays: the planner
            // keeps a window of a long repeat unshared on purpose (see
            // `plan/repeats.rs`), which it must see the repeat to do.
            for (s, e, _) in claimed.covered(phys, end).into_iter().filter(|c| c.2 != id) {
                out.skip.entry(id).or_default().push((block + (s - phys), block + (e - phys)));
                out.blocks += e - s;
            }
            mine.extend(claimed.insert(phys, end, id).into_iter().map(|(s, e)| (s, e, id)));
            all.push((phys, end, id));
        }
        out.held = held(all, &mine);
        for v in out.skip.values_mut() {
            v.sort_unstable();
            // Ranges left out for different owners may touch: one range.
            v.dedup_by(|next, prev| {
                let touches = next.0 <= prev.1;
                if touches {
                    prev.1 = prev.1.max(next.1);
                }
                touches
            });
        }
        out
    }

    /// The blocks of `id` left out, sorted `[start, end)` ranges.
    pub fn skips(&self, id: FileId) -> &[(u64, u64)] {
        self.skip.get(&id).map_or(&[], Vec::as_slice)
    }

    /// These claims, and the files an earlier run shared ranges from
    /// (`Db::sources`): those hold extents for others too, though no run
    /// of theirs says so. Sharing changes no time, so neither such a file
    /// nor its copies was hashed again, and their runs are those of before
    /// (none, for files copied with `cp`). A nightly run that meets a new
    /// copy of them would otherwise take the new file, larger or with
    /// blocks of its own, as the source and make them destinations, whose
    /// extents their copies outside the batch keep: a VM image's new copy
    /// beside the image shared into a tree's files freed 36 MiB of 204.
    pub fn with_sources(self, sources: IdSet) -> Claims {
        Claims { sources, ..self }
    }

    /// Whether `id` holds extents for others (see [`held`], and
    /// [`Claims::with_sources`]): the planner prefers such a file as a
    /// source (`PlanFile::held`).
    pub fn is_held(&self, id: FileId) -> bool {
        self.held.contains(&id) || self.sources.contains(id)
    }

    /// How many blocks are left out in all (an upper bound of the data
    /// blocks: a run may hold zero blocks, which are never grouped).
    pub fn blocks(&self) -> u64 {
        self.blocks
    }
}

/// The files holding extents for others: a part a file claimed (`mine`)
/// that another file's run (`all`, any owner salt) covers too. That other
/// file keeps the extent on disk whatever the plan does with this one, so
/// sharing this one into a copy would free nothing: the planner prefers
/// it as a source. Owners do not matter here: a user's reflink of root's
/// file keeps root's extent as surely as root's own clone does.
fn held(mut all: Vec<(u64, u64, FileId)>, mine: &[(u64, u64, FileId)]) -> FxHashSet<FileId> {
    all.sort_unstable();
    // Over the ranges sorted by start: the two furthest ends of distinct
    // files among the first i + 1.
    let mut top: Vec<[(u64, Option<FileId>); 2]> = Vec::with_capacity(all.len());
    let mut cur = [(0, None), (0, None)];
    for &(_, end, f) in &all {
        if cur[0].1 == Some(f) {
            cur[0].0 = cur[0].0.max(end);
        } else if end > cur[0].0 {
            cur = [(end, Some(f)), cur[0]];
        } else if cur[1].1 == Some(f) || end > cur[1].0 {
            cur[1] = (cur[1].0.max(end), Some(f));
        }
        top.push(cur);
    }
    let mut out = FxHashSet::default();
    for &(s, e, f) in mine {
        let n = all.partition_point(|r| r.0 < e);
        let Some(t) = n.checked_sub(1).map(|i| top[i]) else { continue };
        if t.iter().any(|&(end, g)| end > s && g.is_some_and(|g| g != f)) {
            out.insert(f);
        }
    }
    out
}

/// Where fresh files lie on disk, per owner salt: an incremental plan
/// groups only the fresh files' fingerprints, so it claims only there
/// (its claims then cost what the fresh data does, not the volume).
#[derive(Debug, Default)]
pub struct Region(FxHashMap<Fp, Intervals>);

impl Region {
    /// Add a fresh file's runs.
    pub fn add(&mut self, salt: Fp, runs: &[SharedRun]) {
        let set = self.0.entry(salt).or_default();
        for &(_, phys, n) in runs {
            if let Some(end) = phys.checked_add(n) {
                set.insert(phys, end, FileId(0));
            }
        }
    }

    /// The parts of `runs` inside the region.
    pub fn clip(&self, salt: Fp, runs: &[SharedRun]) -> Vec<SharedRun> {
        let Some(set) = self.0.get(&salt) else { return Vec::new() };
        let mut out = Vec::new();
        for &(block, phys, n) in runs {
            let Some(end) = phys.checked_add(n) else { continue };
            out.extend(set.covered(phys, end).into_iter().map(|(s, e, _)| (block + (s - phys), s, e - s)));
        }
        out
    }
}

/// A cursor over one file's left-out ranges, asked about blocks in
/// increasing order (as a block map yields them).
pub struct Skipper<'s> {
    ranges: &'s [(u64, u64)],
}

impl<'s> Skipper<'s> {
    /// Over `ranges` (see [`Claims::skips`]).
    pub fn new(ranges: &'s [(u64, u64)]) -> Skipper<'s> {
        Skipper { ranges }
    }

    /// Whether block `b` is left out; `b` never decreases between calls.
    pub fn skips(&mut self, b: u64) -> bool {
        while let Some(&(_, end)) = self.ranges.first() {
            if b < end {
                break;
            }
            self.ranges = &self.ranges[1..];
        }
        self.ranges.first().is_some_and(|&(start, _)| b >= start)
    }
}

/// Disjoint `[start, end)` intervals of physical blocks, each with the
/// file that claimed it; adjacent ones of one file merged.
#[derive(Debug, Default)]
struct Intervals(BTreeMap<u64, (u64, FileId)>);

impl Intervals {
    /// The parts of `[s, e)` already claimed, in order, with their owners.
    fn covered(&self, s: u64, e: u64) -> Vec<(u64, u64, FileId)> {
        let first = self.0.range(..=s).next_back().map_or(s, |(&k, _)| k);
        self.0.range(first..e).map(|(&a, &(b, owner))| (a.max(s), b.min(e), owner)).filter(|&(a, b, _)| a < b).collect()
    }

    /// Claim what is still free of `[s, e)` for `owner`; returns those parts.
    fn insert(&mut self, s: u64, e: u64, owner: FileId) -> Vec<(u64, u64)> {
        let mut free = Vec::new();
        let mut at = s;
        for (a, b, _) in self.covered(s, e) {
            if at < a {
                free.push((at, a));
            }
            at = b;
        }
        if at < e {
            free.push((at, e));
        }
        for &(mut a, mut b) in &free {
            // Merge with a neighbour of the same owner on either side.
            if let Some((&pa, &(pb, po))) = self.0.range(..a).next_back() {
                if pb == a && po == owner {
                    self.0.remove(&pa);
                    a = pa;
                }
            }
            if let Some(&(nb, no)) = self.0.get(&b) {
                if no == owner {
                    self.0.remove(&b);
                    b = nb;
                }
            }
            self.0.insert(a, (b, owner));
        }
        free
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ino: u64) -> FileKey {
        FileKey { volume: 5, ino }
    }

    #[test]
    fn the_lowest_inode_keeps_each_shared_block_whatever_the_order() {
        let (a, b, c) = (FileId(1), FileId(2), FileId(3));
        // b (inode 5) and c (inode 9) are clones of a's (inode 7) blocks
        // 0..10 at physical 100; c also holds physical 104..108 a second
        // time at its blocks 20..24, and at 30..32 and again at 40..42 a
        // run at 500 nobody else has (its own repeat: kept for the planner).
        // d (inode 1, another owner: salt 3) holds the same blocks and
        // changes nothing for them, nor they for it.
        let d = FileId(4);
        let files = vec![
            (a, key(7), 1, vec![(0, 100, 10)]),
            (b, key(5), 1, vec![(0, 100, 4), (6, 106, 4)]),
            (d, key(1), 3, vec![(0, 100, 10)]),
            (c, key(9), 1, vec![(0, 100, 10), (20, 104, 4), (30, 500, 2), (40, 500, 2)]),
        ];
        let mut rev = files.clone();
        rev.reverse();
        for input in [files, rev] {
            let claims = Claims::build(input);
            assert_eq!(claims.skips(b), &[] as &[(u64, u64)]);
            assert_eq!(claims.skips(d), &[] as &[(u64, u64)]);
            assert_eq!(claims.skips(a), &[(0, 4), (6, 10)]);
            assert_eq!(claims.skips(c), &[(0, 10), (20, 24)]);
            assert_eq!(claims.blocks(), 8 + 10 + 4);
            let mut s = Skipper::new(claims.skips(a));
            let left: Vec<u64> = (0..12).filter(|&blk| !s.skips(blk)).collect();
            assert_eq!(left, vec![4, 5, 10, 11]);
            // b holds 100..104 and 106..110 for a and c, a holds 104..106
            // for c, and d, of another owner, keeps all of them on disk
            // too (as they keep d's); nobody else has c's 500..502.
            let held: Vec<FileId> = [a, b, c, d].into_iter().filter(|&id| claims.is_held(id)).collect();
            assert_eq!(held, vec![a, b, d]);
        }
        assert_eq!(Claims::build(Vec::new()).blocks(), 0);
    }

    #[test]
    fn held_files_are_those_whose_claims_another_file_covers() {
        let f = FileId;
        // 0..10 by 1 and 2; 20..30 by 1 alone, 25..26 by 3; 40..50 by 4
        // and 4 again (a file's own repeat holds nothing for others).
        let all = vec![(0, 10, f(1)), (0, 10, f(2)), (20, 30, f(1)), (25, 26, f(3)), (40, 50, f(4)), (40, 45, f(4))];
        let mine = vec![(0, 10, f(1)), (20, 30, f(1)), (40, 50, f(4))];
        assert_eq!(held(all.clone(), &mine).into_iter().collect::<Vec<_>>(), vec![f(1)]);
        // Only 20..30 claimed by 1: 3's run inside it holds it.
        assert_eq!(held(all.clone(), &[(20, 30, f(1))]).len(), 1);
        assert_eq!(held(all.clone(), &[(26, 30, f(1))]).len(), 0);
        assert_eq!(held(all, &[(40, 50, f(4))]).len(), 0);
    }

    #[test]
    fn a_snapshots_file_and_its_origin_are_told_apart_by_volume_not_row() {
        // Same inode number in two subvolumes; the row ids in either order.
        let (origin, snap) = (FileKey { volume: 256, ino: 300 }, FileKey { volume: 257, ino: 300 });
        for (x, y) in [(FileId(1), FileId(2)), (FileId(2), FileId(1))] {
            let claims = Claims::build(vec![(x, snap, 1, vec![(0, 50, 20)]), (y, origin, 1, vec![(0, 50, 20)])]);
            assert_eq!((claims.skips(x), claims.skips(y)), (&[(0, 20)][..], &[][..]));
        }
    }

    #[test]
    fn many_short_runs_are_left_to_grouping() {
        let mut c = RunCounts::default();
        c.add(&[(0, 0, 1), (0, 0, 3), (0, 0, 16), (0, 0, 40)]);
        assert_eq!(c.0, [4, 3, 2, 2, 2]);
        assert_eq!((c.shortest(4), c.shortest(3), c.shortest(2), c.shortest(0)), (1, 2, 4, 16));
    }

    #[test]
    fn an_incremental_region_clips_runs_to_the_fresh_files_places() {
        let mut r = Region::default();
        r.add(1, &[(0, 100, 10), (50, 300, 5)]);
        r.add(3, &[(0, 1000, 4)]);
        // Another salt's places do not count; parts outside are dropped.
        assert_eq!(r.clip(1, &[(0, 95, 10), (40, 200, 1), (60, 302, 10)]), vec![(5, 100, 5), (60, 302, 3)]);
        assert_eq!(r.clip(3, &[(7, 100, 10)]), vec![]);
        assert_eq!(r.clip(9, &[(7, 100, 10)]), vec![]);
    }

    #[test]
    fn intervals_keep_their_owners_and_merge_within_one() {
        let (x, y) = (FileId(1), FileId(2));
        let mut i = Intervals::default();
        i.insert(10, 20, x);
        i.insert(30, 40, x);
        assert_eq!(i.covered(0, 50), vec![(10, 20, x), (30, 40, x)]);
        assert_eq!(i.covered(15, 35), vec![(15, 20, x), (30, 35, x)]);
        assert_eq!(i.covered(20, 30), vec![]);
        // y gets only what is free, x's parts stay x's.
        i.insert(18, 32, y);
        assert_eq!(i.covered(0, 100), vec![(10, 20, x), (20, 30, y), (30, 40, x)]);
        i.insert(40, 41, x);
        i.insert(41, 45, x);
        assert_eq!(i.covered(35, 100), vec![(35, 45, x)]);
        assert_eq!(i.0.len(), 3);
        // A run past the end of the address space is ignored, not wrapped.
        let claims = Claims::build(vec![(FileId(1), key(1), 1, vec![(0, u64::MAX, 2)])]);
        assert_eq!(claims.blocks(), 0);
    }
}
