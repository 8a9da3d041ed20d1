//! The windows of one file's zero runs, mapped in turn (`ZeroPass::window`):
//! each extent judged once, whole, in the first window that finds it; on
//! btrfs each extent on disk with all its stretches in the file.

use std::collections::HashMap;
use std::ops::Range;
use std::os::fd::BorrowedFd;

use crate::sys::btrfs_tree;
use crate::sys::fiemap::{fiemap, Extent};
use nix::errno::Errno;

use super::Group;

/// What the windows of one file have judged already: FIEMAP extents up to
/// an offset, and extents on disk by their start, each with where its
/// stretches end in the file (forgotten once the windows are past it);
/// and how far btrfs's items were read, with the last stretch read if it
/// reaches past that (stretches never overlap: at most one does), so that
/// each item is read about once however many runs the file has.
#[derive(Default)]
pub(super) struct Judged {
    to: u64,
    disks: HashMap<u64, u64>,
    read_to: u64,
    carried: Option<btrfs_tree::FileExtent>,
}

impl Judged {
    /// Whether extent `e`, named by no extent on disk, is judged now (the
    /// first window that finds it).
    pub(super) fn first_time(&mut self, e: &Extent) -> bool {
        let first = e.logical >= self.to;
        if first {
            self.to = e.logical + e.length;
        }
        first
    }

    /// Every stretch reaching into `part` of an extent on disk not judged
    /// yet, read from where the last window stopped (or from the longest
    /// stretch's length before `part`).
    fn reaching(&mut self, fd: BorrowedFd<'_>, part: &Range<u64>) -> Result<Vec<btrfs_tree::FileExtent>, Errno> {
        let from = self.read_to.max(part.start.saturating_sub(btrfs_tree::LONGEST_STRETCH));
        let mut seen: Vec<btrfs_tree::FileExtent> = self.carried.take().into_iter().collect();
        if from < part.end {
            btrfs_tree::file_extents(fd, from..part.end, |s| seen.push(s))?;
            self.read_to = part.end;
        }
        self.carried = seen.last().filter(|s| s.logical + s.length > part.end).copied();
        self.disks.retain(|_, end| *end > part.start);
        seen.retain(|s| s.logical + s.length > part.start && !self.disks.contains_key(&s.disk));
        Ok(seen)
    }
}

/// [`ZeroPass::window`] on btrfs: the stretches reaching into `part`, the
/// whole of the extents on disk they lie in (in this file alone a stretch
/// of an extent lies within its span), cut and grouped by extent; the
/// groups reaching into `part` not judged before. `None`: btrfs's items
/// cannot be read (no `CAP_SYS_ADMIN`).
pub(super) fn btrfs_window(
    fd: BorrowedFd<'_>,
    part: Range<u64>,
    judged: &mut Judged,
) -> Option<Result<Vec<Group>, Errno>> {
    let reaching = judged.reaching(fd, &part).ok()?;
    let (Some(lo), Some(hi)) =
        (reaching.iter().map(|s| s.span.0).min(), reaching.iter().map(|s| s.span.0 + s.span.1).max())
    else {
        return Some(Ok(Vec::new())); // nothing there, or all judged
    };
    let (lo, hi) = (lo.min(part.start), hi.max(part.end));
    let extents = match fiemap(fd, lo, hi - lo) {
        Ok(e) => e,
        Err(e) => return Some(Err(e)),
    };
    let mut stretches = Vec::new();
    btrfs_tree::file_extents(fd, lo..hi, |s| stretches.push(s)).ok()?;
    let reaches = |e: &Extent| e.logical < part.end && e.logical + e.length > part.start;
    let fresh = btrfs_tree::on_disk(&extents, &stretches).into_iter().filter(|(e, disk)| match disk {
        Some(d) => !judged.disks.contains_key(d),
        None => reaches(e) && judged.first_time(e),
    });
    let mut groups = Vec::new();
    for (disk, group) in btrfs_tree::by_extent(fresh) {
        if !group.iter().any(reaches) {
            continue; // judged by the window that reaches it
        }
        if let (Some(d), Some(last)) = (disk, group.last()) {
            judged.disks.insert(d, last.logical + last.length);
        }
        groups.push((disk, group));
    }
    Some(Ok(groups))
}
