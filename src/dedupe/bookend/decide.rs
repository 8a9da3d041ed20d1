//! The bookend decision, pure: from a destination file's extents (FIEMAP)
//! and the ranges the plan shares into it, which remainders to rewrite so
//! their extents can be freed, what stays pinned and why, and what a larger
//! `--rewrite-ratio` would free instead. The I/O is in the parent module.

use std::collections::BTreeMap;

use crate::sys;

/// One extent of a destination file, as FIEMAP shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DestExtent {
    /// Offset in the file.
    pub logical: u64,
    /// Length in bytes.
    pub length: u64,
    /// Referenced by another file (or snapshot) already: it cannot be freed
    /// by anything done to this file.
    pub shared: bool,
    /// Why it cannot be rewritten (compressed, inline, delalloc or
    /// unknown: no stable block addresses); `None`: it can.
    pub fixed: Option<PinReason>,
    /// The extent on disk it is a stretch of (btrfs's `disk_bytenr`,
    /// `sys::btrfs_tree::on_disk`); `None`: not known, judged as a whole
    /// of its own.
    pub disk: Option<u64>,
}

impl DestExtent {
    /// The extent FIEMAP reported, as the bookend decision sees it. A
    /// compressed extent is rewritable when `compressed_copies` (the copy
    /// is compressed too: `Bookends::rewrite_compressed`): its rest is
    /// copied out by file offsets and shared back, which needs no block
    /// addresses (FIEMAP names only the whole extent).
    pub fn from_fiemap(e: &sys::Extent, compressed_copies: bool) -> DestExtent {
        Self::named(e, None, compressed_copies)
    }

    /// [`DestExtent::from_fiemap`], a stretch of extent `disk` on disk.
    pub fn named(e: &sys::Extent, disk: Option<u64>, compressed_copies: bool) -> DestExtent {
        let fixed = if e.is_inline() {
            Some(PinReason::Inline)
        } else if e.is_encoded() && e.has_address() {
            (!compressed_copies).then_some(PinReason::Compressed)
        } else if e.is_unstable() {
            Some(PinReason::NotRewritable)
        } else {
            None
        };
        DestExtent { logical: e.logical, length: e.length, shared: e.is_shared(), fixed, disk }
    }
}

/// Why bytes shared into a destination free nothing on btrfs: their extent
/// stays on disk for an uncovered rest of the same file. Stable names, for
/// the reports and the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PinReason {
    /// The uncovered rest is more than `--rewrite-ratio` times the covered
    /// part: rewriting it would write more than it frees.
    BelowRewriteRatio,
    /// The extent is compressed and the volume is not mounted with
    /// `compress-force`: a copy of its rest could be written plain and
    /// take more room than the extent frees.
    Compressed,
    /// The data is inline in metadata.
    Inline,
    /// Delayed allocation or unknown address: nothing stable to rewrite.
    NotRewritable,
    /// Rewriting the rest was tried and failed (I/O error, the file changed
    /// or the kernel refused part of it).
    RewriteFailed,
}

impl PinReason {
    /// Every reason, in order.
    pub const ALL: [PinReason; 5] = [
        PinReason::BelowRewriteRatio,
        PinReason::Compressed,
        PinReason::Inline,
        PinReason::NotRewritable,
        PinReason::RewriteFailed,
    ];

    /// Name in the database and in reports.
    pub fn name(self) -> &'static str {
        match self {
            PinReason::BelowRewriteRatio => "below_rewrite_ratio",
            PinReason::Compressed => "compressed",
            PinReason::Inline => "inline",
            PinReason::NotRewritable => "not_rewritable",
            PinReason::RewriteFailed => "rewrite_failed",
        }
    }
}

/// Larger `--rewrite-ratio` values whose effect a run reports
/// ([`Decision::what_if`]): where extents stay pinned below the ratio in
/// use, the administrator sees what a larger one would free, and copy to
/// do it, before trying it (on the benchmark corpus, 5% of the shared bytes
/// stay pinned at the default ratio 1).
pub const WHAT_IF_RATIOS: [f64; 4] = [2.0, 4.0, 8.0, 16.0];

/// For each of [`WHAT_IF_RATIOS`]: `(covered bytes it would free, remainder
/// bytes it would copy)`.
pub type WhatIf = [(u64, u64); WHAT_IF_RATIOS.len()];

/// What to do about one destination file's partly covered extents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Parts to rewrite, as `(offset, length)` in the file.
    pub rewrite: Vec<(u64, u64)>,
    /// Covered bytes of the extents whose rest is rewritten: pinned after
    /// all if the rewrite fails.
    pub rewrite_covered: u64,
    /// Covered bytes that will be shared but cannot free space, by why:
    /// their extent stays on disk for its uncovered rest (not worth
    /// rewriting, or compressed/inline and not rewritable). The report's
    /// `pinned_bytes`, so that shared = freed + pinned adds up on btrfs.
    pub pinned: BTreeMap<PinReason, u64>,
    /// Of the bytes pinned [`PinReason::BelowRewriteRatio`], what each of
    /// [`WHAT_IF_RATIOS`] would free and copy instead.
    pub what_if: WhatIf,
}

impl Decision {
    /// Nothing to rewrite and nothing pinned: the file's extents are
    /// untouched, wholly covered or already shared.
    pub fn is_empty(&self) -> bool {
        self.rewrite.is_empty() && self.pinned.is_empty()
    }
}

/// Parts of `extents` to rewrite, as `(offset, length)` in the file.
///
/// `covered` are the ranges the plan shares into this file (sorted by
/// offset, not overlapping). An extent is worth its remainder when it is
/// partly covered and the remainder is at most `max_ratio` times the covered
/// part: then the whole extent is freed for writing the remainder, and the
/// net gain is at least what is written.
pub fn remainders(extents: &[DestExtent], covered: &[(u64, u64)], file_size: u64, max_ratio: f64) -> Vec<(u64, u64)> {
    decide(extents, covered, file_size, max_ratio).rewrite
}

/// [`remainders`], and the covered bytes of the partly covered extents left
/// as they are (pinned). Extents already shared with another file are in
/// neither: whether they are freed depends on that file, not on this one.
///
/// The stretches of one extent on disk ([`DestExtent::disk`]) are judged
/// together: the extent is freed only when none of them is referenced, so
/// a stretch the plan leaves whole (a source) between stretches it covers
/// whole pinned all of it when each was judged alone (a near-copy written
/// in one extent, then changed in place: on a chain of five 3 GiB copies,
/// 280 MiB stayed pinned, 128 MiB extents kept for one block each).
pub fn decide(extents: &[DestExtent], covered: &[(u64, u64)], file_size: u64, max_ratio: f64) -> Decision {
    let mut out = Decision::default();
    for (_, group) in sys::btrfs_tree::by_extent(extents.iter().map(|e| (e, e.disk))) {
        if group.iter().any(|e| e.shared) {
            continue;
        }
        let (mut cov, mut gaps) = (0, Vec::new());
        for (c, g) in group.iter().filter_map(|e| coverage(e, covered, file_size)) {
            cov += c;
            gaps.extend(g);
        }
        let uncovered: u64 = gaps.iter().map(|g| g.1).sum();
        if cov == 0 || uncovered == 0 {
            continue; // untouched, or freed anyway
        }
        match group.iter().find_map(|e| e.fixed) {
            None if uncovered as f64 <= cov as f64 * max_ratio => {
                out.rewrite.extend(gaps);
                out.rewrite_covered += cov;
            }
            None => {
                *out.pinned.entry(PinReason::BelowRewriteRatio).or_default() += cov;
                for (w, &ratio) in out.what_if.iter_mut().zip(&WHAT_IF_RATIOS) {
                    if uncovered as f64 <= cov as f64 * ratio {
                        *w = (w.0 + cov, w.1 + uncovered);
                    }
                }
            }
            Some(why) => *out.pinned.entry(why).or_default() += cov,
        }
    }
    out.rewrite = union(out.rewrite);
    out
}

/// Bytes of extent `e` that `covered` covers, and its uncovered gaps
/// (`None`: the extent lies past the end of the file).
fn coverage(e: &DestExtent, covered: &[(u64, u64)], file_size: u64) -> Option<(u64, Vec<(u64, u64)>)> {
    let start = e.logical;
    let end = (e.logical + e.length).min(file_size);
    if end <= start {
        return None;
    }
    let mut gaps = Vec::new();
    let mut pos = start;
    let mut cov = 0;
    for &(o, l) in covered {
        let (cs, ce) = (o.max(start), (o + l).min(end));
        if cs >= ce {
            continue;
        }
        if cs > pos {
            gaps.push((pos, cs - pos));
        }
        cov += ce - cs;
        pos = pos.max(ce);
    }
    if pos < end {
        gaps.push((pos, end - pos));
    }
    Some((cov, gaps))
}

/// Merge `(offset, length)` ranges into sorted, non-overlapping ones.
pub fn union(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (o, l) in ranges {
        match out.last_mut() {
            Some((po, pl)) if *po + *pl >= o => *pl = (*pl).max(o + l - *po),
            _ => out.push((o, l)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 4096;

    fn ext(logical: u64, length: u64) -> DestExtent {
        DestExtent { logical, length, shared: false, fixed: None, disk: None }
    }

    #[test]
    fn table() {
        struct Case {
            name: &'static str,
            extents: Vec<DestExtent>,
            covered: Vec<(u64, u64)>,
            want: Vec<(u64, u64)>,
        }
        let cases = vec![
            Case {
                name: "shifted copy: one new block in front",
                extents: vec![ext(0, 100 * K)],
                covered: vec![(K, 99 * K)],
                want: vec![(0, K)],
            },
            Case {
                name: "fully covered: freed anyway",
                extents: vec![ext(0, 8 * K)],
                covered: vec![(0, 8 * K)],
                want: vec![],
            },
            Case { name: "not covered: nothing to do", extents: vec![ext(0, 8 * K)], covered: vec![], want: vec![] },
            Case {
                name: "scattered changes (2%)",
                extents: vec![ext(0, 100 * K)],
                covered: vec![(0, 10 * K), (11 * K, 59 * K), (71 * K, 29 * K)],
                want: vec![(10 * K, K), (70 * K, K)],
            },
            Case {
                name: "remainder larger than covered: not worth it",
                extents: vec![ext(0, 10 * K)],
                covered: vec![(0, 4 * K)],
                want: vec![],
            },
            Case {
                name: "half covered: written equals saved, still worth it",
                extents: vec![ext(0, 8 * K)],
                covered: vec![(0, 4 * K)],
                want: vec![(4 * K, 4 * K)],
            },
            Case {
                name: "two extents judged apart",
                extents: vec![ext(0, 4 * K), ext(4 * K, 4 * K)],
                covered: vec![(K, 6 * K)],
                want: vec![(0, K), (7 * K, K)],
            },
            Case {
                name: "shared extent left alone",
                extents: vec![DestExtent { shared: true, ..ext(0, 100 * K) }],
                covered: vec![(K, 99 * K)],
                want: vec![],
            },
        ];
        for c in cases {
            assert_eq!(remainders(&c.extents, &c.covered, 1 << 40, 1.0), c.want, "{}", c.name);
        }
    }

    #[test]
    fn file_size_clips_the_last_extent() {
        // A 10-block extent of which the file uses 9 blocks and 100 bytes.
        let size = 9 * K + 100;
        assert_eq!(remainders(&[ext(0, 10 * K)], &[(K, 8 * K + 100)], size, 1.0), vec![(0, K)]);
    }

    fn pins(list: &[(PinReason, u64)]) -> BTreeMap<PinReason, u64> {
        list.iter().copied().collect()
    }

    #[test]
    fn pinned_is_what_is_covered_but_not_freed() {
        use PinReason::*;
        // Remainder too large: the covered 4 blocks stay pinned.
        // A ratio of 2 or more would rewrite the 6 uncovered blocks.
        let d = decide(&[ext(0, 10 * K)], &[(0, 4 * K)], 1 << 40, 1.0);
        let what_if = [(4 * K, 6 * K); 4];
        assert_eq!(
            d,
            Decision { rewrite: vec![], rewrite_covered: 0, pinned: pins(&[(BelowRewriteRatio, 4 * K)]), what_if }
        );
        // Rewritten: nothing pinned; pinned after all if the rewrite fails.
        let d = decide(&[ext(0, 8 * K)], &[(0, 4 * K)], 1 << 40, 1.0);
        assert_eq!((d.pinned, d.rewrite_covered), (pins(&[]), 4 * K));
        // --rewrite-ratio 0: every partly covered extent is pinned.
        assert_eq!(decide(&[ext(0, 8 * K)], &[(0, 7 * K)], 1 << 40, 0.0).pinned, pins(&[(BelowRewriteRatio, 7 * K)]));
        // Not rewritable and partly covered: pinned for what the extent is.
        for why in [Compressed, Inline, NotRewritable] {
            let e = DestExtent { fixed: Some(why), ..ext(0, 8 * K) };
            let d = decide(&[e], &[(0, 7 * K)], 1 << 40, 1.0);
            let pinned = pins(&[(why, 7 * K)]);
            assert_eq!(d, Decision { rewrite: vec![], rewrite_covered: 0, pinned, what_if: [(0, 0); 4] }, "{why:?}");
        }
        // Two reasons in one file, each extent judged apart.
        let zstd = DestExtent { fixed: Some(Compressed), ..ext(0, 8 * K) };
        let d = decide(&[zstd, ext(8 * K, 16 * K)], &[(K, 8 * K)], 1 << 40, 1.0);
        assert_eq!(d.pinned, pins(&[(Compressed, 7 * K), (BelowRewriteRatio, K)]));
        // Wholly covered, untouched or shared with another file: not pinned here.
        let shared = DestExtent { shared: true, ..ext(16 * K, 8 * K) };
        let d = decide(&[ext(0, 8 * K), ext(8 * K, 8 * K), shared], &[(0, 8 * K), (16 * K, K)], 1 << 40, 1.0);
        assert!(d.is_empty(), "{d:?}");
    }

    #[test]
    fn what_fiemap_says_can_be_rewritten() {
        use crate::sys::fiemap::flags::{DATA_INLINE, DELALLOC, ENCODED, UNKNOWN};
        use PinReason::{Compressed, Inline, NotRewritable};
        for forced in [false, true] {
            let fixed = |flags: u32| {
                let e = sys::Extent { logical: 0, physical: 1 << 20, length: 8 * K, flags };
                DestExtent::from_fiemap(&e, forced).fixed
            };
            assert_eq!(fixed(0), None);
            // Compressed: its rest is copied out by offsets, where the
            // copy is compressed too.
            assert_eq!(fixed(ENCODED), (!forced).then_some(Compressed));
            assert_eq!(fixed(ENCODED | DELALLOC | UNKNOWN), Some(NotRewritable));
            assert_eq!(fixed(DELALLOC | UNKNOWN), Some(NotRewritable));
            assert_eq!(fixed(DATA_INLINE | ENCODED), Some(Inline));
        }
    }

    #[test]
    fn what_a_larger_ratio_would_free_and_copy() {
        // Covered 1 of 4 blocks (remainder 3 times the covered part), 1 of
        // 10 (9 times), 1 of 40 (39 times): 2 frees none, 4 and 8 the
        // first, 16 the second too; nothing listed frees the third.
        let ext3 = [ext(0, 4 * K), ext(4 * K, 10 * K), ext(14 * K, 40 * K)];
        let d = decide(&ext3, &[(0, K), (4 * K, K), (14 * K, K)], 1 << 40, 1.0);
        assert_eq!(d.pinned[&PinReason::BelowRewriteRatio], 3 * K);
        assert_eq!(d.what_if, [(0, 0), (K, 3 * K), (K, 3 * K), (2 * K, 12 * K)]);
        // At --rewrite-ratio 4 the first is rewritten: only larger ratios
        // can add anything.
        let d = decide(&ext3, &[(0, K), (4 * K, K), (14 * K, K)], 1 << 40, 4.0);
        assert_eq!(d.what_if, [(0, 0), (0, 0), (0, 0), (K, 9 * K)]);
    }

    fn on(disk: u64, e: DestExtent) -> DestExtent {
        DestExtent { disk: Some(disk), ..e }
    }

    #[test]
    fn stretches_of_one_extent_on_disk_are_judged_together() {
        // One extent D of 256 blocks, blocks 10 and 12 since written
        // elsewhere (extents of their own); block 11, between them, is a
        // source the plan leaves whole, the rest is covered.
        const D: u64 = 1 << 30;
        let stretches = [
            on(D, ext(0, 10 * K)),
            on(7 << 30, ext(10 * K, K)),
            on(D, ext(11 * K, K)),
            on(8 << 30, ext(12 * K, K)),
            on(D, ext(13 * K, 243 * K)),
        ];
        let covered = [(0, 10 * K), (13 * K, 243 * K)];
        // Each stretch alone: wholly covered or untouched, and D stays on
        // disk for block 11, reported nowhere.
        let alone: Vec<DestExtent> = stretches.iter().map(|e| DestExtent { disk: None, ..*e }).collect();
        assert!(decide(&alone, &covered, 256 * K, 4.0).is_empty());
        // Together: block 11 is rewritten and D freed.
        let d = decide(&stretches, &covered, 256 * K, 4.0);
        assert_eq!((d.rewrite, d.rewrite_covered), (vec![(11 * K, K)], 253 * K));
        // The ratio is the extent's: 4 blocks left of 8 covered in two
        // stretches, at ratio 1.
        let two = [on(D, ext(0, 4 * K)), on(D, ext(4 * K, 4 * K)), on(D, ext(8 * K, 4 * K))];
        assert_eq!(decide(&two, &[(4 * K, 8 * K)], 1 << 40, 1.0).rewrite, vec![(0, 4 * K)]);
        let d = decide(&two, &[(8 * K, 4 * K)], 1 << 40, 1.0);
        assert_eq!(d.pinned, pins(&[(PinReason::BelowRewriteRatio, 4 * K)]));
        // One stretch shared with another file: the extent is that file's
        // to free too, and left alone.
        let mut shared = stretches;
        shared[4].shared = true;
        assert!(decide(&shared, &covered, 256 * K, 4.0).is_empty());
    }

    #[test]
    fn reason_names_are_stable_and_distinct() {
        let names: Vec<&str> = PinReason::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names, ["below_rewrite_ratio", "compressed", "inline", "not_rewritable", "rewrite_failed"]);
    }

    #[test]
    fn union_merges() {
        assert_eq!(union(vec![(8, 4), (0, 4), (2, 4), (20, 1)]), vec![(0, 6), (8, 4), (20, 1)]);
        assert_eq!(union(vec![(8, 4), (0, 4), (2, 4), (6, 2), (20, 1)]), vec![(0, 12), (20, 1)]);
    }
}
