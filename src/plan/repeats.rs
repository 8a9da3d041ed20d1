//! Blocks repeated many times within one file: shared a window at a time,
//! not one block per request.
//!
//! A file of one repeated block (a flash image of 0xFF, a preallocated file
//! filled with a pattern) is one class whose source is its first block, so
//! every other block is a range of its own: a 4 GiB file made 1,048,575
//! requests and as many file extent items, each referencing the same 4 KiB.
//! On a `compress-force` btrfs volume that *cost* space (measured: a 4 GiB
//! file stored in 145 MiB of 128 KiB compressed extents used 141 MiB more
//! after the run: the metadata outgrew the data it freed), and an extent
//! referenced a million times is slow for every later back-reference walk.
//!
//! So when a class's source starts a periodic run (period `p` blocks, at
//! most [`MAX_PERIOD`]), the first `W` blocks of the run (a multiple of
//! `p`) stay as they are, a *window*, and every other copy is shared from
//! the window along the diagonal, `W` blocks per range. Keeping `W - p`
//! duplicate blocks trades against `N / W` ranges for the `N` blocks that
//! would go on through the window (those whose block `p` before holds the
//! same content: a block found once in each of many files gains nothing);
//! with a range costing about a twentieth of a block in metadata
//! ([`BLOCKS_PER_RANGE`]) the sum is least at `W ≈ √(N/20)`: a 4 GiB
//! file keeps 512 KiB and makes 8,191 ranges. Runs too short to pay are
//! planned as before.

use rustc_hash::{FxHashMap, FxHashSet};

use super::planner::Planner;

/// The longest period, in blocks, looked for in a run.
const MAX_PERIOD: u64 = 64;

/// Most periods given windows in one plan (see [`Planner::windows`]).
const MAX_PERIODS: usize = 8;

/// The largest window: 16 MiB of 4 KiB blocks, the most btrfs shares in one
/// request.
const MAX_WINDOW: u64 = 4096;

/// Blocks' worth of data that one range costs in metadata, inverted: a
/// btrfs file extent item with its key is about 100 bytes, 200 with the
/// default duplicated metadata, a twentieth of a 4 KiB block.
const BLOCKS_PER_RANGE: u64 = 20;

impl Planner<'_> {
    /// Blocks kept as part of a window (never destinations), by block
    /// number; empty when no run pays (the common case: one pass over the
    /// blocks, nothing allocated).
    pub(super) fn windows(&self, best: &[u32]) -> FxHashSet<u32> {
        let mut kept = FxHashSet::default();
        let starts: Vec<(u32, u64)> =
            self.run_starts(best).into_iter().filter_map(|s| Some((s, self.period(best, s)?))).collect();
        if starts.is_empty() {
            return kept;
        }
        // Per period, which windows pay: what a window saves is counted in
        // the blocks that would continue a range through it (a copy of the
        // block `p` before them), not in the class's size (a block found in
        // a hundred files, once in each, gains nothing from a window).
        // Each period costs a pass over the plan's blocks: the periods with
        // the most runs, at most `MAX_PERIODS` of them (a file crafted with
        // runs of every period gets windows for some, the rest are planned
        // as before).
        let mut periods: Vec<u64> = starts.iter().map(|&(_, p)| p).collect();
        periods.sort_unstable();
        let mut by_runs: Vec<(usize, u64)> = periods.chunk_by(|a, b| a == b).map(|c| (c.len(), c[0])).collect();
        by_runs.sort_unstable_by_key(|&(n, p)| (std::cmp::Reverse(n), p));
        let periods: Vec<u64> = by_runs.into_iter().take(MAX_PERIODS).map(|(_, p)| p).collect();
        let mut windows: Vec<(u32, u64, u64)> = Vec::new();
        for p in periods {
            // Counted only for the classes of the runs' first periods: a
            // count per block was 4 bytes a block at the plan's peak
            // (heaptrack on FULL: 3.7 MB, for one window of two blocks).
            let firsts = |s: u32| {
                let (f, sb) = self.loc(s);
                (0..p).filter_map(move |j| self.num((f, sb + j)))
            };
            let mut count: FxHashMap<u32, u32> = (starts.iter().filter(|&&(_, q)| q == p))
                .flat_map(|&(s, _)| firsts(s))
                .map(|g| (self.uf.parent[g as usize], 0))
                .collect();
            self.count_repeats(p, &mut count);
            for &(s, _) in starts.iter().filter(|&&(_, q)| q == p) {
                let benefit: u64 = firsts(s).map(|g| u64::from(count[&self.uf.parent[g as usize]])).sum();
                if let Some(w) = self.window_len(best, s, p, benefit) {
                    windows.push((s, p, w));
                }
            }
        }
        windows.sort_unstable();
        let mut end = 0u32; // first block number past the last window
        for (s, p, w) in windows {
            if s < end {
                continue; // inside a window made from an earlier block of the run
            }
            let (f, sb) = self.loc(s);
            for b in sb + p..sb + w {
                let g = self.num((f, b)).expect("a window holds data");
                kept.insert(g);
                end = g + 1;
            }
        }
        kept
    }

    /// `count[root]`, for the roots `count` holds: blocks of the class
    /// `root` whose block `p` before, in the same file, is of the same
    /// class.
    fn count_repeats(&self, p: u64, count: &mut FxHashMap<u32, u32>) {
        for (f, map) in self.maps.iter().enumerate() {
            for (k, (b, _)) in map.data().enumerate() {
                let g = self.base[f] + k as u32;
                let Some(h) = b.checked_sub(p).and_then(|a| self.num((f as u32, a))) else { continue };
                let r = self.uf.parent[g as usize];
                if self.uf.parent[h as usize] == r {
                    if let Some(c) = count.get_mut(&r) {
                        *c += 1;
                    }
                }
            }
        }
    }

    /// Sources followed, within `MAX_PERIOD` blocks, by a destination of
    /// their own in the same file, in block-number order.
    fn run_starts(&self, best: &[u32]) -> Vec<u32> {
        let mut starts = Vec::new();
        for (f, map) in self.maps.iter().enumerate() {
            let (lo, hi) = (self.base[f], self.base[f] + map.data_len());
            for (k, (db, _)) in map.data().enumerate() {
                let src = best[self.uf.parent[(lo + k as u32) as usize] as usize];
                if (lo..hi).contains(&src)
                    && src != lo + k as u32
                    && db.checked_sub(self.loc(src).1).is_some_and(|d| d <= MAX_PERIOD)
                {
                    starts.push(src);
                }
            }
        }
        starts.sort_unstable();
        starts.dedup();
        starts
    }

    /// The period of the run starting at source `s`: the first block whose
    /// source is `s`, every block before it the source of its own class.
    fn period(&self, best: &[u32], s: u32) -> Option<u64> {
        let (f, sb) = self.loc(s);
        for i in 1..=MAX_PERIOD {
            let g = self.num((f, sb + i))?;
            let src = best[self.uf.parent[g as usize] as usize];
            if src == s {
                return Some(i);
            }
            if src != g {
                return None;
            }
        }
        None
    }

    /// The window of the run of period `p` starting at source `s`, for
    /// `benefit` blocks that would continue a range through it, if a
    /// window of at least two periods pays.
    fn window_len(&self, best: &[u32], s: u32, p: u64, benefit: u64) -> Option<u64> {
        let (f, sb) = self.loc(s);
        let best_len = (benefit / BLOCKS_PER_RANGE).isqrt().min(MAX_WINDOW);
        // The longest stretch of the run up to that length: block `sb + i`
        // taken from `sb + i % p`.
        let mut run = p;
        while run < best_len {
            let want = self.num((f, sb + run % p))?;
            match self.num((f, sb + run)) {
                Some(g) if best[self.uf.parent[g as usize] as usize] == want => run += 1,
                _ => break,
            }
        }
        // A power of two periods, at least two.
        let periods = (run / p).checked_ilog2().map(|k| 1u64 << k)?;
        (periods >= 2).then_some(p * periods)
    }
}
