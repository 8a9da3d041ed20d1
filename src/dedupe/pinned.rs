//! Extents the run cannot free: a destination extent FIEMAP flags `SHARED`
//! that a file outside the plan (a read-only snapshot, an excluded file)
//! also references stays allocated whatever this run does, so sharing into
//! it would free nothing and only add metadata. btrfs is asked who
//! references such an extent (`BTRFS_IOC_LOGICAL_INO_V2`, through
//! [`sys::fs::extent_owners`]); the parts it keeps are left pending
//! ([`Pending::Pinned`]), unless `--share-snapshotted` asks to share them
//! anyway (rotating snapshots: freed once they are deleted).

use std::os::fd::BorrowedFd;

use nix::errno::Errno;

use super::executor::Executor;
use super::Pending;
use crate::plan::Range;
use crate::sys;

impl Executor<'_> {
    /// The parts (relative to `d.dest_off`) of a destination range that lie
    /// in extents nothing outside the plan references. A shared extent of
    /// the destination that a file outside the plan (a read-only snapshot,
    /// an excluded file) also references stays allocated whatever this run
    /// does: sharing into it would free nothing and grow metadata. Such
    /// parts are dropped and the destination counted pending
    /// ([`Pending::Pinned`]), so a later run shares it once the snapshot
    /// is gone. Asked only of extents FIEMAP flags `SHARED` whose blocks
    /// do not already share the source's and that were not seen unshared
    /// earlier in this phase ([`super::workers::WorkerContext::seen_solo`]),
    /// once per extent per worker.
    pub(super) fn drop_pinned(
        &mut self,
        fd: BorrowedFd<'_>,
        d: &Range,
        extents: &[sys::Extent],
        parts: Vec<(u64, u64)>,
    ) -> Vec<(u64, u64)> {
        if self.no_owners || self.ctx.pinned_too || parts.is_empty() {
            return parts;
        }
        let mut kept = Vec::with_capacity(parts.len());
        let mut dropped = 0;
        for (o, l) in parts {
            let (start, end) = (d.dest_off + o, d.dest_off + o + l);
            let mut pos = start;
            for e in extents.iter().filter(|e| e.is_shared() && e.logical < end && e.logical + e.length > start) {
                let (es, ee) = (e.logical.max(start), (e.logical + e.length).min(end));
                if self.ctx.seen_solo(e) || !self.is_pinned(fd, e) {
                    continue;
                }
                if es > pos {
                    kept.push((pos - d.dest_off, es - pos));
                }
                dropped += ee - es;
                pos = ee;
            }
            if pos < end {
                kept.push((pos - d.dest_off, end - pos));
            }
        }
        if dropped > 0 {
            self.pend(d.dest, Pending::Pinned, dropped);
        }
        kept
    }

    /// Whether the extent holding stretch `e` of `fd` is referenced by a
    /// file outside the plan (or by more files than the kernel lists:
    /// 699,050). More than one 64 KiB answer holds (2,730) is asked again
    /// with room for all: an image's extent that thousands of small files
    /// of the run hold a piece of each is theirs to free. Asked
    /// once per extent (per worker), not once per stretch: a file shared
    /// piecemeal by an earlier run (a VM image whose blocks went into a
    /// tree's files) holds one 128 MiB extent in thousands of stretches,
    /// each at its own FIEMAP address, and every question walks all the
    /// extent's references. Asked per address, a nightly run adding a copy
    /// of the image spent 13 s in those walks (FULL, one directory a run).
    ///
    /// The answers are kept by FIEMAP address too, so a stretch asked
    /// about again (many ranges into one large extent) costs no item
    /// search, as before.
    fn is_pinned(&mut self, fd: BorrowedFd<'_>, e: &sys::Extent) -> bool {
        if let Some(&p) = self.pinned.get(&e.physical) {
            return p;
        }
        let key = extent_key(fd, e);
        if let Some(&p) = self.pinned.get(&key) {
            self.pinned.insert(e.physical, p);
            return p;
        }
        let p = match sys::fs::extent_owners(fd, e.physical) {
            Ok(o) => !o.complete || o.refs.iter().any(|r| !self.ctx.in_plan.contains(r)),
            Err(Errno::ENOTTY | Errno::EOPNOTSUPP | Errno::EPERM | Errno::EINVAL) => {
                // Not btrfs, or not allowed: share as before.
                self.no_owners = true;
                false
            }
            // Gone meanwhile, or another error: let the kernel decide.
            Err(_) => false,
        };
        self.pinned.insert(key, p);
        self.pinned.insert(e.physical, p);
        p
    }
}

/// What names the extent holding stretch `e` of `fd`: its disk address
/// (`disk_bytenr`) read from the file's item that begins where `e` does,
/// else (no such item: FIEMAP began mid-item; no `CAP_SYS_ADMIN`) `e`'s
/// FIEMAP address, as before. One key space serves both: extents do not
/// overlap on disk, so an address inside one extent is never another's
/// disk address, and a stretch at an extent's start has that address.
fn extent_key(fd: BorrowedFd<'_>, e: &sys::Extent) -> u64 {
    let mut disk = None;
    let _ = sys::btrfs_tree::file_extents(fd, e.logical..e.logical + 1, |s| {
        if s.logical == e.logical {
            disk = Some(s.disk);
        }
    });
    disk.unwrap_or(e.physical)
}
