//! Freeing partly shared extents on btrfs (the "bookend" problem).
//!
//! btrfs frees an extent only when no file references any part of it.
//! Sharing 99% of a destination's extent frees nothing while the other 1%
//! still points at it. This module decides, from a destination file's
//! extents and the ranges the plan will share into it, which *remainders*
//! (uncovered parts of partly covered extents) to rewrite into fresh
//! extents so the old extent can go ([`remainders`], pure, in `decide.rs`),
//! and does it: a share worker copies them to an `O_TMPFILE`, then
//! `FIDEDUPERANGE`s them back, so the kernel verifies every byte and the
//! file never holds anything but its own data. A worker copies out a batch
//! of destinations before sharing any back, so their writes reach the disk
//! together. With no room for the copy (ENOSPC, EDQUOT), or none above
//! `--keep-free` ([`super::headroom`]), the destination is left whole for a
//! later run ([`super::Pending::NoSpaceRewrite`], [`super::Pending::KeepFree`]).
//!
//! XFS counts references per block and needs none of this.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

use nix::errno::Errno;

use super::executor::Executor;
use super::headroom::{kept_free, Headroom};
use super::workers::locked;
use super::{no_space, Bookends, Mode, Pending};
use crate::display::display_path;
use crate::errors::ErrorKind;
use crate::file::FileId;
use crate::sys::beneath::is_no_scratch;
use crate::sys::{self, dedupe::MAX_REQUEST_LEN, DedupeStatus, DestResult};

mod decide;
pub use decide::{decide, remainders, union, Decision, DestExtent, PinReason, WhatIf, WHAT_IF_RATIOS};

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

/// FIEMAP's `extents` of a file of `size` bytes as the decision sees them,
/// each stretch named by its extent on disk, so that the stretches of one
/// extent are judged together ([`decide`]). Without `CAP_SYS_ADMIN`
/// (btrfs's items unreadable) each FIEMAP extent is judged alone, and an
/// extent split by a write into its middle may stay pinned.
fn named_on_disk(file: &File, extents: &[sys::Extent], size: u64, compressed_copies: bool) -> Vec<DestExtent> {
    let rewritable = |e: &sys::Extent| {
        let d = DestExtent::from_fiemap(e, compressed_copies);
        !d.shared && d.fixed.is_none()
    };
    let mut stretches = Vec::new();
    let found = sys::btrfs_tree::file_extents(file.as_fd(), 0..size.max(1), |s| {
        if sys::btrfs_tree::under(extents, &s, rewritable) {
            stretches.push(s);
        }
    });
    match found {
        Ok(()) => sys::btrfs_tree::on_disk(extents, &stretches)
            .iter()
            .map(|(e, disk)| DestExtent::named(e, *disk, compressed_copies))
            .collect(),
        Err(_) => extents.iter().map(|e| DestExtent::from_fiemap(e, compressed_copies)).collect(),
    }
}

/// `pieces` less `holes` (both sorted, each hole inside a piece).
pub fn without(pieces: &[(u64, u64)], holes: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(pieces.len() + holes.len());
    let mut h = holes.iter().peekable();
    for &(off, len) in pieces {
        let (mut at, end) = (off, off + len);
        while let Some(&&(ho, hl)) = h.peek().filter(|&&&(ho, _)| ho < end) {
            if ho > at {
                out.push((at, ho - at));
            }
            at = at.max(ho + hl);
            h.next();
        }
        if at < end {
            out.push((at, end - at));
        }
    }
    out
}

/// A destination whose remainders are to be rewritten.
struct Rewrite {
    id: FileId,
    dest: File,
    size: u64,
    /// The remainders, as `(offset, length)` in the file.
    pieces: Vec<(u64, u64)>,
    /// The parts of `pieces` that are written zeros
    /// ([`Bookends::zero_holes`]), left as holes in the copy.
    holes: Vec<(u64, u64)>,
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
    /// most `max_ratio` times what was shared. Only parts whose extents no
    /// other file references: a part of an extent that another file keeps
    /// (the source itself, when the destination is a reflinked clone of
    /// it; a snapshot) frees nothing when moved out, and the copy is new
    /// space: 21 clones of a 256 MiB file with one collision each took
    /// 112 KiB more after the run than before.
    pub(super) fn unpin_differing(&mut self, id: FileId, parts: &[(u64, u64)], covered: u64, b: &Bookends) {
        let Some(size) = self.files.get(&id).map(|c| c.size) else { return };
        let failed: u64 = parts.iter().map(|p| p.1).sum();
        if failed as f64 > covered.saturating_sub(failed) as f64 * b.max_ratio {
            return;
        }
        let Some(file) = self.open(id) else { return };
        let Ok(extents) = sys::fiemap(file.as_fd(), 0, size) else { return };
        // Nor parts of compressed extents where the copy may be written
        // plain ([`Bookends::rewrite_compressed`]).
        let left = |&(off, len): &(u64, u64)| {
            extents.iter().any(|e| {
                e.logical < off + len
                    && off < e.logical + e.length
                    && (e.is_shared() || (e.is_encoded() && !b.rewrite_compressed))
            })
        };
        let parts: Vec<(u64, u64)> = parts.iter().copied().filter(|p| !left(p)).collect();
        if parts.is_empty() {
            return;
        }
        let parts = &parts[..];
        let done = self.copy_out(b, &file, size, parts).and_then(|tmp| self.share_back(&tmp, &file, parts));
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
            let data = without(&rw.pieces, &rw.holes);
            match self.copy_out(b, &rw.dest, rw.size, &data) {
                Ok(tmp) => {
                    staged_bytes += data.iter().map(|p| p.1).sum::<u64>();
                    staged.push((rw, tmp));
                }
                Err(e) => self.rewritten(b, &rw, Err(e)),
            }
            // A bound on the copies held at once: temporary space on a
            // nearly full disk, and dirty pages.
            if staged_bytes >= STAGED_BYTES {
                self.share_back_all(b, std::mem::take(&mut staged));
                staged_bytes = 0;
            }
        }
        self.share_back_all(b, staged);
    }

    /// Start the writeback of every staged copy, then share each back.
    fn share_back_all(&mut self, b: &Bookends, staged: Vec<(Rewrite, File)>) {
        for (_, tmp) in &staged {
            // Only a head start: sharing back waits for the data anyway.
            let _ = sys::start_writeback(tmp.as_fd());
        }
        for (rw, tmp) in staged {
            let done = self.share_back_rewrite(&tmp, &rw);
            self.rewritten(b, &rw, done);
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
        let extents = named_on_disk(&file, &extents, size, b.rewrite_compressed);
        let d = decide(&extents, covered, size, b.max_ratio);
        if d.is_empty() {
            return None;
        }
        self.out.pin_checked.push(id);
        for (&why, &bytes) in &d.pinned {
            self.out.pin(id, why, bytes);
        }
        super::add_what_if(&mut self.out.rewrite_what_if, &d.what_if);
        if d.rewrite.is_empty() {
            return None;
        }
        let holes = match b.zero_holes {
            Some(min) => self.zero_runs(&file, &d.rewrite, min),
            None => Vec::new(),
        };
        let rw = Rewrite {
            id,
            dest: file,
            size,
            pieces: d.rewrite,
            holes,
            rewrite_covered: d.rewrite_covered,
            planned: covered.iter().map(|c| c.1).sum(),
        };
        // Nowhere to copy to: known before any copy, in a dry run too.
        if let Err(e) = self.ctx.tree.scratch() {
            self.rewritten(b, &rw, Err(e));
            return None;
        }
        match self.mode {
            Mode::Share => Some(rw),
            Mode::DryRun => {
                // Counted as the run would copy it: within the budget, or
                // left whole for later ([`Headroom`]'s dry run).
                let holes = rw.holes.iter().map(|p| p.1).sum::<u64>();
                let bytes = rw.pieces.iter().map(|p| p.1).sum::<u64>() - holes;
                match b.room.take(bytes) {
                    Ok(()) => {
                        self.out.rewritten_bytes += bytes;
                        self.out.zeros_to_holes_bytes += holes;
                        self.out.zeros_to_holes_files += u64::from(holes > 0);
                        if holes > 0 {
                            self.out.holed.insert(rw.id, rw.holes.clone());
                        }
                    }
                    Err(e) => self.rewritten(b, &rw, Err(e)),
                }
                None
            }
        }
    }

    /// Account for the rewrite `rw`: `Ok(true)` all moved; otherwise the
    /// old extents stay, pinning their covered bytes, or, with no room (or
    /// none above `--keep-free`), the file is left whole for the next run
    /// (its planned bytes pending).
    fn rewritten(&mut self, b: &Bookends, rw: &Rewrite, done: std::io::Result<bool>) {
        let (id, rewrite_covered, planned) = (rw.id, rw.rewrite_covered, rw.planned);
        match done {
            Ok(true) => {}
            // The old extents stay for the rest not moved out.
            Ok(false) => self.out.pin(id, PinReason::RewriteFailed, rewrite_covered),
            Err(e) if kept_free(&e) => {
                self.leave_whole(id, Pending::KeepFree, planned);
                // Not an error: said once a run, counted as pending.
                if b.room.first_refusal() {
                    let path = display_path(&self.files[&id].path);
                    let (not, then) = match self.mode {
                        Mode::DryRun => (
                            "would not be",
                            "would wait for the room this run's sharing would free, else for the next run",
                        ),
                        Mode::Share => ("not", "wait for the room this run's sharing frees, else for the next run"),
                    };
                    self.progress.warn(&format!(
                        "{path}: partly shared extents {not} rewritten: {e}; this file and any others like it {then} \
                         (pending in the report)"
                    ));
                }
            }
            // The volume (or a quota) is full: as for `--keep-free`, said
            // and counted once; the file waits for a later round.
            Err(e) if is_no_space(&e) => {
                self.leave_whole(id, Pending::NoSpaceRewrite, planned);
                b.said_no_space.call_once(|| {
                    let path = display_path(&self.files[&id].path);
                    self.progress.warn(&format!(
                        "{path}: no space to rewrite partly shared extents ({e}); this file and any others like it \
                         wait for the room this run's sharing frees, else for the next run (pending in the report)"
                    ));
                    *self.out.errors.entry(ErrorKind::NoSpace).or_default() += 1;
                });
            }
            // The same for every file: said and counted once.
            Err(e) if is_no_scratch(&e) => {
                self.leave_whole(id, Pending::RewriteNotAllowed, planned);
                b.said_no_scratch.call_once(|| {
                    let not = if self.mode == Mode::DryRun { "would not be" } else { "not" };
                    self.progress.warn(&format!(
                        "partly shared extents cannot be rewritten: {e}; files that need it {not} shared, \
                         pending (rewrite_not_allowed) for a run that may"
                    ));
                    *self.out.errors.entry(ErrorKind::Rewrite).or_default() += 1;
                });
            }
            Err(e) => {
                let path = display_path(&self.files[&id].path);
                self.progress.warn(&format!("{path}: cannot rewrite partly shared extents: {e}"));
                *self.out.errors.entry(ErrorKind::Rewrite).or_default() += 1;
                self.out.pin(id, PinReason::RewriteFailed, rewrite_covered);
            }
        }
    }

    /// Leave destination `id` whole for a later run (`why`, with the
    /// `planned` bytes): not shared at all this run, so nothing is pinned
    /// either.
    fn leave_whole(&mut self, id: FileId, why: Pending, planned: u64) {
        self.out.pinned.retain(|k, _| k.0 != id);
        locked(&self.ctx.deferred).insert(id, why);
        self.out.pending.insert(id, (why, planned));
        if why.waits_for_room() {
            self.out.kept_whole.insert(id);
        }
    }

    /// Copy `pieces` of `dest` out ([`copy_out`]), in the first starting
    /// directory (opened through its held descriptor).
    fn copy_out(&mut self, b: &Bookends, dest: &File, size: u64, pieces: &[(u64, u64)]) -> std::io::Result<File> {
        copy_out(&b.room, || self.ctx.tree.tmpfile(), dest, size, pieces, &mut self.buf_a)
    }

    /// Share `pieces` of `tmp` back into `dest` ([`share_back`]), counting
    /// the bytes moved.
    fn share_back(&mut self, tmp: &File, dest: &File, pieces: &[(u64, u64)]) -> std::io::Result<bool> {
        let (complete, moved) = share_back(tmp, dest, pieces, || true)?;
        self.out.rewritten_bytes += moved;
        Ok(complete)
    }

    /// Share the remainders of `rw` back from `tmp` ([`share_back`]): the
    /// data copied, counted as rewritten, and the zeros left as holes in
    /// `tmp`, which become holes.
    fn share_back_rewrite(&mut self, tmp: &File, rw: &Rewrite) -> std::io::Result<bool> {
        let (data, moved) = share_back(tmp, &rw.dest, &without(&rw.pieces, &rw.holes), || true)?;
        self.out.rewritten_bytes += moved;
        let (zeros, holed) = share_back(tmp, &rw.dest, &rw.holes, || true)?;
        self.out.zeros_to_holes_bytes += holed;
        self.out.zeros_to_holes_files += u64::from(holed > 0);
        if holed > 0 {
            self.out.holed.insert(rw.id, rw.holes.clone());
        }
        Ok(data && zeros)
    }

    /// The written zeros of `pieces` of `f`: runs of whole blocks of at
    /// least `min` bytes (shorter ones would cost an extent item each),
    /// read through the executor's buffer. Unreadable: none (the copy
    /// meets the error).
    fn zero_runs(&mut self, f: &File, pieces: &[(u64, u64)], min: u64) -> Vec<(u64, u64)> {
        let block = self.ctx.block_size;
        let mut runs = Vec::new();
        for &(off, len) in pieces {
            let mut run: Option<(u64, u64)> = None;
            // Whole blocks only: the kernel shares a partial one only at EOF.
            let (mut pos, end) = (off.div_ceil(block) * block, (off + len) / block * block);
            while pos < end {
                let n = (end - pos).min(self.buf_a.len() as u64 / block * block);
                if f.read_exact_at(&mut self.buf_a[..n as usize], pos).is_err() {
                    return Vec::new();
                }
                for (i, b) in self.buf_a[..n as usize].chunks_exact(block as usize).enumerate() {
                    let at = pos + i as u64 * block;
                    match (b.iter().all(|&x| x == 0), run) {
                        (true, Some((s, _))) => run = Some((s, at + block)),
                        (true, None) => run = Some((at, at + block)),
                        (false, Some((s, e))) => {
                            runs.extend((e - s >= min).then_some((s, e - s)));
                            run = None;
                        }
                        (false, None) => {}
                    }
                }
                pos += n;
            }
            if let Some((s, e)) = run {
                runs.extend((e - s >= min).then_some((s, e - s)));
            }
        }
        runs
    }
}

/// Copy `pieces` of `dest` into `tmp`, an unnamed temporary file on the
/// same filesystem, at the same offsets and made of the same size, so that
/// an unaligned tail ends at both EOFs (the kernel shares a partial block
/// only there), through `buf` — once `room` grants the bytes
/// ([`Headroom::take`]). Used by the bookend pass and by the zero pass
/// (`zeros::rewrite`).
pub fn copy_out(
    room: &Headroom,
    tmp: impl FnOnce() -> std::io::Result<File>,
    dest: &File,
    size: u64,
    pieces: &[(u64, u64)],
    buf: &mut [u8],
) -> std::io::Result<File> {
    room.take(pieces.iter().map(|p| p.1).sum())?;
    let tmp = tmp()?;
    // Checksums or not as `dest` has them, or btrfs refuses to share the
    // copy back; unknown (no CAP_SYS_ADMIN, XFS): as made.
    let _ = sys::btrfs_tree::match_checksums(tmp.as_fd(), dest.as_fd());
    tmp.set_len(size)?;
    for &(off, len) in pieces {
        let mut pos = 0;
        while pos < len {
            let n = ((len - pos) as usize).min(buf.len());
            dest.read_exact_at(&mut buf[..n], off + pos)?;
            tmp.write_all_at(&buf[..n], off + pos)?;
            pos += n as u64;
        }
    }
    Ok(tmp)
}

/// Share `pieces` of `tmp` back into `dest` ([`copy_out`]): the kernel
/// compares the bytes, and `dest` then references fresh extents there.
/// `still_same` is asked before each request (`false` stops). Returns
/// whether every piece moved (not: the file changed, or the kernel refused
/// one; the file keeps its old extent there) and the bytes moved; out of space is an error (the
/// caller leaves the file for later).
pub fn share_back(
    tmp: &File,
    dest: &File,
    pieces: &[(u64, u64)],
    mut still_same: impl FnMut() -> bool,
) -> std::io::Result<(bool, u64)> {
    let (mut complete, mut moved) = (true, 0);
    for &(off, len) in pieces {
        let mut pos = 0;
        while pos < len {
            if !still_same() {
                return Ok((false, moved));
            }
            let n = (len - pos).min(MAX_REQUEST_LEN);
            let r = sys::dedupe_range(tmp.as_fd(), off + pos, n, &[(dest.as_fd(), off + pos)])
                .map_err(std::io::Error::from)?;
            match r[0] {
                DestResult { status: DedupeStatus::Same, bytes_deduped } if bytes_deduped > 0 => {
                    moved += bytes_deduped;
                    pos += bytes_deduped;
                }
                DestResult { status: DedupeStatus::Error(e), .. } if no_space(e) => {
                    return Err(std::io::Error::from(e));
                }
                // Changed meanwhile, or refused: on to the next piece.
                _ => {
                    complete = false;
                    break;
                }
            }
        }
    }
    Ok((complete, moved))
}

/// Out of space or quota (the file is left for a later run).
fn is_no_space(e: &std::io::Error) -> bool {
    e.raw_os_error().is_some_and(|n| no_space(Errno::from_raw(n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 4096;

    #[test]
    fn holes_are_cut_out_of_the_pieces() {
        let pieces = [(0, 100 * K), (200 * K, 50 * K), (300 * K, 10 * K)];
        let holes = [(10 * K, 20 * K), (40 * K, 60 * K), (200 * K, 50 * K)];
        assert_eq!(without(&pieces, &holes), vec![(0, 10 * K), (30 * K, 10 * K), (300 * K, 10 * K)]);
        assert_eq!(without(&pieces, &[]), pieces.to_vec());
        assert!(without(&[], &holes).is_empty());
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
}
