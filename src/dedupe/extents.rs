//! The FIEMAP view of planned ranges: which blocks of a destination
//! already share the source's extents (so a rerun submits nothing), and
//! [`range_states`], what the `report` command shows as not yet shared.
//! Nothing here shares or changes a file.

use std::collections::HashMap;
use std::os::fd::AsFd;

use crate::file::FileFacts;
use crate::file::FileId;
use crate::plan::Range;
use crate::sys::beneath::Tree;
use crate::sys::fiemap::physical_map;
use crate::sys::{self, Extent};

/// A range's extents, and whether any of them is shared with another file
/// or offset. Its blocks' addresses are derived from them a window at a
/// time ([`unshared`]), never held for the whole range.
pub(super) struct Mapped {
    /// Some extent of the range is flagged shared.
    pub(super) shared: bool,
    /// The extents (empty where FIEMAP failed: every address unknown).
    pub(super) extents: Vec<Extent>,
}

/// What FIEMAP says about one planned range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeState {
    /// This many of its bytes do not share the source's extents yet.
    Unshared(u64),
    /// A file's data is inline in metadata (btrfs): it can never be shared.
    Inline,
    /// A file could not be opened or mapped.
    Unknown,
}

/// The state of each of `ranges`, from FIEMAP alone (no data is read).
///
/// The files were recorded by earlier runs from starting paths not known
/// here: each is opened below the top of the mount holding it (`tree`,
/// [`Tree::over_mounts`] of `files`: no symlink, no `..`, no other mount on
/// the way) and must still be the recorded inode (volume key and inode
/// number).
pub fn range_states(
    ranges: &[Range],
    files: &HashMap<FileId, FileFacts>,
    tree: &Tree,
    block_size: u64,
) -> Vec<RangeState> {
    let mut keys = sys::SubvolIds::new();
    let mut open = |id: FileId| -> Option<std::fs::File> {
        let c = files.get(&id)?;
        let f = tree.open_file(&c.path).ok()?;
        // The recorded inode, not whatever took its name (its content may
        // have changed since: the report measures the extents it has now).
        let m = f.metadata().ok()?;
        (m.is_file() && c.is_same_inode(&f, &m, &mut keys)).then_some(f)
    };
    // The last file opened on each side, kept for the next range: a
    // source's ranges come together (an image's many pieces, a file's
    // copies), and each open resolves the whole path.
    let mut last: [Option<(FileId, Option<std::fs::File>)>; 2] = [None, None];
    let mut map = |side: usize, id: FileId, off: u64, len: u64| -> Result<Vec<Extent>, RangeState> {
        if last[side].as_ref().is_none_or(|l| l.0 != id) {
            last[side] = Some((id, open(id)));
        }
        let f = last[side].as_ref().and_then(|l| l.1.as_ref()).ok_or(RangeState::Unknown)?;
        let ext = sys::fiemap(f.as_fd(), off, len).map_err(|_| RangeState::Unknown)?;
        if ext.iter().any(|e| e.is_inline()) {
            return Err(RangeState::Inline);
        }
        Ok(ext)
    };
    ranges
        .iter()
        .map(|r| match (map(0, r.src, r.src_off, r.len), map(1, r.dest, r.dest_off, r.len)) {
            (Ok(s), Ok(d)) => RangeState::Unshared(
                unshared(&s, r.src_off, &d, r.dest_off, block_size, r.len).iter().map(|p| p.1).sum(),
            ),
            (Err(RangeState::Inline), _) | (_, Err(RangeState::Inline)) => RangeState::Inline,
            _ => RangeState::Unknown,
        })
        .collect()
}

/// Blocks whose addresses [`unshared`] holds at once, per side: 64 Ki
/// (256 MiB of 4 KiB blocks, 1 MiB of addresses). It held the whole range's,
/// 16 bytes a block a side: a whole-file range of two 400 GiB images with
/// a shared extent (a snapshot, a reflink) took 3.2 GB of memory.
const WINDOW_BLOCKS: u64 = 1 << 16;

/// The parts of a range of `len` bytes, at `src_off` in the source and
/// `dst_off` in the destination (offset, length relative to its start),
/// whose blocks do not already map to the same physical address
/// ([`physical_map`] of `src` and `dst`, each side's extents over the
/// range), compared a window of [`WINDOW_BLOCKS`] at a time. Unknown
/// addresses count as not shared.
pub fn unshared(src: &[Extent], src_off: u64, dst: &[Extent], dst_off: u64, block: u64, len: u64) -> Vec<(u64, u64)> {
    let mut parts: Vec<(u64, u64)> = Vec::new();
    let mut w = 0;
    while w < len {
        let wl = (WINDOW_BLOCKS * block).min(len - w);
        let (s, d) = (physical_map(src, src_off + w, wl, block), physical_map(dst, dst_off + w, wl, block));
        for (o, l) in unshared_parts(&s, &d, block, wl) {
            match parts.last_mut() {
                Some((po, pl)) if *po + *pl == w + o => *pl += l,
                _ => parts.push((w + o, l)),
            }
        }
        w += wl;
    }
    parts
}

/// The parts of a range (offset, length relative to its start) whose blocks
/// do not already map to the same physical address in source and
/// destination. Unknown addresses count as not shared.
fn unshared_parts(src: &[Option<u64>], dst: &[Option<u64>], block: u64, len: u64) -> Vec<(u64, u64)> {
    let mut parts: Vec<(u64, u64)> = Vec::new();
    for (i, (s, d)) in src.iter().zip(dst).enumerate() {
        let shared = s.is_some() && s == d;
        if shared {
            continue;
        }
        let off = i as u64 * block;
        let l = block.min(len - off);
        match parts.last_mut() {
            Some((o, pl)) if *o + *pl == off => *pl += l,
            _ => parts.push((off, l)),
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unshared_parts_skips_shared_blocks() {
        let s = [Some(10), Some(20), Some(30), Some(40)];
        let d = [Some(10), Some(99), None, Some(40)];
        assert_eq!(unshared_parts(&s, &d, 4, 16), vec![(4, 8)]);
        assert_eq!(unshared_parts(&s, &s, 4, 16), vec![]);
        // A partial last block keeps the range's real length.
        let d2 = [Some(10), Some(20), Some(30), Some(41)];
        assert_eq!(unshared_parts(&s, &d2, 4, 14), vec![(12, 2)]);
        let none = [None, None];
        assert_eq!(unshared_parts(&none, &none, 4, 8), vec![(0, 8)]);
    }

    /// Compared a window at a time, a range longer than one window gives
    /// the parts the whole range's addresses give, joined across windows.
    #[test]
    fn windows_give_the_parts_of_the_whole_range() {
        let bs = 4096;
        let blocks = 3 * WINDOW_BLOCKS + 17;
        let len = blocks * bs - 100;
        let e = |logical: u64, physical: u64, length: u64| Extent { logical, physical, length, flags: 0 };
        // The source: one extent at 1 GiB. The destination (at offset 8
        // blocks in its file): shares the source's first window and a
        // stretch across the second and third windows' border, a hole
        // in between, its own extent elsewhere.
        let src = [e(0, 1 << 30, blocks * bs)];
        let (d0, w) = (8 * bs, WINDOW_BLOCKS * bs);
        let dst = [
            e(d0, 1 << 30, w + 3 * bs),
            e(d0 + w + 5 * bs, 9 << 30, w - 15 * bs),
            e(d0 + 2 * w - 10 * bs, (1 << 30) + 2 * w - 10 * bs, 30 * bs),
        ];
        let whole = |s: &[Extent], so: u64, d: &[Extent], dof: u64| {
            unshared_parts(&physical_map(s, so, len, bs), &physical_map(d, dof, len, bs), bs, len)
        };
        let parts = unshared(&src, 0, &dst, d0, bs, len);
        assert_eq!(parts, whole(&src, 0, &dst, d0));
        assert_eq!(parts, vec![(w + 3 * bs, w - 13 * bs), (2 * w + 20 * bs, len - 2 * w - 20 * bs)]);
        assert_eq!(unshared(&src, 0, &src, 0, bs, len), vec![]);
        assert_eq!(unshared(&[], 0, &[], 0, bs, len), vec![(0, len)]);
    }
}
