//! When the filesystem, not a file, refuses: it cannot share extents at
//! all (XFS made without reflink), or it stopped taking writes during the
//! run (remounted read-only, btrfs forced read-only or XFS shut down after
//! an error). Either stops every share worker at once, said once, rather
//! than failing every range left in turn.

use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use nix::errno::Errno;

use super::executor::Executor;
use crate::sys::{self, beneath::Tree, DedupeStatus};

/// Why sharing stops when the filesystem cannot share extents at all.
const REFUSED: &str = "the filesystem does not support sharing extents (FIDEDUPERANGE: operation not supported); on XFS this needs a filesystem made with reflink=1";

/// Statuses that may mean "this filesystem cannot share" rather than "this
/// file": then [`probe_can_share`] decides.
pub(super) fn unsupported(s: DedupeStatus) -> bool {
    matches!(s, DedupeStatus::Error(Errno::EOPNOTSUPP | Errno::ENOTTY | Errno::EXDEV | Errno::EINVAL))
}

/// Whether the filesystem of the run's first starting path can share
/// extents at all: write two equal blocks of the run's block size (at least
/// the filesystem's: a smaller one would be refused with `EINVAL` for its
/// alignment alone) into an unnamed temporary file there (`O_TMPFILE`: never
/// visible, gone on close) and share the second with the first. Refused
/// with `EOPNOTSUPP`/`ENOTTY`/`EINVAL`: it cannot (XFS without reflink).
/// Any other failure to probe (no room for a temporary file, read-only
/// mount) says nothing about sharing: assumed able, so a single refusal
/// never stops the whole run.
fn probe_can_share(tree: &Tree, block_size: u64) -> bool {
    let Ok(tmp) = tree.tmpfile() else { return true };
    let block = vec![0x5a_u8; block_size as usize];
    if tmp.write_all_at(&block, 0).and_then(|_| tmp.write_all_at(&block, block_size)).is_err() {
        return true;
    }
    match sys::dedupe_range(tmp.as_fd(), 0, block_size, &[(tmp.as_fd(), block_size)]) {
        Ok(r) => !unsupported(r[0].status),
        Err(Errno::EOPNOTSUPP | Errno::ENOTTY | Errno::EINVAL) => false,
        Err(_) => true,
    }
}

impl Executor<'_> {
    /// Stopped by a signal, or the filesystem refuses to share (seen by any
    /// worker).
    pub(super) fn halted(&self) -> bool {
        self.ctx.stop.load(Ordering::Relaxed) || self.refused()
    }

    /// The filesystem refuses to share (seen by any worker).
    pub(super) fn refused(&self) -> bool {
        self.ctx.refused.load(Ordering::Relaxed)
    }

    /// Sharing is impossible on this filesystem: say so once, stop everyone.
    fn refuse(&mut self) {
        self.out.refused = Some(REFUSED.to_owned());
        self.ctx.refused.store(true, Ordering::Relaxed);
    }

    /// An open, a check or a request failed with `e`. `EROFS` and `EIO` may
    /// be the filesystem's rather than the file's: remounted read-only, or
    /// stopped after an error (btrfs forces itself read-only, XFS shuts down
    /// and answers `EIO` to everything): [`Tree::stopped`] asks. If it
    /// stopped, every worker stops as on a signal (the run is interrupted:
    /// the work done is kept, the next run carries on), it is said once
    /// (as the refusal), and true: the caller counts its error without a
    /// warning, instead of one for every file and range left.
    pub(super) fn volume_stopped(&mut self, e: Errno) -> bool {
        if !matches!(e, Errno::EROFS | Errno::EIO) {
            return false;
        }
        if self.refused() {
            return true;
        }
        let Some(why) = self.ctx.tree.stopped() else { return false };
        self.out.refused = Some(why);
        self.ctx.refused.store(true, Ordering::Relaxed);
        self.ctx.stop.store(true, Ordering::Relaxed);
        true
    }

    /// A request was refused in a way that may mean "this filesystem cannot
    /// share" or only "this destination cannot be shared into" (another
    /// filesystem, a file that changed kind). Probe the filesystem once: if
    /// it cannot share, stop everyone (true); otherwise the refusal is the
    /// destination's (false).
    pub(super) fn refuse_if_fs_cannot_share(&mut self) -> bool {
        let can = *self.ctx.can_share.get_or_init(|| probe_can_share(self.ctx.tree, self.block_size));
        if !can {
            self.refuse();
        }
        !can
    }
}
