//! Freeing partly shared extents on btrfs (the "bookend" problem).
//!
//! btrfs frees an extent only when no file references any part of it.
//! Sharing 99% of a destination's extent frees nothing while the other 1%
//! still points at it. This module decides, from a destination file's
//! extents and the ranges the plan will share into it, which *remainders*
//! (uncovered parts of partly covered extents) to rewrite into fresh
//! extents so the old extent can go ([`remainders`], pure), and does it: a
//! share worker copies them to an `O_TMPFILE`, then `FIDEDUPERANGE`s them
//! back, so the kernel verifies every byte and the file never holds
//! anything but its own data. A worker copies out a batch of destinations
//! before sharing any back, so their writes reach the disk together. With
//! no room for the copy (ENOSPC, EDQUOT) the destination is left whole for
//! a later run ([`super::Pending::NoSpaceRewrite`]).
//!
//! XFS counts references per block and needs none of this.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

use nix::errno::Errno;

use super::executor::Executor;
use super::workers::locked;
use super::{no_space, Bookends, Mode, Pending};
use crate::display::display_path;
use crate::errors::ErrorKind;
use crate::file::FileId;
use crate::sys::{self, dedupe::MAX_REQUEST_LEN, DedupeStatus, DestResult};

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
}

impl DestExtent {
    /// The extent FIEMAP reported, as the bookend decision sees it.
    pub fn from_fiemap(e: &sys::Extent) -> DestExtent {
        let fixed = if e.is_inline() {
            Some(PinReason::Inline)
        } else if e.is_encoded() {
            Some(PinReason::Compressed)
        } else if e.is_unstable() {
            Some(PinReason::NotRewritable)
        } else {
            None
        };
        DestExtent { logical: e.logical, length: e.length, shared: e.is_shared(), fixed }
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
    /// The extent is compressed: its blocks have no address of their own,
    /// so the rest cannot be moved out of it block by block.
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
pub fn decide(extents: &[DestExtent], covered: &[(u64, u64)], file_size: u64, max_ratio: f64) -> Decision {
    let mut out = Decision::default();
    for e in extents.iter().filter(|e| !e.shared) {
        let Some((cov, gaps)) = coverage(e, covered, file_size) else { continue };
        let uncovered: u64 = gaps.iter().map(|g| g.1).sum();
        if cov == 0 || uncovered == 0 {
            continue; // untouched, or freed anyway
        }
        match e.fixed {
            None if uncovered as f64 <= cov as f64 * max_ratio => {
                out.rewrite.extend(gaps);
                out.rewrite_covered += cov;
            }
            None => *out.pinned.entry(PinReason::BelowRewriteRatio).or_default() += cov,
            Some(why) => *out.pinned.entry(why).or_default() += cov,
        }
    }
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

/// A destination's parts found different from their source, merged, and
/// the bytes the plan covered in that file.
pub type FailedParts = (FileId, Vec<(u64, u64)>, u64);

/// The parts of each destination the kernel found different (see
/// [`super::Outcome::differs`]), by file id.
pub fn failed_parts(plan: &crate::plan::Plan, differs: Vec<(FileId, u64, u64)>) -> Vec<FailedParts> {
    let mut by_dest: BTreeMap<FileId, Vec<(u64, u64)>> = BTreeMap::new();
    for (id, off, len) in differs {
        by_dest.entry(id).or_default().push((off, len));
    }
    let mut covered: BTreeMap<FileId, u64> = by_dest.keys().map(|&id| (id, 0)).collect();
    for r in &plan.ranges {
        if let Some(c) = covered.get_mut(&r.dest) {
            *c += r.len;
        }
    }
    by_dest.into_iter().map(|(id, parts)| (id, union(parts), covered[&id])).collect()
}

/// Destinations a worker takes at a time in the bookend pass, to copy
/// their remainders out together ([`Executor::free_bookends`]: their
/// writeback overlaps; on FULL/btrfs the pass took 0.82 s one by one, 0.59
/// s by 32). Each copied destination holds two descriptors until its batch
/// is shared back, so 8 workers hold at most 512.
pub(super) const BATCH: usize = 32;

/// Most bytes of remainders a worker holds copied and not yet shared back
/// (more than this only for one file's remainders).
const STAGED_BYTES: u64 = 64 << 20;

/// A destination whose remainders are to be rewritten.
struct Rewrite {
    id: FileId,
    dest: File,
    size: u64,
    /// The remainders, as `(offset, length)` in the file.
    pieces: Vec<(u64, u64)>,
    /// Covered bytes of the extents being freed: pinned if this fails.
    rewrite_covered: u64,
    /// Bytes the plan shares into the file: pending if there is no room.
    planned: u64,
}

impl Executor<'_> {
    /// After the ranges: destination `id`'s `parts` were found different
    /// from their source and not shared (a fingerprint collision, mostly).
    /// They still reference the old extent the rest of the file's planned
    /// bytes (`covered` in all) left, so that whole extent stays on disk —
    /// a collision in a 100 MiB image extent whose rest was rewritten kept
    /// all 100 MiB and the rewrite. Copy them to fresh extents like a
    /// remainder ([`Executor::free_bookends`]), within the same bound: at
    /// most `max_ratio` times what was shared.
    pub(super) fn unpin_differing(&mut self, id: FileId, parts: &[(u64, u64)], covered: u64, b: &Bookends) {
        let Some(size) = self.files.get(&id).map(|c| c.size) else { return };
        let failed: u64 = parts.iter().map(|p| p.1).sum();
        if failed as f64 > covered.saturating_sub(failed) as f64 * b.max_ratio {
            return;
        }
        let Some(file) = self.open(id) else { return };
        let done = self.copy_out(&file, size, parts).and_then(|tmp| self.share_back(&tmp, &file, parts));
        if let Err(e) = done {
            let path = display_path(&self.files[&id].path);
            self.progress.info(&format!("{path}: cannot rewrite parts that differ from their source: {e}"));
        }
    }

    /// Rewrite the uncovered remainders of the partly covered extents of
    /// a batch of destinations, each with the ranges the plan covers in it
    /// (chosen by [`remainders`]). All the batch's copies are written
    /// first and their writeback started together, then each is shared
    /// back: sharing a range waits for its source to be on disk, and one
    /// wait per file, in turn, was most of this pass's time.
    pub(super) fn free_bookends(&mut self, batch: &[(FileId, Vec<(u64, u64)>)], b: &Bookends) {
        let mut staged = Vec::new();
        let mut staged_bytes = 0;
        for (id, covered) in batch {
            let Some(rw) = self.judge_bookends(*id, covered, b) else { continue };
            match self.copy_out(&rw.dest, rw.size, &rw.pieces) {
                Ok(tmp) => {
                    staged_bytes += rw.pieces.iter().map(|p| p.1).sum::<u64>();
                    staged.push((rw, tmp));
                }
                Err(e) => self.rewritten(&rw, Err(e)),
            }
            // A bound on the copies held at once: temporary space on a
            // nearly full disk, and dirty pages.
            if staged_bytes >= STAGED_BYTES {
                self.share_back_all(std::mem::take(&mut staged));
                staged_bytes = 0;
            }
        }
        self.share_back_all(staged);
    }

    /// Start the writeback of every staged copy, then share each back.
    fn share_back_all(&mut self, staged: Vec<(Rewrite, File)>) {
        for (_, tmp) in &staged {
            // Only a head start: sharing back waits for the data anyway.
            let _ = sys::start_writeback(tmp.as_fd());
        }
        for (rw, tmp) in staged {
            let done = self.share_back(&tmp, &rw.dest, &rw.pieces);
            self.rewritten(&rw, done);
        }
    }

    /// Judge destination `id`'s partly covered extents against what the
    /// plan `covered`: count what stays pinned, and return what to rewrite
    /// (`None`: nothing, or a dry run, which only counts).
    fn judge_bookends(&mut self, id: FileId, covered: &[(u64, u64)], b: &Bookends) -> Option<Rewrite> {
        let size = self.files.get(&id).map(|c| c.size)?;
        // Covered from start to end (a whole-file copy, most
        // destinations): every extent is shared whole, no remainder is
        // left, so neither open nor FIEMAP it here (on btrfs FIEMAP
        // walks the back references of every extent). The share phase
        // still checks the file before using it.
        if matches!(covered[..], [(0, len)] if len >= size) {
            return None;
        }
        let file = self.open(id)?;
        let extents = sys::fiemap(file.as_fd(), 0, size).ok()?;
        self.ctx.note_solo(&extents);
        let extents: Vec<DestExtent> = extents.iter().map(DestExtent::from_fiemap).collect();
        let d = decide(&extents, covered, size, b.max_ratio);
        if d.is_empty() {
            return None;
        }
        self.out.pin_checked.push(id);
        for (&why, &bytes) in &d.pinned {
            self.out.pin(id, why, bytes);
        }
        if d.rewrite.is_empty() {
            return None;
        }
        match self.mode {
            Mode::DryRun => {
                self.out.rewritten_bytes += d.rewrite.iter().map(|p| p.1).sum::<u64>();
                None
            }
            Mode::Share => Some(Rewrite {
                id,
                dest: file,
                size,
                pieces: d.rewrite,
                rewrite_covered: d.rewrite_covered,
                planned: covered.iter().map(|c| c.1).sum(),
            }),
        }
    }

    /// Account for the rewrite `rw`: `Ok(true)` all moved; otherwise the
    /// old extents stay, pinning their covered bytes, or, with no room, the
    /// file is left whole for the next run (its planned bytes pending).
    fn rewritten(&mut self, rw: &Rewrite, done: std::io::Result<bool>) {
        let (id, rewrite_covered, planned) = (rw.id, rw.rewrite_covered, rw.planned);
        match done {
            Ok(true) => {}
            // The old extents stay for the rest not moved out.
            Ok(false) => self.out.pin(id, PinReason::RewriteFailed, rewrite_covered),
            Err(e) if is_no_space(&e) => {
                let path = display_path(&self.files[&id].path);
                // Not shared at all this run: nothing pinned either.
                self.out.pinned.retain(|k, _| k.0 != id);
                locked(&self.ctx.deferred).insert(id);
                self.out.pending.insert(id, (Pending::NoSpaceRewrite, planned));
                self.progress.warn(&format!(
                    "{path}: no space to rewrite partly shared extents ({e}); not shared now, retried by the next run"
                ));
                *self.out.errors.entry(ErrorKind::NoSpace).or_default() += 1;
            }
            Err(e) => {
                let path = display_path(&self.files[&id].path);
                self.progress.warn(&format!("{path}: cannot rewrite partly shared extents: {e}"));
                *self.out.errors.entry(ErrorKind::Rewrite).or_default() += 1;
                self.out.pin(id, PinReason::RewriteFailed, rewrite_covered);
            }
        }
    }

    /// Copy `pieces` of `dest` into an unnamed temporary file on the same
    /// filesystem (in the first starting directory, opened through its held
    /// descriptor), at the same offsets and of the same size, so that an
    /// unaligned tail ends at both EOFs (the kernel shares a partial block
    /// only there).
    fn copy_out(&mut self, dest: &File, size: u64, pieces: &[(u64, u64)]) -> std::io::Result<File> {
        let tmp = self.ctx.tree.tmpfile()?;
        tmp.set_len(size)?;
        for &(off, len) in pieces {
            let mut pos = 0;
            while pos < len {
                let n = ((len - pos) as usize).min(self.buf_a.len());
                dest.read_exact_at(&mut self.buf_a[..n], off + pos)?;
                tmp.write_all_at(&self.buf_a[..n], off + pos)?;
                pos += n as u64;
            }
        }
        Ok(tmp)
    }

    /// Share `pieces` of `tmp` back into `dest` ([`Executor::copy_out`]):
    /// the kernel compares the bytes, and `dest` then references fresh
    /// extents there. `false`: some piece was not moved (the file changed,
    /// or the kernel refused).
    fn share_back(&mut self, tmp: &File, dest: &File, pieces: &[(u64, u64)]) -> std::io::Result<bool> {
        let mut complete = true;
        for &(off, len) in pieces {
            let mut pos = 0;
            while pos < len {
                let n = (len - pos).min(MAX_REQUEST_LEN);
                let r = sys::dedupe_range(tmp.as_fd(), off + pos, n, &[(dest.as_fd(), off + pos)])
                    .map_err(std::io::Error::from)?;
                match r[0] {
                    DestResult { status: DedupeStatus::Same, bytes_deduped } if bytes_deduped > 0 => {
                        self.out.rewritten_bytes += bytes_deduped;
                        pos += bytes_deduped;
                    }
                    // Out of space: the caller leaves the file for later.
                    DestResult { status: DedupeStatus::Error(e), .. } if no_space(e) => {
                        return Err(std::io::Error::from(e));
                    }
                    // Changed meanwhile, or refused: the file keeps its old extent.
                    _ => {
                        complete = false;
                        break;
                    }
                }
            }
        }
        Ok(complete)
    }
}

/// Out of space or quota (the file is left for a later run).
fn is_no_space(e: &std::io::Error) -> bool {
    e.raw_os_error().is_some_and(|n| no_space(Errno::from_raw(n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 4096;

    fn ext(logical: u64, length: u64) -> DestExtent {
        DestExtent { logical, length, shared: false, fixed: None }
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
        let d = decide(&[ext(0, 10 * K)], &[(0, 4 * K)], 1 << 40, 1.0);
        assert_eq!(d, Decision { rewrite: vec![], rewrite_covered: 0, pinned: pins(&[(BelowRewriteRatio, 4 * K)]) });
        // Rewritten: nothing pinned; pinned after all if the rewrite fails.
        let d = decide(&[ext(0, 8 * K)], &[(0, 4 * K)], 1 << 40, 1.0);
        assert_eq!((d.pinned, d.rewrite_covered), (pins(&[]), 4 * K));
        // --rewrite-ratio 0: every partly covered extent is pinned.
        assert_eq!(decide(&[ext(0, 8 * K)], &[(0, 7 * K)], 1 << 40, 0.0).pinned, pins(&[(BelowRewriteRatio, 7 * K)]));
        // Not rewritable and partly covered: pinned for what the extent is.
        for why in [Compressed, Inline, NotRewritable] {
            let e = DestExtent { fixed: Some(why), ..ext(0, 8 * K) };
            let d = decide(&[e], &[(0, 7 * K)], 1 << 40, 1.0);
            assert_eq!(d, Decision { rewrite: vec![], rewrite_covered: 0, pinned: pins(&[(why, 7 * K)]) }, "{why:?}");
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
    fn reason_names_are_stable_and_distinct() {
        let names: Vec<&str> = PinReason::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names, ["below_rewrite_ratio", "compressed", "inline", "not_rewritable", "rewrite_failed"]);
    }

    #[test]
    fn failed_parts_are_merged_per_file_with_what_was_planned_into_it() {
        use crate::plan::{Plan, Range};
        let r = |src: i64, dest: i64, dest_off: u64, len: u64| Range {
            src: FileId(src),
            src_off: 0,
            len,
            dest: FileId(dest),
            dest_off,
        };
        let plan = Plan { ranges: vec![r(1, 2, 0, 8 * K), r(3, 2, 8 * K, K), r(1, 4, 0, 4 * K)] };
        let differs = vec![(FileId(2), 8 * K, K), (FileId(2), 0, K), (FileId(2), 8 * K, K)];
        assert_eq!(failed_parts(&plan, differs), vec![(FileId(2), vec![(0, K), (8 * K, K)], 9 * K)]);
    }

    #[test]
    fn union_merges() {
        assert_eq!(union(vec![(8, 4), (0, 4), (2, 4), (20, 1)]), vec![(0, 6), (8, 4), (20, 1)]);
        assert_eq!(union(vec![(8, 4), (0, 4), (2, 4), (6, 2), (20, 1)]), vec![(0, 12), (20, 1)]);
    }
}
