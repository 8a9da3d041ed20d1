//! Which files the first grouping links into components: sets of files no
//! group links to any other set, each planned the same alone or with
//! others ([`super::from_db`]). A few dozen bytes a file in some group,
//! nothing a block.
//!
//! A block map keeps 48 bits of each block's fingerprint, so N distinct
//! blocks give about N² / 2⁴⁹ false pairs: two blocks of two files that
//! only look equal. The kernel's compare refuses them, but each one linked
//! two unrelated files, and a component is planned whole, its files' maps
//! in memory. At 1 TiB of distinct data (268 M blocks, ~128 false pairs)
//! that joined most large files of a volume into one component: 256
//! files of 4 GiB in pairs sharing an eighth each planned in 2.9 GB
//! instead of one pair at a time (`examples/plan_scale.rs`). So a group
//! of exactly two blocks of two files not linked yet, neither file small
//! ([`SMALL_FILE`]), links them only when a second such pair of the same
//! two files comes: a false pair is alone, two large files that share data
//! share more than one block, and a block held three times is no accident.
//! Small files link on one pair, as before: their lone shared blocks are
//! real and common (the identical last block of two HTML pages, a one-block
//! file inside an image: 366 such pairs on FULL), and one costs its
//! component next to nothing. The pair groups left unlinked are not
//! planned (see [`Links::unproven`]): a lone 4 KiB between two large files.
//!
//! Linking does not need where a block is, so its groupers take each block
//! of a small file as block 0 and any other as block 1 ([`mark`]).

use rustc_hash::{FxHashMap, FxHashSet};

use crate::blockmap::runs_of;

use super::group::{Member, WholeGroup};
use super::unionfind::UnionFind;
use crate::file::FileId;

/// Files of at most this many data blocks (256 KiB) link on one lone pair
/// of blocks.
pub(super) const SMALL_FILE: u64 = 64;

/// How linking takes every block of a file (encoded map): 0 for a small
/// file, 1 for any other.
pub(super) fn mark(map: &[u8]) -> u64 {
    let mut blocks = 0;
    u64::from(runs_of(map).any(|r| {
        blocks += r.len();
        blocks > SMALL_FILE
    }))
}

/// The block groups' files, linked.
#[derive(Default)]
pub(super) struct Links {
    /// Each file in some group, numbered in the order first met.
    index: FxHashMap<FileId, u32>,
    /// Per number, its file and its blocks in groups.
    files: Vec<(FileId, u64)>,
    /// Over the numbers.
    uf: UnionFind,
    /// Pairs of numbers seen in one lone pair of blocks, not linked yet.
    pending: FxHashSet<(u32, u32)>,
}

/// One component: its files in block groups, each with its blocks in
/// groups, and the whole-file groups whose first copy is one of them.
#[derive(Debug, Default)]
pub(super) struct Component {
    pub files: Vec<(FileId, u64)>,
    pub whole: Vec<WholeGroup>,
}

impl Links {
    /// Link the files of one group (see the module's comment).
    pub fn add(&mut self, g: &[Member]) {
        if let [a, b] = g {
            let (x, y) = (self.number(a.file()), self.number(b.file()));
            self.files[x as usize].1 += 1;
            self.files[y as usize].1 += 1;
            if !self.unproven((x, a.block()), (y, b.block())) {
                self.uf.union(x, y);
            }
            return;
        }
        let first = self.number(g[0].file());
        for o in g {
            let n = self.number(o.file());
            self.files[n as usize].1 += 1;
            self.uf.union(first, n);
        }
    }

    /// Whether a group of two blocks alone, each given as its file's number
    /// and its mark, is one lone pair that does not link their files
    /// (yet): two files not linked, neither small ([`mark`]), and no such
    /// pair of the two seen before. The plan drops such a group where it
    /// joins two components ([`super::from_db`]), so that a plan in batches
    /// is the plan in one piece.
    fn unproven(&mut self, (x, a): (u32, u64), (y, b): (u32, u64)) -> bool {
        if x == y || a == 0 || b == 0 || self.uf.find(x) == self.uf.find(y) {
            return false;
        }
        let pair = (x.min(y), x.max(y));
        !self.pending.remove(&pair) && self.pending.insert(pair)
    }

    fn number(&mut self, id: FileId) -> u32 {
        let next = self.files.len() as u32;
        let n = *self.index.entry(id).or_insert(next);
        if n == next {
            self.files.push((id, 0));
            self.uf.add();
        }
        n
    }

    /// Whether `id` is in some group.
    pub fn has(&self, id: FileId) -> bool {
        self.index.contains_key(&id)
    }

    /// The components, each with the whole-file groups whose first copy is
    /// one of its files (`joined`), in the order of their first file.
    pub fn components(mut self, joined: Vec<WholeGroup>) -> Vec<Component> {
        let mut comps: FxHashMap<u32, Component> = FxHashMap::default();
        for (n, &file) in self.files.iter().enumerate() {
            comps.entry(self.uf.find(n as u32)).or_default().files.push(file);
        }
        for (size, g) in joined {
            let c = self.uf.find(self.index[&g[0]]);
            comps.entry(c).or_default().whole.push((size, g));
        }
        let mut out: Vec<(u32, Component)> = comps.into_iter().collect();
        out.sort_unstable_by_key(|c| c.0);
        out.into_iter().map(|c| c.1).collect()
    }
}

/// One part of a component too large to plan in one piece (see
/// [`Component::split`]).
#[derive(Debug)]
pub(super) struct Part {
    /// The part's files and whole-file groups, the hub first.
    pub component: Component,
    /// In parts after the first, the hub and the last file of the part
    /// before: planned whole in a part before, they are taken as the
    /// sources of all they hold, and nothing is shared into them again.
    pub planned: Vec<FileId>,
}

impl Component {
    /// Blocks in groups, all its files together.
    pub fn weight(&self) -> u64 {
        self.files.iter().map(|f| f.1).sum()
    }

    /// A component of more than `budget` blocks in groups, in parts of
    /// about that many: its *hub* (the file with the most blocks in groups;
    /// ties by inode number, then row id), the last file of the part before
    /// (its *bridge*), and more of the other files in inode order. A
    /// component within the budget, or of two files, is one part.
    ///
    /// Why: a component is planned whole, its files' maps and the
    /// planner's arrays in memory (about 16 bytes a block), so a golden VM
    /// image and twenty 40 GiB clones of it, one component, took GBs.
    /// The first part is planned as any batch is. In each part after it,
    /// the planner takes the hub and the bridge as the sources of all they
    /// hold (`PlanFile::held`), and shares nothing into them again (both
    /// were planned whole in a part before: that only submitted the same
    /// bytes twice). So each part shares into the extents the parts before
    /// left them in: the copies of a block the hub holds end in one
    /// extent, and so do those of a block that files next to each other in
    /// inode order hold (a chain of copies each made from the one before
    /// and changed a little, like backups of one image: a block the hub
    /// never held is carried from part to part by the bridges). Splitting
    /// loses the duplicates of two files in different parts that neither
    /// the hub nor a bridge holds.
    pub fn split(mut self, budget: u64, ino: impl Fn(FileId) -> u64) -> Vec<Part> {
        let key = |f: &(FileId, u64)| (std::cmp::Reverse(f.1), ino(f.0), f.0);
        let hub = *self.files.iter().min_by_key(|f| key(f)).expect("a component has files");
        if self.weight() <= budget || self.files.len() <= 2 {
            return vec![Part { component: self, planned: Vec::new() }];
        }
        let mut rest: Vec<(FileId, u64)> = self.files.drain(..).filter(|f| f.0 != hub.0).collect();
        rest.sort_unstable_by_key(|f| (ino(f.0), f.0));
        let room = budget.saturating_sub(hub.1);
        let mut parts: Vec<Part> = Vec::new();
        let (mut load, mut added) = (0, 0);
        for f in rest {
            if parts.is_empty() || (added > 0 && load + f.1 > room) {
                let bridge = parts.last().and_then(|p| p.component.files.last().copied());
                let files: Vec<(FileId, u64)> = std::iter::once(hub).chain(bridge).collect();
                let planned: Vec<FileId> =
                    if parts.is_empty() { Vec::new() } else { files.iter().map(|f| f.0).collect() };
                (load, added) = (bridge.map_or(0, |b| b.1), 0);
                parts.push(Part { component: Component { files, whole: Vec::new() }, planned });
            }
            (load, added) = (load + f.1, added + 1);
            parts.last_mut().expect("pushed").component.files.push(f);
        }
        // A whole-file group goes with its first copy, where it is first.
        for (size, g) in self.whole {
            let at = parts.iter().position(|p| p.component.files.iter().any(|f| f.0 == g[0])).unwrap_or(0);
            parts[at].component.whole.push((size, g));
        }
        parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::group::BlockGroups;

    /// The components of `blocks`, with the whole-file groups `joined`, as
    /// sorted lists of files (whole copies included).
    fn components(joined: Vec<WholeGroup>, blocks: &[Vec<(i64, u64)>]) -> Vec<Vec<i64>> {
        let mut links = Links::default();
        let blocks = BlockGroups::from(
            blocks.iter().map(|g| g.iter().map(|&(f, b)| (FileId(f), b)).collect()).collect::<Vec<Vec<_>>>(),
        );
        blocks.iter().for_each(|g| links.add(g));
        let mut out: Vec<Vec<i64>> = (links.components(joined).into_iter())
            .map(|c| {
                let mut ids: Vec<i64> = c.files.iter().map(|f| f.0 .0).collect();
                ids.extend(c.whole.iter().flat_map(|(_, g)| g.iter().map(|f| f.0)));
                ids.sort_unstable();
                ids.dedup();
                ids
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn block_groups_and_their_whole_groups_split_into_components() {
        let f = FileId;
        // 1-2 and 2-3 linked through file 2 (small: block 0); 7-8 apart,
        // twice; the whole group of 3 (with its copy 4) joins the first,
        // that of 8 (with 9) the second.
        let blocks = [vec![(1, 0), (2, 5)], vec![(7, 1), (8, 1)], vec![(3, 2), (2, 0)], vec![(7, 2), (8, 2)]];
        let joined = vec![(4096, vec![f(8), f(9)]), (8192, vec![f(3), f(4)])];
        assert_eq!(components(joined, &blocks), vec![vec![1, 2, 3, 4], vec![7, 8, 9]]);
        // Members are counted per file, linked or not.
        let mut links = Links::default();
        BlockGroups::from(vec![vec![(f(1), 3), (f(2), 3)], vec![(f(1), 4), (f(1), 9)]])
            .iter()
            .for_each(|g| links.add(g));
        assert_eq!(links.files, vec![(f(1), 3), (f(2), 1)]);

        // Three pairs, then one group linking them from its third file:
        // every join must be between roots, or the second pair is lost.
        let blocks = [vec![(1, 0), (2, 0)], vec![(3, 0), (4, 0)], vec![(5, 0), (6, 0)], vec![(5, 1), (3, 1), (1, 1)]];
        assert_eq!(components(Vec::new(), &blocks).len(), 1);
    }

    #[test]
    fn a_component_past_the_budget_is_split_around_its_hub() {
        let f = FileId;
        let whole = |id| (4096, vec![f(id), f(100 + id)]);
        let c = || Component {
            files: vec![(f(5), 10), (f(1), 40), (f(2), 40), (f(3), 30), (f(4), 50)],
            whole: vec![whole(3), whole(4)],
        };
        // Inodes in reverse of row ids: the parts follow inodes.
        let ino = |id: FileId| 100 - id.0 as u64;
        assert_eq!(c().weight(), 170);
        let one = c().split(170, ino);
        assert_eq!((one.len(), one[0].planned.len(), one[0].component.files.len()), (1, 0, 5));
        let parts = c().split(120, ino);
        let ids = |parts: &[Part]| -> Vec<Vec<i64>> {
            parts.iter().map(|p| p.component.files.iter().map(|x| x.0 .0).collect()).collect()
        };
        // Hub 4 (50 blocks), then 70 blocks a part at most, by inode: 5, 3,
        // 2, 1, each part after the first with the last file of the one
        // before (3: 30 blocks, then 2: 40), and at least one file more.
        assert_eq!(ids(&parts), vec![vec![4, 5, 3], vec![4, 3, 2], vec![4, 2, 1]]);
        let planned: Vec<Vec<FileId>> = parts.iter().map(|p| p.planned.clone()).collect();
        assert_eq!(planned, vec![vec![], vec![f(4), f(3)], vec![f(4), f(2)]]);
        let wholes: Vec<Vec<i64>> =
            parts.iter().map(|p| p.component.whole.iter().map(|w| w.1[0].0).collect()).collect();
        assert_eq!(wholes, vec![vec![3, 4], vec![], vec![]]);
        // A file heavier than the room is a part of its own with the hub;
        // ties for the hub go to the lower inode.
        let c2 = Component { files: vec![(f(3), 200), (f(2), 50), (f(1), 200)], whole: Vec::new() };
        assert_eq!(ids(&c2.split(60, |id| id.0 as u64)), vec![vec![1, 2], vec![1, 2, 3]]);
        let two = Component { files: vec![(f(1), 500), (f(2), 500)], whole: Vec::new() }.split(10, |id| id.0 as u64);
        assert_eq!(two.len(), 1);
    }

    #[test]
    fn small_files_are_marked() {
        let map = |n: usize| crate::blockmap::BlockMap::from_fps(&vec![1 << 20; n]).into_bytes();
        assert_eq!(mark(&map(64)), 0);
        assert_eq!(mark(&map(65)), 1);
        // Holes do not count.
        let mut holes = vec![0u64; 1000];
        holes[500..520].fill(7 << 20);
        assert_eq!(mark(&crate::blockmap::BlockMap::from_fps(&holes).into_bytes()), 0);
    }

    #[test]
    fn a_lone_pair_of_blocks_does_not_link_two_files() {
        // 1-2: one pair of large files (a fingerprint collision looks like
        // this); 3-4: two pairs; 5-6: one pair, 5 small (block 0); 7-8:
        // one pair, but small 9 links them; 10-11: one block of three
        // files; 12: a pair inside one file.
        let blocks = [
            vec![(1, 7), (2, 9)],
            vec![(3, 7), (4, 9)],
            vec![(3, 8), (4, 10)],
            vec![(5, 0), (6, 4)],
            vec![(7, 3), (8, 3)],
            vec![(9, 0), (7, 1)],
            vec![(9, 0), (8, 1)],
            vec![(10, 5), (11, 5), (2, 5)],
            vec![(12, 5), (12, 6)],
        ];
        let want = vec![vec![1], vec![2, 10, 11], vec![3, 4], vec![5, 6], vec![7, 8, 9], vec![12]];
        assert_eq!(components(Vec::new(), &blocks), want);
        // In any order of the groups.
        let mut reversed = blocks.to_vec();
        reversed.reverse();
        assert_eq!(components(Vec::new(), &reversed), want);
    }
}
