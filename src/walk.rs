//! The crawl: list the regular files under the starting paths.
//!
//! In: canonical starting paths, the filesystem kind, the [`Policy`]. Out:
//! one [`Candidate`] per eligible inode, with the `lstat` facts change
//! detection needs, handed to a callback as it is found, plus counts of
//! everything skipped and why. Runs on the calling thread (the crawler
//! thread of a run); it only lists and `lstat`s, never opens a file.
//!
//! Symlinks are never followed; FIFOs, sockets and devices are counted and
//! never opened; other mounts are not entered. On btrfs, subvolumes have
//! their own `st_dev` but are part of the same filesystem, so a directory
//! with another `st_dev` is entered when it is not a mount point.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use walkdir::WalkDir;

use crate::policy::{Policy, SkipReason};
use crate::progress::Progress;
use crate::report::display_path;
use crate::sys::FsKind;

/// A regular file that may be hashed and shared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl Candidate {
    /// Build from `lstat` metadata.
    pub fn from_metadata(path: PathBuf, m: &std::fs::Metadata) -> Candidate {
        Candidate {
            path,
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
        }
    }
}

/// What the crawl counted (the files themselves go to its callback).
#[derive(Debug, Default)]
pub struct WalkResult {
    pub skipped: BTreeMap<SkipReason, u64>,
    /// Errors by kind (e.g. `unreadable_dir`), each already reported.
    pub errors: BTreeMap<&'static str, u64>,
}

/// Crawl `roots` (canonical paths on one filesystem of kind `fs`).
/// Every eligible file is handed to `each` as soon as it is found, so
/// reading can start while the crawl goes on. `stop` ends the crawl early.
pub fn walk(
    roots: &[PathBuf],
    fs: FsKind,
    policy: &Policy,
    progress: &dyn Progress,
    stop: &AtomicBool,
    mut each: impl FnMut(Candidate),
) -> WalkResult {
    let mounts = crate::sys::fs::mount_points();
    let result = RefCell::new(WalkResult::default());
    let mut seen_inodes: HashSet<(u64, u64)> = HashSet::new();
    let skip = |r: SkipReason| *result.borrow_mut().skipped.entry(r).or_default() += 1;
    for root in roots {
        if let Err(r) = policy.check_ancestors(root) {
            progress.warn(&format!("{}: skipped, a directory above it is marked {}", display_path(root), r.name()));
            skip(r);
            continue;
        }
        let root_dev = match std::fs::symlink_metadata(root) {
            Ok(m) => m.dev(),
            Err(e) => {
                error(&result, progress, "unreadable", root, &e);
                continue;
            }
        };
        let walker = WalkDir::new(root).follow_links(false).sort_by_file_name().into_iter().filter_entry(|e| {
            if !e.file_type().is_dir() {
                return true;
            }
            let ok = dir_allowed(e, root_dev, fs, &mounts, policy);
            if let Err(r) = ok {
                skip(r);
            }
            ok.is_ok()
        });
        for entry in walker {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    let path = e.path().unwrap_or(root).to_owned();
                    let io = e.into_io_error().unwrap_or_else(|| io::Error::other("walk error"));
                    let kind = if io.kind() == io::ErrorKind::NotFound { "vanished" } else { "unreadable" };
                    error(&result, progress, kind, &path, &io);
                    continue;
                }
            };
            let ft = entry.file_type();
            if ft.is_dir() {
                continue;
            }
            if !ft.is_file() {
                skip(match () {
                    _ if ft.is_symlink() => SkipReason::Symlink,
                    _ if ft.is_fifo() => SkipReason::Fifo,
                    _ if ft.is_socket() => SkipReason::Socket,
                    _ => SkipReason::Device,
                });
                continue;
            }
            let meta = match entry.metadata() {
                Ok(m) => m,
                Err(_) => {
                    skip(SkipReason::Vanished);
                    continue;
                }
            };
            // d_type said regular; lstat must agree (the name may have been
            // replaced by a FIFO in between).
            if !meta.file_type().is_file() {
                skip(SkipReason::Vanished);
                continue;
            }
            if meta.nlink() > 1 && !seen_inodes.insert((meta.dev(), meta.ino())) {
                skip(SkipReason::Hardlink);
                continue;
            }
            if meta.size() == 0 {
                skip(SkipReason::Empty);
                continue;
            }
            let path = entry.into_path();
            if let Err(r) = policy.check_file(&path, meta.dev(), meta.ino()) {
                skip(r);
                continue;
            }
            each(Candidate::from_metadata(path, &meta));
        }
    }
    result.into_inner()
}

/// Inode number of every btrfs subvolume's root directory.
const BTRFS_FIRST_FREE_OBJECTID: u64 = 256;

fn dir_allowed(
    e: &walkdir::DirEntry,
    root_dev: u64,
    fs: FsKind,
    mounts: &HashSet<PathBuf>,
    policy: &Policy,
) -> Result<(), SkipReason> {
    if e.depth() > 0 {
        if mounts.contains(e.path()) {
            return Err(SkipReason::MountPoint);
        }
        let dev = e.metadata().map(|m| m.dev()).unwrap_or(root_dev);
        // Another st_dev is another filesystem, except for btrfs subvolumes.
        if dev != root_dev && fs != FsKind::Btrfs {
            return Err(SkipReason::MountPoint);
        }
    }
    // A btrfs subvolume's root directory is inode 256.
    if fs == FsKind::Btrfs
        && !policy.include_readonly_snapshots
        && e.metadata().is_ok_and(|m| m.ino() == BTRFS_FIRST_FREE_OBJECTID)
        && crate::sys::inode::is_readonly_subvolume(e.path())
    {
        return Err(SkipReason::ReadonlySnapshot);
    }
    policy.check_dir(e.path())
}

fn error(result: &RefCell<WalkResult>, progress: &dyn Progress, kind: &'static str, path: &Path, e: &io::Error) {
    progress.warn(&format!("{}: {kind}: {e}", display_path(path)));
    *result.borrow_mut().errors.entry(kind).or_default() += 1;
}
