//! Free space, measured, never inferred: `syncfs` twice, then `statfs`,
//! before the share phase and after it, while the filesystem is watched
//! for other processes changing it meanwhile (`sys::watch`): their writes
//! and deletions are in the difference too, and the report says so.

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
    before: JoinHandle<Result<u64>>,
    watch: Option<Watch>,
}

/// Free space measured before sharing; the watch still running.
pub(super) struct Before {
    bytes: u64,
    watch: Option<Watch>,
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
        FreeSpace { before: std::thread::spawn(move || free_bytes(&path)), watch }
    }

    /// The measurement.
    pub(super) fn wait(self) -> Result<Before> {
        let bytes = self.before.join().map_err(|_| anyhow::anyhow!("free space measurement panicked"))??;
        Ok(Before { bytes, watch: self.watch })
    }
}

impl Before {
    /// Measure again at `path` and stop watching.
    pub(super) fn after(self, path: &Path) -> Result<Freed> {
        let after = free_bytes(path);
        let others = self.watch.map(Watch::stop);
        Ok(Freed { bytes: after? as i64 - self.bytes as i64, others })
    }
}

/// Free bytes on the filesystem of `path`, after flushing it so that
/// released extents are counted (btrfs frees them at transaction commit).
pub(super) fn free_bytes(path: &Path) -> Result<u64> {
    let f = sys::inode::open_path_readonly(path).with_context(|| format!("{}: cannot open", display_path(path)))?;
    sys::commit(&f).with_context(|| format!("{}: syncfs", display_path(path)))?;
    Ok(sys::fs_info(f.as_fd())?.free_bytes)
}
