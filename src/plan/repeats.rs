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
//! duplicate blocks trades against `N / W` ranges for `N` destination
//! blocks; with a range costing about a twentieth of a block in metadata
//! ([`BLOCKS_PER_RANGE`]) the sum is least at `W ≈ √(N/20)`: a 4 GiB
//! file keeps 512 KiB and makes 8,191 ranges. Runs too short to pay are
//! planned as before.

use rustc_hash::FxHashSet;

use super::planner::Planner;

/// The longest period, in blocks, looked for in a run.
const MAX_PERIOD: u64 = 64;

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
        let starts = self.run_starts(best);
        if starts.is_empty() {
            return kept;
        }
        let mut count = vec![0u32; self.uf.parent.len()];
        for &r in &self.uf.parent {
            count[r as usize] += 1;
        }
        let mut end = 0u32; // first block number past the last window
        for s in starts {
            if s < end {
                continue; // inside a window made from an earlier block of the run
            }
            let Some((p, w)) = self.window_at(best, s, &count) else { continue };
            let (f, sb) = self.loc(s);
            for b in sb + p..sb + w {
                let g = self.num((f, b)).expect("a window holds data");
                kept.insert(g);
                end = g + 1;
            }
        }
        kept
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

    /// The period and window length of the run starting at source `s`, if
    /// a window of at least two periods pays.
    fn window_at(&self, best: &[u32], s: u32, count: &[u32]) -> Option<(u64, u64)> {
        let (f, sb) = self.loc(s);
        let source_of = |b: u64| -> Option<(u32, u32)> {
            let g = self.num((f, b))?;
            Some((g, best[self.uf.parent[g as usize] as usize]))
        };
        // The period: the first block whose source is `s`; every block
        // before it must be the source of its own class.
        let mut p = 0;
        for i in 1..=MAX_PERIOD {
            let (g, src) = source_of(sb + i)?;
            if src == s {
                p = i;
                break;
            }
            if src != g {
                return None;
            }
        }
        if p == 0 {
            return None;
        }
        let dests = u64::from(count[self.uf.parent[s as usize] as usize]) * p;
        let best_len = (dests / BLOCKS_PER_RANGE).isqrt().min(MAX_WINDOW);
        // The longest stretch of the run up to that length: block `sb + i`
        // taken from `sb + i % p`.
        let mut run = p;
        while run < best_len {
            let want = self.num((f, sb + run % p))?;
            match source_of(sb + run) {
                Some((_, src)) if src == want => run += 1,
                _ => break,
            }
        }
        // A power of two periods, at least two.
        let periods = (run / p).checked_ilog2().map(|k| 1u64 << k)?;
        (periods >= 2).then_some((p, p * periods))
    }
}
