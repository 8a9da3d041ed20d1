//! Sampled anchors: the planner's mode for groups that are a sample, not
//! every equal block (`PlanOptions::exact_groups` off). The database no
//! longer stores anchors (schema v6): [`super::from_db`] groups every block
//! exactly; sampling remains for callers that group a sample (benchmarks,
//! tests of the diagonal walk).

use crate::blockmap::{BlockMap, Fp};

/// Sample rate of anchors: a block is an anchor when the low bits of its
/// fingerprint are zero, so identical blocks are sampled alike in every file.
pub const ANCHOR_SHIFT: u32 = 4;

const ANCHOR_MASK: Fp = (1 << ANCHOR_SHIFT) - 1;

/// Whether a block-map fingerprint is a sampled anchor.
pub fn is_sampled(fp: Fp) -> bool {
    fp != 0 && fp & ANCHOR_MASK == 0
}

/// Indices of the *sampled* anchors of `blocks`: every block whose
/// fingerprint falls in 1/2^[`ANCHOR_SHIFT`] of the hash space.
pub fn sampled_anchors(blocks: &[Fp]) -> impl Iterator<Item = u64> + '_ {
    blocks.iter().enumerate().filter(|(_, &fp)| is_sampled(fp)).map(|(i, _)| i as u64)
}

/// Index of the block with the smallest fingerprint, unless it is sampled
/// already: so that every file with data has at least one anchor, and two
/// small files that share most of their blocks share an anchor too.
pub fn min_anchor(blocks: &[Fp]) -> Option<u64> {
    let (i, &fp) = blocks.iter().enumerate().filter(|(_, &fp)| fp != 0).min_by_key(|(_, &fp)| fp)?;
    (fp & ANCHOR_MASK != 0).then_some(i as u64)
}

/// [`min_anchor`] of a sparse map: `(block, fingerprint)`.
pub fn min_anchor_sparse(map: &BlockMap) -> Option<(u64, Fp)> {
    let (b, fp) = map.data_blocks().min_by_key(|&(_, fp)| fp)?;
    (fp & ANCHOR_MASK != 0).then_some((b, fp))
}

/// Every anchor of `blocks`, sampled and smallest, in block order.
pub fn anchors(blocks: &[Fp]) -> Vec<u64> {
    let mut out: Vec<u64> = sampled_anchors(blocks).chain(min_anchor(blocks)).collect();
    out.sort_unstable();
    out
}
