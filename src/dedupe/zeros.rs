//! Written zero blocks turned into holes.
//!
//! The block map gives zero blocks and holes one fingerprint, 0, and the
//! plan never groups it: sharing zeros with zeros frees no more than a hole
//! would. But a zero block that was *written* — a thick-provisioned VM
//! image, a file preallocated by writing zeros, the free space of a disk
//! image made with `dd if=/dev/zero` — takes its block on disk, and no tool
//! we are compared with frees it (duperemove hashes extents, which differ
//! around the zeros). `FIDEDUPERANGE` from a *hole* of an unnamed file of
//! our own does: both filesystems map the hole into the destination (XFS
//! unmaps the blocks, btrfs drops the file extent items), after the kernel
//! compared the destination's bytes with the hole's zeros under lock — a
//! block written since the scan answers `DIFFERS` and stays as it is. The
//! file reads the same, byte for byte; only its allocation changes.
//!
//! Which zero runs (the map's runs of fingerprint 0 of at least
//! [`MIN_BYTES`]; on XFS also a shorter one that is a whole extent, which
//! splits nothing) are worth it is decided by FIEMAP at share time, a call
//! per window of a file that has such runs ([`plan_on_disk`]): only written
//! extents with blocks of their own (shared ones too, below). `UNWRITTEN`
//! stays (preallocated on purpose with `fallocate`, and it costs no read
//! anyway); compressed, inline, delayed or unknown extents have no blocks
//! of their own. On btrfs a hole in part of an extent frees nothing while
//! the rest holds it (the bookend problem of `bookend.rs`): an extent
//! wholly zero is punched; one partly zero is punched only if its data (the
//! rest) is at most `--rewrite-ratio` times its zeros, and that data is
//! then rewritten first, as the bookend pass does — copied to an unnamed
//! file and shared back, the kernel comparing every byte — so the old
//! extent is referenced by nothing and freed ([`plan_on_disk`]).
//!
//! An extent flagged `SHARED` (a reflinked clone holds it too: `cp` makes
//! one by default since coreutils 9) is freed only once every holder lets
//! go. XFS frees block by block, so there the zeros are punched in every
//! file of the run that holds them: the last one to let go finds them no
//! longer shared and frees them, and only that punch counts as freed
//! ([`ExtentWork::shared`]). A holder outside the run keeps them; the
//! punches then free nothing but change no byte. btrfs frees an extent
//! only when no holder references any of it, so a shared extent is punched
//! only where the file holds nothing of it but zeros (a zero image written
//! with `dd`, installed into, and copied; `gaps_as_zeros`), and only when
//! every holder is a file of the run (asked of btrfs,
//! `pipeline/zeros/shared.rs`). An extent shared with data in it is freed
//! by all its holders at once: the data copied once and shared into each,
//! every holder's zeros punched ([`clones`]).
//!
//! The source is a hole, so it carries nobody's data: unlike the plan's
//! ranges, a destination of any owner may be turned into holes (nothing is
//! learnt from it but what `stat` shows: the file is sparser).

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

use crate::blockmap::BlockMap;
use crate::sys::dedupe::{dedupe_range, DedupeStatus, MAX_REQUEST_LEN};
use crate::sys::fiemap::Extent;

pub mod clones;

/// The most bytes of holders' stretches the kernel may compare for each
/// byte of shared zeros freed: per extent where its holders let go
/// together (`clones::plan`), per block of disk a run where each lets go
/// alone (`pipeline::zeros`, `SharedZeros::may_compare`). Every punch and
/// every share into a holder has the kernel compare that holder's
/// stretch, read from disk where the scan never read it (a clone's extents
/// are hashed once). 300 clones of an image half zeros compare 600 times
/// what they free; a user who makes 100,000 clones of a small file of
/// theirs would make a root run read 100,000 times it, and again every
/// night that run stops at its `--max-runtime` before the end.
pub const MAX_COMPARED_PER_ZERO: u64 = 1024;

/// The shortest zero run turned into a hole: 64 KiB. Scattered zero blocks
/// inside data (a database's empty pages, padding) would cost an extent
/// record each for 4 KiB, and split the file; whole zero regions are what
/// thick images and preallocated files hold.
pub const MIN_BYTES: u64 = 64 * 1024;

/// The runs of whole zero blocks of at least `min` bytes in the map of a
/// file of `size` bytes, as sorted byte ranges `(offset, length)`. Holes are
/// in them too: the map cannot tell them apart (FIEMAP does, later). The
/// partial last block is never in a run.
pub fn zero_runs(map: &BlockMap, size: u64, block: u64, min: u64) -> Vec<(u64, u64)> {
    let whole = size / block;
    let mut out = Vec::new();
    let mut push = |from: u64, to: u64| {
        let to = to.min(whole);
        if to > from && (to - from) * block >= min {
            out.push((from * block, (to - from) * block));
        }
    };
    let mut next = 0;
    for r in map.runs() {
        push(next, r.start);
        next = r.end();
    }
    push(next, map.len().max(whole));
    out
}

/// The bytes of the zero `runs` (sorted, not overlapping) that lie in the
/// stretches `g` of one extent: what the file would let go of there.
pub fn within(runs: &[(u64, u64)], g: &[Extent]) -> u64 {
    g.iter()
        .map(|e| {
            let (lo, hi) = (e.logical, e.logical + e.length);
            let from = runs.partition_point(|r| r.0 + r.1 <= lo);
            runs[from..].iter().take_while(|r| r.0 < hi).map(|r| (r.0 + r.1).min(hi) - r.0.max(lo)).sum::<u64>()
        })
        .sum()
}

/// Whether a zero run in `e` may become a hole: written, with blocks of its
/// own (see the module's doc).
pub fn eligible(e: &Extent) -> bool {
    use crate::sys::fiemap::flags;
    e.has_address() && !e.is_encoded() && !e.is_inline() && e.flags & flags::UNWRITTEN == 0
}

/// What to do with one extent of a file of `size` bytes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ExtentWork {
    /// Byte ranges to turn into holes.
    pub punch: Vec<(u64, u64)>,
    /// Byte ranges of data to rewrite first (btrfs), so the extent is
    /// referenced by nothing once `punch` is done.
    pub rewrite: Vec<(u64, u64)>,
    /// The extent is shared (with a reflinked clone): `punch` frees
    /// nothing until every holder has let go, so it is not counted freed.
    pub shared: bool,
    /// btrfs: the parts of `punch` between the zero runs, each shorter than
    /// a run, read first (`reads_zero`); if one is data, see
    /// [`gaps_are_data`] (`gaps_as_zeros`).
    pub gaps: Vec<(u64, u64)>,
    /// btrfs: the extent is shared with data in it, and this file holds
    /// zeros of it: nothing to do here alone, but all its holders may let
    /// go together ([`clones`]).
    pub clones: bool,
}

/// The work on one extent given the file's zero `runs` (sorted byte
/// ranges, whole blocks): its parts in the runs, in whole `block`s. XFS
/// (`btrfs_ratio` `None`) frees blocks one by one: each part of at least
/// `min` bytes is punched, or that is the whole extent, in a shared extent
/// too (`shared`). btrfs
/// (`Some(ratio)`) frees an extent only whole: wholly zero (in this file's
/// stretches), it is punched, shared or not; with every piece between its
/// runs shorter than a run, those are tried as zeros (`gaps_as_zeros`);
/// else, not shared, its parts are punched and its data rewritten if the
/// zeros come to at least `min` and the data to at most `ratio` times
/// them; shared, it is left to all its holders at once (`clones`); else
/// nothing.
///
/// On btrfs the extent is one on disk, and `stretches` all the file's
/// stretches of it, in file order (a write into its middle splits it;
/// `sys::btrfs_tree::on_disk`); elsewhere, one FIEMAP extent. It is freed
/// only when no stretch is referenced, so its zeros and data are weighed
/// over all of them: judged stretch by stretch, zeros were punched in
/// stretches of extents the other stretches kept, and data rewritten out
/// of them, for nothing (a thick image changed in place had more in use
/// after the pass than before).
pub fn plan_on_disk(
    stretches: &[Extent],
    runs: &[(u64, u64)],
    size: u64,
    block: u64,
    min: u64,
    btrfs_ratio: Option<f64>,
) -> ExtentWork {
    let mut work = ExtentWork { shared: stretches.iter().any(Extent::is_shared), ..Default::default() };
    if !stretches.iter().all(eligible) {
        return ExtentWork::default();
    }
    let mut data = 0;
    for e in stretches {
        let (start, end) = (e.logical, (e.logical + e.length).min(size));
        let mut at = start;
        for (o, l) in zeros_in(runs, start, end, block) {
            if o > at {
                work.rewrite.push((at, o - at));
            }
            work.punch.push((o, l));
            at = o + l;
        }
        if end > at {
            work.rewrite.push((at, end - at));
        }
        data += end.saturating_sub(start);
    }
    let zero_bytes: u64 = work.punch.iter().map(|z| z.1).sum();
    let data = data - zero_bytes;
    let Some(ratio) = btrfs_ratio else {
        // A part that is the whole extent splits nothing, whatever its
        // length: a clone written in place keeps such pieces of shared
        // zeros between its writes, the only holder once the others let
        // go.
        let whole = |z: &(u64, u64)| stretches.iter().any(|e| (e.logical, e.logical + e.length) == (z.0, z.0 + z.1));
        work.punch.retain(|z| z.1 >= min || whole(z));
        work.rewrite.clear();
        return work;
    };
    if data == 0 {
        return work;
    }
    if short_pieces(&work.rewrite, block, min) {
        return gaps_as_zeros(work);
    }
    if work.shared {
        return ExtentWork { clones: zero_bytes > 0, ..Default::default() };
    }
    if zero_bytes < min || data as f64 > ratio * zero_bytes as f64 {
        return ExtentWork::default();
    }
    work
}

/// The byte ranges to map for the sorted zero `runs`: runs at most `gap`
/// bytes apart together (the short runs between a clone's writes, with
/// the long ones around them), each range at most `window` bytes (a
/// longer run cut), so that such a file costs a FIEMAP call a window, not
/// a run. Runs further apart are mapped apart: the data between them is
/// not mapped (on btrfs, FIEMAP asks who shares each extent it lists).
pub fn windows(runs: &[(u64, u64)], window: u64, gap: u64) -> Vec<std::ops::Range<u64>> {
    let mut out: Vec<std::ops::Range<u64>> = Vec::new();
    for &(o, l) in runs {
        let mut at = o;
        while at < o + l {
            let end = (at + window).min(o + l);
            match out.last_mut() {
                Some(w) if at - w.end <= gap && end - w.start <= window => w.end = end,
                _ => out.push(at..end),
            }
            at = end;
        }
    }
    out
}

/// Whether every piece is whole blocks shorter than a zero run can be.
fn short_pieces(pieces: &[(u64, u64)], block: u64, min: u64) -> bool {
    pieces.iter().all(|&(o, l)| l < min && o % block == 0 && l % block == 0)
}

/// btrfs: an extent whose pieces between the zero runs are all shorter than
/// a run can be. They may be zeros too: a file written in place in a few
/// blocks (a reflinked clone, a running image) has its zero runs split into
/// pieces, some short. They are read first (`gaps`; if one is data,
/// [`gaps_are_data`]), then punched with the runs, the kernel comparing
/// each with zeros: the extent is freed without a copy. A shared extent is
/// punched only so: where this file holds nothing of it but zeros (its data
/// would have to be rewritten into every holder).
fn gaps_as_zeros(mut work: ExtentWork) -> ExtentWork {
    work.gaps = std::mem::take(&mut work.rewrite);
    work.punch.extend_from_slice(&work.gaps);
    work.punch.sort_unstable();
    work
}

/// The work on an extent whose `gaps` read as data after all: none if it is
/// shared; else its runs punched and the gaps rewritten, if the zeros come
/// to at least `min` and the gaps to at most `ratio` times them (as
/// [`plan_on_disk`] weighs them).
pub fn gaps_are_data(mut work: ExtentWork, ratio: f64, min: u64) -> ExtentWork {
    if work.shared {
        return ExtentWork { clones: true, ..Default::default() };
    }
    let gaps = std::mem::take(&mut work.gaps);
    work.punch.retain(|p| gaps.binary_search(p).is_err());
    let (zeros, data): (u64, u64) = (work.punch.iter().map(|p| p.1).sum(), gaps.iter().map(|g| g.1).sum());
    if zeros < min || data as f64 > ratio * zeros as f64 {
        return ExtentWork::default();
    }
    work.rewrite = gaps;
    work
}

/// Whether the `parts` of `f` read as zeros (`buf`: scratch, grown to 1 MiB
/// at most). A part that cannot be read does not.
pub fn reads_zero(f: &File, parts: &[(u64, u64)], buf: &mut Vec<u8>) -> bool {
    parts.iter().all(|&(off, len)| {
        (0..len).step_by(1 << 20).all(|o| {
            let n = (len - o).min(1 << 20) as usize;
            buf.resize(buf.len().max(n), 0);
            f.read_exact_at(&mut buf[..n], off + o).is_ok() && buf[..n].iter().all(|&b| b == 0)
        })
    })
}

/// The parts of `runs` within `[start, end)`, in whole blocks.
fn zeros_in(runs: &[(u64, u64)], start: u64, end: u64, block: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
    let first = runs.partition_point(|&(o, l)| o + l <= start);
    runs[first..]
        .iter()
        .take_while(move |&&(o, _)| o < end)
        .map(move |&(o, l)| ((o.max(start)).div_ceil(block) * block, (o + l).min(end) / block * block))
        .filter(|(a, b)| b > a)
        .map(|(a, b)| (a, b - a))
}

/// What one file's parts came to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Punched {
    /// Bytes now holes (a dry run: bytes read back as zeros).
    pub bytes: u64,
    /// Parts the kernel found no longer zero (written since the scan).
    pub differs: u64,
}

/// Turn `parts` of `dest` into holes from `hole` (an unnamed file of at
/// least [`MAX_REQUEST_LEN`] bytes with no data), [`MAX_REQUEST_LEN`] at a
/// time; without one (a dry run, which makes no file): read them back and
/// count the bytes that are zeros instead. `still_same` is asked before
/// each request (the file may change under us). The first error the
/// kernel gives for this file stops it.
pub fn punch(
    hole: Option<&File>,
    dest: &File,
    parts: &[(u64, u64)],
    mut still_same: impl FnMut() -> bool,
) -> Result<Punched, nix::errno::Errno> {
    let mut done = Punched::default();
    let mut buf = Vec::new();
    for &(off, len) in parts {
        let mut at = off;
        while at < off + len {
            if !still_same() {
                return Ok(done);
            }
            let n = (off + len - at).min(MAX_REQUEST_LEN);
            let Some(hole) = hole else {
                if reads_zero(dest, &[(at, n)], &mut buf) {
                    done.bytes += n
                } else {
                    done.differs += 1
                }
                at += n;
                continue;
            };
            super::prefetch_request(dest, at, off + len);
            let r = dedupe_range(hole.as_fd(), 0, n, &[(dest.as_fd(), at)])?[0];
            match r.status {
                DedupeStatus::Same if r.bytes_deduped > 0 => {
                    done.bytes += r.bytes_deduped;
                    at += r.bytes_deduped;
                }
                DedupeStatus::Same | DedupeStatus::Differs => {
                    done.differs += 1;
                    at += n;
                }
                DedupeStatus::Error(e) => return Err(e),
            }
        }
    }
    Ok(done)
}

/// Rewrite the data `pieces` of `dest` (a file of `size` bytes) into fresh
/// extents, as the bookend pass does (`bookend::copy_out`, within `room`,
/// then `bookend::share_back`: the kernel compares every byte).
/// `Ok(false)`: some piece was not moved (the file changed, or the kernel
/// refused): its old extent stays, so the caller leaves the zeros there
/// too. A dry run copies nothing, but within the same budget.
pub fn rewrite(
    room: &super::headroom::Headroom,
    tmpfile: impl FnOnce() -> std::io::Result<File>,
    dest: &File,
    size: u64,
    pieces: &[(u64, u64)],
    dry_run: bool,
    still_same: impl FnMut() -> bool,
) -> std::io::Result<bool> {
    if dry_run {
        return room.take(pieces.iter().map(|p| p.1).sum()).map(|()| true);
    }
    let tmp = super::bookend::copy_out(room, tmpfile, dest, size, pieces, &mut vec![0u8; 1 << 20])?;
    Ok(super::bookend::share_back(&tmp, dest, pieces, still_same)?.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::fiemap::flags;

    const K: u64 = 1024;

    fn ext(logical: u64, length: u64, flags: u32) -> Extent {
        Extent { logical, physical: 1 << 30, length, flags }
    }

    #[test]
    fn within_counts_the_runs_inside_the_stretches_only() {
        let runs = [(0, 64 * K), (128 * K, 128 * K), (512 * K, 64 * K)];
        let g = [ext(32 * K, 160 * K, 0), ext(500 * K, 8 * K, 0)];
        // 32 KiB of the first run, 64 KiB of the second, none of the third.
        assert_eq!(within(&runs, &g), 96 * K);
        assert_eq!(within(&[], &g), 0);
    }

    #[test]
    fn zero_runs_are_whole_blocks_of_the_minimum_length() {
        // data, 20 zero blocks, data, 3 zero blocks, data, 17 zero blocks, a partial block.
        let mut fps = vec![7u64];
        fps.extend([0; 20]);
        fps.push(8);
        fps.extend([0; 3]);
        fps.push(9);
        fps.extend([0; 17]);
        let map = BlockMap::from_fps(&fps);
        let size = fps.len() as u64 * 4 * K + 100;
        assert_eq!(zero_runs(&map, size, 4 * K, 64 * K), vec![(4 * K, 80 * K), (104 * K, 68 * K)]);
        // The zero tail past the map (a hole to the end) counts; past the
        // last whole block it does not.
        let map = BlockMap::from_fps(&[7]);
        assert_eq!(zero_runs(&map, 40 * 4 * K + 1, 4 * K, 64 * K), vec![(4 * K, 39 * 4 * K)]);
        assert!(zero_runs(&BlockMap::from_fps(&[7; 40]), 160 * K, 4 * K, 64 * K).is_empty());
    }

    #[test]
    fn only_written_extents_with_blocks_of_their_own() {
        let runs = [(0, 1024 * K)];
        for f in [flags::UNWRITTEN, flags::ENCODED, flags::DATA_INLINE, flags::DELALLOC] {
            for ratio in [None, Some(1.0)] {
                let w = plan_on_disk(&[ext(0, 1024 * K, f)], &runs, 1024 * K, 4 * K, 64 * K, ratio);
                assert_eq!(w, ExtentWork::default(), "{f:#x}");
            }
        }
        let w = plan_on_disk(&[ext(0, 1024 * K, flags::LAST)], &runs, 1024 * K, 4 * K, 64 * K, Some(1.0));
        assert_eq!((w.punch, w.rewrite, w.shared), (vec![(0, 1024 * K)], vec![], false));
    }

    #[test]
    fn a_shared_extent_is_punched_on_xfs_and_where_wholly_zero_on_btrfs() {
        let runs = [(0, 1024 * K)];
        let shared = ext(0, 1024 * K, flags::SHARED);
        let w = plan_on_disk(&[shared], &runs, 1024 * K, 4 * K, 64 * K, None);
        assert_eq!((w.punch, w.rewrite, w.shared), (runs.to_vec(), vec![], true));
        // Zeros in a shared unwritten extent: nothing to free either way.
        let unwritten = ext(0, 1024 * K, flags::SHARED | flags::UNWRITTEN);
        assert_eq!(plan_on_disk(&[unwritten], &runs, 1024 * K, 4 * K, 64 * K, None), ExtentWork::default());
        // btrfs: wholly zero in this file, punched (if every holder is in
        // the run, asked later); with data in it, left.
        let w = plan_on_disk(&[shared], &runs, 1024 * K, 4 * K, 64 * K, Some(1.0));
        assert_eq!((w.punch, w.rewrite, w.shared), (runs.to_vec(), vec![], true));
        let part = [(0, 900 * K)];
        let clones = ExtentWork { clones: true, ..Default::default() };
        assert_eq!(plan_on_disk(&[shared], &part, 1024 * K, 4 * K, 64 * K, Some(4.0)), clones);
        // Pieces between the runs shorter than a run: tried as zeros too.
        let split = [(0, 500 * K), (504 * K, 400 * K), (960 * K, 64 * K)];
        let w = plan_on_disk(&[shared], &split, 1024 * K, 4 * K, 64 * K, Some(1.0));
        assert_eq!(
            (&w.punch, &w.rewrite, w.shared),
            (
                &vec![(0, 500 * K), (500 * K, 4 * K), (504 * K, 400 * K), (904 * K, 56 * K), (960 * K, 64 * K)],
                &vec![],
                true
            )
        );
        assert_eq!(w.gaps, vec![(500 * K, 4 * K), (904 * K, 56 * K)]);
        // Data after all: a shared extent is left to all its holders at
        // once; one held alone has its runs punched and its gaps
        // rewritten, within the ratio.
        assert_eq!(gaps_are_data(w, 4.0, 64 * K), clones);
        let alone = plan_on_disk(&[ext(0, 1024 * K, 0)], &split, 1024 * K, 4 * K, 64 * K, Some(1.0));
        assert_eq!((alone.punch.len(), alone.rewrite.len(), alone.gaps.len()), (5, 0, 2));
        let w = gaps_are_data(alone.clone(), 1.0, 64 * K);
        assert_eq!((w.punch, w.rewrite), (split.to_vec(), vec![(500 * K, 4 * K), (904 * K, 56 * K)]));
        assert_eq!(gaps_are_data(alone, 0.0, 64 * K), ExtentWork::default());
        // Not a piece of a partial last block: data, left to all the
        // holders at once.
        let w = plan_on_disk(&[shared], &[(0, 1020 * K)], 1022 * K, 4 * K, 64 * K, Some(1.0));
        assert_eq!(w, clones);
        let alone = plan_on_disk(&[ext(0, 1024 * K, 0)], &part, 1024 * K, 4 * K, 64 * K, Some(4.0));
        assert_eq!((alone.punch, alone.rewrite), (part.to_vec(), vec![(900 * K, 124 * K)]));
    }

    #[test]
    fn xfs_punches_each_part_long_enough() {
        // Runs [64K, 400K) and [600K, 700K); one extent [0, 1M).
        let runs = [(64 * K, 336 * K), (600 * K, 100 * K)];
        let w = plan_on_disk(&[ext(0, 1024 * K, 0)], &runs, 1024 * K, 4 * K, 64 * K, None);
        assert_eq!((w.punch, w.rewrite), (runs.to_vec(), vec![]));
        // Clipped to the extent: under the minimum, left.
        let w = plan_on_disk(&[ext(360 * K, 100 * K, 0)], &runs, 1024 * K, 4 * K, 64 * K, None);
        assert!(w.punch.is_empty());
        // A short run that is a whole extent (between two writes in place
        // of a clone) splits nothing: punched.
        let short = [(64 * K, 36 * K)];
        let w = plan_on_disk(&[ext(64 * K, 36 * K, flags::SHARED)], &short, 1024 * K, 4 * K, 64 * K, None);
        assert_eq!((w.punch, w.shared), (short.to_vec(), true));
        let w = plan_on_disk(&[ext(60 * K, 40 * K, flags::SHARED)], &short, 1024 * K, 4 * K, 64 * K, None);
        assert!(w.punch.is_empty());
    }

    #[test]
    fn windows_hold_runs_close_to_each_other_up_to_their_length() {
        let runs = [(0, 10), (20, 10), (40, 30), (100, 5)];
        assert_eq!(windows(&runs, 32, 10), vec![0..30, 40..70, 100..105]);
        assert_eq!(windows(&runs, 200, 30), vec![0..105]);
        assert_eq!(windows(&runs, 200, 10), vec![0..70, 100..105]);
        assert_eq!(windows(&[(0, 70)], 32, 0), vec![0..32, 32..64, 64..70]);
        assert_eq!(windows(&[], 32, 10), vec![]);
    }

    #[test]
    fn btrfs_frees_an_extent_whole_or_not_at_all() {
        let runs = [(64 * K, 336 * K), (600 * K, 100 * K)];
        // [0, 1M): 436K of zeros, 588K of data: more than 1x, nothing.
        let e = ext(0, 1024 * K, 0);
        assert_eq!(plan_on_disk(&[e], &runs, 1024 * K, 4 * K, 64 * K, Some(1.0)), ExtentWork::default());
        // At ratio 2, the data around the zeros is rewritten, the zeros punched.
        let w = plan_on_disk(&[e], &runs, 1024 * K, 4 * K, 64 * K, Some(2.0));
        assert_eq!(w.punch, runs.to_vec());
        assert_eq!(w.rewrite, vec![(0, 64 * K), (400 * K, 200 * K), (700 * K, 324 * K)]);
        // The extent past the end of the file: the data stops at the size.
        let w = plan_on_disk(&[ext(0, 404 * K, 0)], &runs, 401 * K, 4 * K, 64 * K, Some(1.0));
        assert_eq!((w.punch, w.rewrite), (vec![(64 * K, 336 * K)], vec![(0, 64 * K), (400 * K, K)]));
        // Ratio 0: only whole zero extents.
        assert!(plan_on_disk(&[ext(0, 404 * K, 0)], &runs, 401 * K, 4 * K, 64 * K, Some(0.0)).punch.is_empty());
        let w = plan_on_disk(&[ext(64 * K, 336 * K, 0)], &runs, 1024 * K, 4 * K, 64 * K, Some(0.0));
        assert_eq!((w.punch, w.rewrite), (vec![(64 * K, 336 * K)], vec![]));
    }

    #[test]
    fn btrfs_weighs_an_extent_over_all_its_stretches() {
        let plan = |stretches: &[Extent], runs: &[(u64, u64)]| {
            plan_on_disk(stretches, runs, 1024 * K, 4 * K, 64 * K, Some(1.0))
        };
        // One extent in two stretches (a block between written again in
        // place): 100K of data, then 520K of zeros. Alone, the data stays
        // and the zeros are punched, freeing nothing; together the data is
        // rewritten and the extent freed.
        let (data, zeros) = (ext(0, 100 * K, 0), ext(104 * K, 520 * K, 0));
        let runs = [(104 * K, 520 * K)];
        assert_eq!(plan(&[data], &runs), ExtentWork::default());
        assert_eq!(plan(&[zeros], &runs).punch, runs.to_vec());
        let w = plan(&[data, zeros], &runs);
        assert_eq!((w.punch, w.rewrite), (runs.to_vec(), vec![(0, 100 * K)]));
        // 600K of data, then 48K of data and 100K of zeros: alone, the
        // second would be rewritten and punched, for nothing; together the
        // data is more than the zeros, and the extent is left.
        let (big, small) = (ext(0, 600 * K, 0), ext(604 * K, 148 * K, 0));
        let runs = [(652 * K, 100 * K)];
        // (48K of data is shorter than a run: read first, as it may be
        // zeros; found data, rewritten.)
        let alone = plan(&[small], &runs);
        assert_eq!((&alone.gaps, &alone.rewrite), (&vec![(604 * K, 48 * K)], &vec![]));
        let data_after_all = gaps_are_data(alone, 1.0, 64 * K);
        assert_eq!((data_after_all.punch, data_after_all.rewrite), (runs.to_vec(), vec![(604 * K, 48 * K)]));
        assert_eq!(plan(&[big, small], &runs), ExtentWork::default());
        // One stretch shared with another file: the extent is left to all
        // its holders at once.
        let shared = Extent { flags: flags::SHARED, ..data };
        let clones = ExtentWork { clones: true, ..Default::default() };
        assert_eq!(plan(&[shared, zeros], &[(104 * K, 520 * K)]), clones);
    }
}
