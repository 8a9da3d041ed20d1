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
use std::sync::mpsc::{sync_channel, SyncSender};

use ignore::{WalkBuilder, WalkState};

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
    /// [`time_tag`] of the modification time.
    pub mtime: TimeTag,
    /// [`time_tag`] of the inode change time.
    pub ctime: TimeTag,
}

/// A 32-bit tag of a timestamp: all change detection asks of a time is
/// "equal or not", so the database keeps 4 bytes instead of 8. Signed, so
/// SQLite stores it in 4 bytes.
pub type TimeTag = i32;

/// Tag of the time `sec`.`nsec`: the splitmix64 finaliser of its
/// nanoseconds, so every bit of the time moves every bit of the tag (a time
/// set back by a whole number of days changes the tag too).
pub fn time_tag(sec: i64, nsec: i64) -> TimeTag {
    let mut z = (sec as u64).wrapping_mul(1_000_000_000).wrapping_add(nsec as u64);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 32) as u32 as i32
}

impl Candidate {
    /// Build from `lstat` metadata.
    pub fn from_metadata(path: PathBuf, m: &std::fs::Metadata) -> Candidate {
        Candidate {
            path,
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: time_tag(m.mtime(), m.mtime_nsec()),
            ctime: time_tag(m.ctime(), m.ctime_nsec()),
        }
    }
}

/// What the crawl counted (the files themselves go to its callback).
#[derive(Debug, Default)]
pub struct WalkResult {
    /// Files left out, by reason (one per file).
    pub skipped: BTreeMap<SkipReason, u64>,
    /// Directories left out with everything below them, by reason (their
    /// contents are not read, so not counted as files).
    pub skipped_dirs: BTreeMap<SkipReason, u64>,
    /// Errors by kind (e.g. `unreadable_dir`), each already reported.
    pub errors: BTreeMap<&'static str, u64>,
}

/// Directories are read and their entries `lstat`ed by this many threads at
/// once: on a cold disk, metadata reads in flight together finish sooner than
/// one `find` reading them one after another.
const CRAWL_THREADS: usize = 8;

/// What a crawler thread found, for the one consumer.
enum Found {
    File(PathBuf, std::fs::Metadata),
    Skip(SkipReason),
    SkipDir(SkipReason),
    Error(&'static str, PathBuf, io::Error),
}

/// Crawl `roots` (canonical paths on one filesystem of kind `fs`).
/// Every eligible file is handed to `each` as soon as it is found, so
/// reading can start while the crawl goes on. `stop` ends the crawl early.
///
/// [`CRAWL_THREADS`] threads (the `ignore` crate's parallel walker) read
/// directories, `lstat` entries and decide about directories; this thread
/// applies the rules that need one view of everything (hard links) and calls
/// `each`. Files arrive in no particular order.
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
    let skip_dir = |r: SkipReason| *result.borrow_mut().skipped_dirs.entry(r).or_default() += 1;
    for root in roots {
        if let Err(r) = policy.check_ancestors(root) {
            progress.warn(&format!("{}: skipped, a directory above it is marked {}", display_path(root), r.name()));
            skip_dir(r);
            continue;
        }
        let root_dev = match std::fs::symlink_metadata(root) {
            Ok(m) => m.dev(),
            Err(e) => {
                error(&result, progress, "unreadable", root, &e);
                continue;
            }
        };
        let (tx, rx) = sync_channel::<Found>(4096);
        std::thread::scope(|s| {
            let mounts = &mounts;
            s.spawn(move || {
                WalkBuilder::new(root)
                    .standard_filters(false)
                    .follow_links(false)
                    .threads(CRAWL_THREADS)
                    .build_parallel()
                    .run(|| {
                        let tx = tx.clone();
                        Box::new(move |entry| visit(entry, root_dev, fs, mounts, policy, stop, &tx))
                    });
            });
            for found in rx {
                let (path, meta) = match found {
                    Found::File(path, meta) => (path, meta),
                    Found::Skip(r) => {
                        skip(r);
                        continue;
                    }
                    Found::SkipDir(r) => {
                        skip_dir(r);
                        continue;
                    }
                    Found::Error(kind, path, e) => {
                        error(&result, progress, kind, &path, &e);
                        continue;
                    }
                };
                if meta.nlink() > 1 && !seen_inodes.insert((meta.dev(), meta.ino())) {
                    skip(SkipReason::Hardlink);
                    continue;
                }
                if meta.size() == 0 {
                    skip(SkipReason::Empty);
                    continue;
                }
                if let Err(r) = policy.check_file(&path, meta.dev(), meta.ino()) {
                    skip(r);
                    continue;
                }
                each(Candidate::from_metadata(path, &meta));
            }
        });
    }
    result.into_inner()
}

/// One entry, on a crawler thread: decide about directories (descend or
/// not), `lstat` files, and report everything else by type.
fn visit(
    entry: Result<ignore::DirEntry, ignore::Error>,
    root_dev: u64,
    fs: FsKind,
    mounts: &HashSet<PathBuf>,
    policy: &Policy,
    stop: &AtomicBool,
    tx: &SyncSender<Found>,
) -> WalkState {
    if stop.load(Ordering::Relaxed) {
        return WalkState::Quit;
    }
    let found = match entry {
        Err(e) => {
            let path = error_path(&e).map(Path::to_owned).unwrap_or_default();
            let io = match e.io_error() {
                Some(io) => io::Error::new(io.kind(), io.to_string()),
                None => io::Error::other(e.to_string()),
            };
            let kind = if io.kind() == io::ErrorKind::NotFound { "vanished" } else { "unreadable" };
            Found::Error(kind, path, io)
        }
        Ok(e) => {
            let Some(ft) = e.file_type() else { return WalkState::Continue };
            if ft.is_dir() {
                match dir_allowed(&e, root_dev, fs, mounts, policy) {
                    Ok(()) => return WalkState::Continue,
                    Err(r) => {
                        let _ = tx.send(Found::SkipDir(r));
                        return WalkState::Skip;
                    }
                }
            }
            if !ft.is_file() {
                Found::Skip(match () {
                    _ if ft.is_symlink() => SkipReason::Symlink,
                    _ if ft.is_fifo() => SkipReason::Fifo,
                    _ if ft.is_socket() => SkipReason::Socket,
                    _ => SkipReason::Device,
                })
            } else {
                // d_type said regular; lstat must agree (the name may have
                // been replaced by a FIFO in between).
                match e.metadata() {
                    Ok(m) if m.file_type().is_file() => Found::File(e.into_path(), m),
                    _ => Found::Skip(SkipReason::Vanished),
                }
            }
        }
    };
    match tx.send(found) {
        Ok(()) => WalkState::Continue,
        Err(_) => WalkState::Quit,
    }
}

/// The path an `ignore` error is about, if it says.
fn error_path(e: &ignore::Error) -> Option<&Path> {
    match e {
        ignore::Error::WithPath { path, .. } => Some(path),
        ignore::Error::WithDepth { err, .. } | ignore::Error::WithLineNumber { err, .. } => error_path(err),
        ignore::Error::Loop { child, .. } => Some(child),
        _ => None,
    }
}

/// Inode number of every btrfs subvolume's root directory.
const BTRFS_FIRST_FREE_OBJECTID: u64 = 256;

fn dir_allowed(
    e: &ignore::DirEntry,
    root_dev: u64,
    fs: FsKind,
    mounts: &HashSet<PathBuf>,
    policy: &Policy,
) -> Result<(), SkipReason> {
    let meta = e.metadata().ok();
    if e.depth() > 0 {
        if mounts.contains(e.path()) {
            return Err(SkipReason::MountPoint);
        }
        let dev = meta.as_ref().map_or(root_dev, |m| m.dev());
        // Another st_dev is another filesystem, except for btrfs subvolumes.
        if dev != root_dev && fs != FsKind::Btrfs {
            return Err(SkipReason::MountPoint);
        }
    }
    // A btrfs subvolume's root directory is inode 256.
    if fs == FsKind::Btrfs
        && !policy.include_readonly_snapshots
        && meta.is_some_and(|m| m.ino() == BTRFS_FIRST_FREE_OBJECTID)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_tags_tell_times_apart() {
        let t = time_tag(1_700_000_000, 123);
        assert_eq!(t, time_tag(1_700_000_000, 123));
        assert_ne!(t, time_tag(1_700_000_000, 124));
        // Whole seconds set back by 2^23 s (97 days) agree in the low 32 bits
        // of their nanoseconds; the tag must still differ.
        let (a, b) = (1_700_000_000i64, 1_700_000_000i64 - (1 << 23));
        assert_eq!((a * 1_000_000_000) as u32, (b * 1_000_000_000) as u32);
        assert_ne!(time_tag(a, 0), time_tag(b, 0));
    }
}
