//! Free space, measured, never inferred: `syncfs` twice, then `statfs`,
//! before the share phase and after it, while the filesystem is watched
//! for other processes changing it meanwhile (`sys::watch`): their writes
//! and deletions are in the difference too, and the report says so. So is
//! the space of btrfs subvolumes deleted before the run that the kernel's
//! cleaner gives back while it runs (a nightly snapshot rotation), which
//! no process's call announces: a deletion still pending at either
//! measurement counts as another process's change.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use anyhow::{Context, Result};

use crate::display::display_path;
use crate::sys;
use crate::sys::watch::Watch;

/// Free space being measured on another thread, the filesystem watched
/// from just before.
pub(super) struct FreeSpace {
    before: JoinHandle<Result<Measured>>,
    watch: Option<Watch>,
}

/// Free space measured before sharing; the watch still running.
pub(super) struct Before {
    measured: Measured,
    watch: Option<Watch>,
}

/// One measurement.
#[derive(Debug, Clone, Copy)]
struct Measured {
    /// Free bytes.
    free: u64,
    /// Deleted btrfs subvolumes were still to be cleaned up.
    cleaning: bool,
}

/// What the share phase freed, and who else changed the filesystem.
#[derive(Debug, Clone, Copy)]
pub(super) struct Freed {
    /// Free space after minus before.
    pub bytes: i64,
    /// Whether another process was seen changing the filesystem between
    /// the two measurements; `None`: it could not be watched.
    pub others: Option<bool>,
}

impl FreeSpace {
    /// Start watching the filesystem of `path` and measuring its free bytes.
    pub(super) fn start(path: PathBuf) -> FreeSpace {
        let watch = Watch::of_path(&path);
        FreeSpace { before: std::thread::spawn(move || measure(&path)), watch }
    }

    /// The measurement.
    pub(super) fn wait(self) -> Result<Before> {
        let measured = self.before.join().map_err(|_| anyhow::anyhow!("free space measurement panicked"))??;
        Ok(Before { measured, watch: self.watch })
    }
}

impl Before {
    /// Measure again at `path` and stop watching.
    pub(super) fn after(self, path: &Path) -> Result<Freed> {
        let after = measure(path);
        let watched = self.watch.map(Watch::stop);
        let after = after?;
        // The cleaner's work is others' change, watched or not.
        let cleaning = self.measured.cleaning || after.cleaning;
        let others = if cleaning { Some(true) } else { watched };
        Ok(Freed { bytes: after.free as i64 - self.measured.free as i64, others })
    }
}

/// Free bytes on the filesystem of `path`, after flushing it so that
/// released extents are counted (btrfs frees them at transaction commit),
/// and whether deleted btrfs subvolumes are still to be cleaned up (not
/// btrfs, or no `CAP_SYS_ADMIN`: taken as none).
fn measure(path: &Path) -> Result<Measured> {
    let f = sys::inode::open_path_readonly(path).with_context(|| format!("{}: cannot open", display_path(path)))?;
    let pending = || sys::btrfs_tree::deleted_subvolumes_pending(f.as_fd()).unwrap_or(false);
    // Asked before the commit too: the commit wakes the cleaner, which can
    // finish a small deletion before a look after it, and the space it
    // gives back is released at the next commit, inside the measurement.
    let cleaning = pending();
    sys::commit(&f).with_context(|| format!("{}: syncfs", display_path(path)))?;
    let cleaning = cleaning || pending();
    Ok(Measured { free: sys::fs_info(f.as_fd())?.free_bytes, cleaning })
}
