//! The FIEMAP view of planned ranges: which blocks of a destination
//! already share the source's extents (so a rerun submits nothing), and
//! [`range_states`], what the `report` command shows as not yet shared.
//! Nothing here shares or changes a file.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use crate::file::FileFacts;
use crate::file::FileId;
use crate::plan::Plan;
use crate::sys::beneath::Tree;
use crate::sys::fiemap::physical_map;
use crate::sys::{self, Extent};

/// A range's block addresses (see [`physical_map`]), and whether any of its
/// extents is shared with another file or offset.
pub(super) struct Mapped {
    /// Physical address per block, `None` where unknown.
    pub(super) blocks: Vec<Option<u64>>,
    /// Some extent of the range is flagged shared.
    pub(super) shared: bool,
    /// The extents themselves (for the pinned check and fragmentation).
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

/// The state of every range of `plan`, from FIEMAP alone (no data is read).
///
/// The files were recorded by earlier runs from starting paths not known
/// here: each is opened below the top of the mount holding it (no symlink,
/// no `..`, no other mount on the way) and must still be the recorded inode
/// (volume key and inode number).
pub fn range_states(plan: &Plan, files: &HashMap<FileId, FileFacts>, block_size: u64) -> Vec<RangeState> {
    let tree = Tree::over_mounts(files.values().map(|c| c.path.as_path()));
    let map = |id: FileId, off: u64, len: u64| -> Result<Vec<Option<u64>>, RangeState> {
        let c = files.get(&id).ok_or(RangeState::Unknown)?;
        let f = tree.open_file(&c.path).map_err(|_| RangeState::Unknown)?;
        // The recorded inode, not whatever took its name (its content may
        // have changed since: the report measures the extents it has now).
        let m = f.metadata().map_err(|_| RangeState::Unknown)?;
        // `c.key.volume` is the volume key (btrfs subvolume id), not `st_dev`.
        if !m.is_file() || m.ino() != c.key.ino || sys::volume_key(f.as_fd()).ok() != Some(c.key.volume) {
            return Err(RangeState::Unknown);
        }
        let ext = sys::fiemap(f.as_fd(), off, len).map_err(|_| RangeState::Unknown)?;
        if ext.iter().any(|e| e.is_inline()) {
            return Err(RangeState::Inline);
        }
        Ok(physical_map(&ext, off, len, block_size))
    };
    plan.ranges
        .iter()
        .map(|r| match (map(r.src, r.src_off, r.len), map(r.dest, r.dest_off, r.len)) {
            (Ok(s), Ok(d)) => RangeState::Unshared(unshared_parts(&s, &d, block_size, r.len).iter().map(|p| p.1).sum()),
            (Err(RangeState::Inline), _) | (_, Err(RangeState::Inline)) => RangeState::Inline,
            _ => RangeState::Unknown,
        })
        .collect()
}

/// The parts of a range (offset, length relative to its start) whose blocks
/// do not already map to the same physical address in source and
/// destination. Unknown addresses count as not shared.
pub fn unshared_parts(src: &[Option<u64>], dst: &[Option<u64>], block: u64, len: u64) -> Vec<(u64, u64)> {
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
}
