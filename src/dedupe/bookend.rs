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
//! anything but its own data. With no room for the copy (ENOSPC, EDQUOT)
//! the destination is left whole for a later run
//! ([`super::Pending::NoSpaceRewrite`]).
//!
//! XFS counts references per block and needs none of this.

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
    /// Compressed, inline, delalloc or unknown: leave alone.
    pub unstable: bool,
}

/// What to do about one destination file's partly covered extents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Parts to rewrite, as `(offset, length)` in the file.
    pub rewrite: Vec<(u64, u64)>,
    /// Covered bytes that will be shared but cannot free space: their
    /// extent stays on disk for its uncovered rest (not worth rewriting, or
    /// compressed/inline and not rewritable). The report's `pinned_bytes`,
    /// so that shared = freed + pinned adds up on btrfs.
    pub pinned: u64,
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
        if !e.unstable && uncovered as f64 <= cov as f64 * max_ratio {
            out.rewrite.extend(gaps);
        } else {
            out.pinned += cov;
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

impl Executor<'_> {
    /// Rewrite the uncovered remainders of the partly covered extents of
    /// destination `id`, whose planned ranges cover `covered` (chosen by
    /// [`remainders`]).
    pub(super) fn free_bookends(&mut self, id: FileId, covered: &[(u64, u64)], b: &Bookends) {
        let Some(size) = self.files.get(&id).map(|c| c.size) else { return };
        // Covered from start to end (a whole-file copy, most
        // destinations): every extent is shared whole, no remainder is
        // left, so neither open nor FIEMAP it here (on btrfs FIEMAP
        // walks the back references of every extent). The share phase
        // still checks the file before using it.
        if matches!(covered[..], [(0, len)] if len >= size) {
            return;
        }
        let Some(file) = self.open(id) else { return };
        let Ok(extents) = sys::fiemap(file.as_fd(), 0, size) else { return };
        self.ctx.note_solo(&extents);
        let extents: Vec<DestExtent> = extents
            .iter()
            .map(|e| DestExtent {
                logical: e.logical,
                length: e.length,
                shared: e.is_shared(),
                unstable: e.is_unstable(),
            })
            .collect();
        let Decision { rewrite: pieces, pinned } = decide(&extents, covered, size, b.max_ratio);
        self.out.pinned_bytes += pinned;
        if pieces.is_empty() {
            return;
        }
        match self.mode {
            Mode::DryRun => self.out.rewritten_bytes += pieces.iter().map(|p| p.1).sum::<u64>(),
            Mode::Share => {
                if let Err(e) = self.rewrite(&file, size, &pieces, &b.tmp_dir) {
                    let path = display_path(&self.files[&id].path);
                    if e.raw_os_error().is_some_and(|n| no_space(Errno::from_raw(n))) {
                        locked(&self.ctx.deferred).insert(id);
                        let bytes = covered.iter().map(|c| c.1).sum();
                        self.out.pending.insert(id, (Pending::NoSpaceRewrite, bytes));
                        self.progress.warn(&format!(
                            "{path}: no space to rewrite partly shared extents ({e}); not shared now, retried by the next run"
                        ));
                        *self.out.errors.entry(ErrorKind::NoSpace).or_default() += 1;
                    } else {
                        self.progress.warn(&format!("{path}: cannot rewrite partly shared extents: {e}"));
                        *self.out.errors.entry(ErrorKind::Rewrite).or_default() += 1;
                    }
                }
            }
        }
    }

    /// Copy `pieces` of `dest` into an unnamed temporary file on the same
    /// filesystem (at the same offsets, same size, so an unaligned tail ends
    /// at both EOFs), then share them back into `dest`: the kernel compares
    /// the bytes, and `dest` then references fresh extents there.
    fn rewrite(&mut self, dest: &File, size: u64, pieces: &[(u64, u64)], dir: &std::path::Path) -> std::io::Result<()> {
        let tmp = sys::inode::open_tmpfile(dir)?;
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
                    _ => break,
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 4096;

    fn ext(logical: u64, length: u64) -> DestExtent {
        DestExtent { logical, length, shared: false, unstable: false }
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

    #[test]
    fn pinned_is_what_is_covered_but_not_freed() {
        // Remainder too large: the covered 4 blocks stay pinned.
        assert_eq!(decide(&[ext(0, 10 * K)], &[(0, 4 * K)], 1 << 40, 1.0), Decision { rewrite: vec![], pinned: 4 * K });
        // Rewritten: nothing pinned.
        assert_eq!(decide(&[ext(0, 8 * K)], &[(0, 4 * K)], 1 << 40, 1.0).pinned, 0);
        // --rewrite-ratio 0: every partly covered extent is pinned.
        assert_eq!(decide(&[ext(0, 8 * K)], &[(0, 7 * K)], 1 << 40, 0.0).pinned, 7 * K);
        // Compressed (unstable) and partly covered: pinned, never rewritten.
        let zstd = DestExtent { unstable: true, ..ext(0, 8 * K) };
        assert_eq!(decide(&[zstd], &[(0, 7 * K)], 1 << 40, 1.0), Decision { rewrite: vec![], pinned: 7 * K });
        // Wholly covered, untouched or shared with another file: not pinned here.
        let shared = DestExtent { shared: true, ..ext(16 * K, 8 * K) };
        assert_eq!(
            decide(&[ext(0, 8 * K), ext(8 * K, 8 * K), shared], &[(0, 8 * K), (16 * K, K)], 1 << 40, 1.0).pinned,
            0
        );
    }

    #[test]
    fn union_merges() {
        assert_eq!(union(vec![(8, 4), (0, 4), (2, 4), (20, 1)]), vec![(0, 6), (8, 4), (20, 1)]);
        assert_eq!(union(vec![(8, 4), (0, 4), (2, 4), (6, 2), (20, 1)]), vec![(0, 12), (20, 1)]);
    }
}
