//! Free space, measured, never inferred: `syncfs` twice, then `statfs`.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use anyhow::{Context, Result};

use crate::display::display_path;
use crate::sys;

/// Free space being measured on another thread.
pub(super) struct FreeSpace(JoinHandle<Result<u64>>);

impl FreeSpace {
    /// Start measuring the free bytes of the filesystem of `path`.
    pub(super) fn start(path: PathBuf) -> FreeSpace {
        FreeSpace(std::thread::spawn(move || free_bytes(&path)))
    }

    /// The measurement.
    pub(super) fn wait(self) -> Result<u64> {
        self.0.join().map_err(|_| anyhow::anyhow!("free space measurement panicked")).and_then(|r| r)
    }
}

/// Free bytes on the filesystem of `path`, after flushing it so that
/// released extents are counted (btrfs frees them at transaction commit).
pub(super) fn free_bytes(path: &Path) -> Result<u64> {
    let f = sys::inode::open_path_readonly(path).with_context(|| format!("{}: cannot open", display_path(path)))?;
    sys::commit(&f).with_context(|| format!("{}: syncfs", display_path(path)))?;
    Ok(sys::fs_info(f.as_fd())?.free_bytes)
}
