//! The crawl: list the regular files under the starting paths.
//!
//! In: the starting paths held open ([`Tree`]), the filesystem kind, the
//! [`Policy`]. Out: one [`FileFacts`] per eligible inode (path, size, time
//! tags from `fstatat` without following symlinks, and `st_dev` as its
//! volume: change detection resolves the volume key), handed to a callback
//! as it is found, plus a [`WalkResult`]: counts of everything skipped, by
//! reason, and of errors, by [`ErrorKind`], and the files handed on that a
//! hard link keeps out of the plan (`links.rs`: known only once the crawl
//! is over). Directories are read by eight threads; files are only
//! `fstatat`ed, never opened.
//!
//! The crawl cannot be redirected by a user who renames or replaces what
//! they own while it runs: every directory is opened relative to its
//! parent's descriptor (one name, `O_NOFOLLOW | O_DIRECTORY`, and with
//! `openat2` `RESOLVE_NO_XDEV`, see [`crate::sys::beneath`]), its entries
//! are read from that descriptor and `fstatat`ed relative to it, and its
//! nodedup markers are checked on it. A directory swapped for a symlink
//! after its parent was listed is refused by the kernel (`ELOOP`, counted
//! `symlink`); swapped for a file, it is counted `vanished`. No path is
//! resolved again from `/`.
//!
//! Symlinks are never followed; FIFOs, sockets and devices are counted and
//! never opened; other mounts are not entered. On btrfs, subvolumes have
//! their own `st_dev` but are part of the same filesystem (not mounts), so
//! they are entered.

use std::collections::{BTreeMap, HashSet};
use std::ffi::{CStr, OsStr};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, TryRecvError};
use std::sync::Arc;

use rustix::fs::{FileType, RawDir, Stat};

use crate::batched::Batched;
use crate::display::display_path;
use crate::errors::ErrorKind;
use crate::file::FileFacts;
use crate::policy::{Policy, SkipReason};
use crate::progress::Progress;
use crate::sys::beneath::{self, Tree};
use crate::sys::{stat, FsKind};
use links::HardLinks;
pub use links::Outside;
use listed::Listed;

mod links;
mod listed;
mod queue;

use queue::{Job, Queue};

/// What the crawl counted (the files themselves go to its callback).
#[derive(Debug, Default)]
pub struct WalkResult {
    /// Files left out, by reason (one per file).
    pub skipped: BTreeMap<SkipReason, u64>,
    /// Directories left out with everything below them, by reason (their
    /// contents are not read, so not counted as files).
    pub skipped_dirs: BTreeMap<SkipReason, u64>,
    /// Errors by kind, each already warned about.
    pub errors: BTreeMap<ErrorKind, u64>,
    /// `(st_dev, ino)` of the multiply-linked files handed to the callback
    /// that must stay out of this run's plan: the crawl did not see every
    /// one of their names, or left one out (the rule: `walk/links.rs`).
    pub links_outside: Outside,
}

/// Directories are read and their entries `fstatat`ed by this many threads
/// at once: on a cold disk, metadata reads in flight together finish sooner
/// than one `find` reading them one after another.
const CRAWL_THREADS: usize = 8;

/// Bytes of directory entries read per `getdents64` call (per thread).
const DIRENT_BUF: usize = 32 * 1024;

/// What a crawler thread found, for the one consumer.
enum Found {
    File(PathBuf, Stat),
    Skip(SkipReason),
    SkipDir(SkipReason),
    /// A directory below [`MAX_PATH_BYTES`] of path, left out with
    /// everything in it (`too_deep`), and said.
    TooDeep(PathBuf),
    Error(ErrorKind, PathBuf, io::Error),
}

/// Most entries a crawler thread hands over at once.
const FOUND_BATCH: usize = 64;

/// What one crawler thread found, handed to the consumer a directory's
/// entries (at most [`FOUND_BATCH`]) at a time.
type Out = Batched<Found>;

/// What every crawler thread reads.
struct Ctx<'a> {
    root_dev: u64,
    fs: FsKind,
    mounts: &'a HashSet<PathBuf>,
    policy: &'a Policy,
    stop: &'a AtomicBool,
    listed: &'a Listed,
}

/// Crawl the starting paths held by `tree` (canonical paths on one
/// filesystem of kind `fs`). Every eligible file is handed to `each` as
/// soon as it is found, so reading can start while the crawl goes on, and
/// `idle` is called whenever every file found so far has been handed over
/// (before this thread waits for more: a caller that passes files on in
/// batches sends what it holds). `stop` ends the crawl early.
///
/// `CRAWL_THREADS` (8) threads read directories, `fstatat` entries and decide
/// about directories; this thread applies the rules that need one view of
/// everything (hard links) and calls `each`. Files arrive in no particular
/// order.
pub fn walk(
    tree: &Tree,
    fs: FsKind,
    policy: &Policy,
    progress: &dyn Progress,
    stop: &AtomicBool,
    mut each: impl FnMut(FileFacts),
    mut idle: impl FnMut(),
) -> WalkResult {
    let mounts = crate::sys::mounts::mount_points();
    let mut result = WalkResult::default();
    let mut links = HardLinks::default();
    let listed = Listed::default();
    for i in 0.. {
        let Some((dir, dir_fd, file)) = tree.root(i) else { break };
        let Some((start, root_dev)) = start(dir, dir_fd, file, fs, policy, progress, &mut result) else { continue };
        let ctx = Ctx { root_dev, fs, mounts: &mounts, policy, stop, listed: &listed };
        let (tx, rx) = sync_channel::<Vec<Found>>(4096 / FOUND_BATCH);
        let queue = Queue::starting();
        std::thread::scope(|s| {
            match start {
                Start::Dir(fd, id) => {
                    let (ctx, queue) = (&ctx, &queue);
                    let mut out = Out::new(tx.clone(), FOUND_BATCH);
                    s.spawn(move || {
                        let mut buf = vec![MaybeUninit::uninit(); DIRENT_BUF];
                        let found = read_dir(ctx, queue, (Arc::new(fd), id), dir, None, &mut buf, &mut out);
                        out.flush();
                        queue.done(found.jobs, found.rest);
                    });
                    for _ in 0..CRAWL_THREADS {
                        let mut out = Out::new(tx.clone(), FOUND_BATCH);
                        s.spawn(move || {
                            let mut buf = vec![MaybeUninit::uninit(); DIRENT_BUF];
                            while let Some(job) = queue.take() {
                                let found = if ctx.stop.load(Ordering::Relaxed) {
                                    Listing::default()
                                } else {
                                    enter(ctx, queue, job, &mut buf, &mut out)
                                };
                                out.flush();
                                queue.done(found.jobs, found.rest);
                            }
                        });
                    }
                }
                Start::File(path, st) => {
                    let _ = tx.send(vec![Found::File(path, st)]);
                }
            }
            drop(tx);
            loop {
                let batch = match rx.try_recv() {
                    Ok(batch) => batch,
                    Err(TryRecvError::Empty) => {
                        idle();
                        let Ok(batch) = rx.recv() else { break };
                        batch
                    }
                    Err(TryRecvError::Disconnected) => break,
                };
                for found in batch {
                    consume(found, policy, progress, &mut links, &mut result, &mut each);
                }
            }
        });
    }
    result.links_outside = links.outside();
    result
}

/// On the calling thread, one thing a crawler thread found: count it, or
/// apply the file rules of the policy and the rules that need one view of
/// everything (hard links: `links`, the names met so far), and hand an
/// eligible file to `each`. Every name of a multiply-linked file is judged
/// by the policy, so a name let in after one left out is still handed on
/// (and then kept out of the plan, see [`HardLinks`]).
fn consume(
    found: Found,
    policy: &Policy,
    progress: &dyn Progress,
    links: &mut HardLinks,
    result: &mut WalkResult,
    each: &mut impl FnMut(FileFacts),
) {
    let (path, st) = match found {
        Found::File(path, st) => (path, st),
        Found::Skip(r) => {
            *result.skipped.entry(r).or_default() += 1;
            return;
        }
        Found::SkipDir(r) => {
            *result.skipped_dirs.entry(r).or_default() += 1;
            return;
        }
        Found::TooDeep(path) => {
            *result.skipped_dirs.entry(SkipReason::TooDeep).or_default() += 1;
            // Data left out that the administrator did not choose to leave
            // out: said with the path (shortened: it is 64 KiB long).
            let kib = MAX_PATH_BYTES >> 10;
            let path = crate::display::display_long_path(&path);
            progress.warn(&format!("{path}: left out with everything below it: its path is longer than {kib} KiB"));
            return;
        }
        Found::Error(kind, path, e) => {
            error(result, progress, kind, &path, &e);
            return;
        }
    };
    let skip = if st.st_size == 0 {
        Some(SkipReason::Empty)
    } else {
        let skip = policy.check_file(&path, st.st_dev, st.st_ino).err();
        if st.st_nlink > 1 && !links.name((st.st_dev, st.st_ino), st.st_nlink, skip) && skip.is_none() {
            Some(SkipReason::Hardlink)
        } else {
            skip
        }
    };
    match skip {
        Some(r) => *result.skipped.entry(r).or_default() += 1,
        // The volume key is resolved by change detection, which may open
        // the file's directory; the crawl only lists.
        None => each(FileFacts::from_stat(path, st.st_dev, &st)),
    }
}

/// How a starting path begins: a directory to read, or a single file.
enum Start {
    /// The directory and its `(st_dev, st_ino)`.
    Dir(OwnedFd, (u64, u64)),
    File(PathBuf, Stat),
}

/// Check a starting path (directory `dir` held as `dir_fd`, or the file
/// `file` in it) and open it for the crawl: how it starts and its device.
/// `None`: skipped or unreadable (counted).
fn start(
    dir: &Path,
    dir_fd: BorrowedFd<'_>,
    file: Option<&CStr>,
    fs: FsKind,
    policy: &Policy,
    progress: &dyn Progress,
    result: &mut WalkResult,
) -> Option<(Start, u64)> {
    let path = match file {
        Some(name) => dir.join(OsStr::from_bytes(name.to_bytes())),
        None => dir.to_owned(),
    };
    // Directories above the starting path are checked by path: the
    // administrator chose it, and nothing below it is resolved that way.
    if let Err(r) = policy.check_ancestors(&path) {
        progress.warn_run(&format!("{}: skipped, a directory above it is marked {}", display_path(&path), r.name()));
        *result.skipped_dirs.entry(r).or_default() += 1;
        return None;
    }
    let st = match file {
        Some(name) => stat::stat_at(dir_fd, name),
        None => stat::stat_fd(dir_fd),
    };
    let st = match st {
        Ok(st) => st,
        Err(e) => {
            let kind = if e.kind() == io::ErrorKind::NotFound { ErrorKind::Vanished } else { ErrorKind::Unreadable };
            error(result, progress, kind, &path, &e);
            return None;
        }
    };
    // The crawl meets a read-only snapshot at its root (`dir_allowed_fd`);
    // a starting path below that root is inside it all the same.
    if fs == FsKind::Btrfs && !policy.include_readonly_snapshots && crate::sys::inode::in_readonly_subvolume(dir_fd) {
        progress.warn_run(&format!(
            "{}: skipped, inside a read-only btrfs snapshot (see --include-readonly-snapshots)",
            display_path(&path)
        ));
        let counts = if file.is_some() { &mut result.skipped } else { &mut result.skipped_dirs };
        *counts.entry(SkipReason::ReadonlySnapshot).or_default() += 1;
        return None;
    }
    if file.is_some() {
        let dev = st.st_dev;
        return match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => Some((Start::File(path, st), dev)),
            FileType::Symlink => {
                *result.skipped.entry(SkipReason::Symlink).or_default() += 1;
                None
            }
            _ => {
                *result.skipped.entry(SkipReason::Device).or_default() += 1;
                None
            }
        };
    }
    let fd = match dir_fd.try_clone_to_owned() {
        Ok(fd) => fd,
        Err(e) => {
            error(result, progress, ErrorKind::Unreadable, &path, &e);
            return None;
        }
    };
    if let Err(r) = dir_allowed_fd(fd.as_fd(), &path, &st, fs, policy) {
        *result.skipped_dirs.entry(r).or_default() += 1;
        return None;
    }
    Some((Start::Dir(fd, (st.st_dev, st.st_ino)), st.st_dev))
}

/// Read the directory `job` on a crawler thread: open it relative to its
/// parent, check it, list it (or list the rest of one). Returns its
/// subdirectories.
fn enter(ctx: &Ctx<'_>, queue: &Queue, job: Job, buf: &mut [MaybeUninit<u8>], out: &mut Out) -> Listing {
    let (parent, name, path) = match job {
        Job::Open { parent, name, path } => (parent, name, path),
        Job::Rest { dir, id, path, cookie } => return read_dir(ctx, queue, (dir, id), &path, Some(cookie), buf, out),
    };
    // Mount points are read from mountinfo, never longer than PATH_MAX:
    // a deeper path needs no lookup (hashing it would cost its length).
    if path.as_os_str().len() <= libc::PATH_MAX as usize && ctx.mounts.contains(&path) {
        out.send(Found::SkipDir(SkipReason::MountPoint));
        return Listing::default();
    }
    let fd = match beneath::open_dir_at(parent.as_fd(), &name) {
        Ok(fd) => fd,
        Err(e) => {
            let found = match e.raw_os_error() {
                // Replaced by a symlink since the parent was listed: never
                // followed.
                Some(libc::ELOOP) => Found::Skip(SkipReason::Symlink),
                Some(libc::EXDEV) => Found::SkipDir(SkipReason::MountPoint),
                Some(libc::ENOENT) | Some(libc::ENOTDIR) => Found::Skip(SkipReason::Vanished),
                _ => Found::Error(ErrorKind::Unreadable, path, e),
            };
            out.send(found);
            return Listing::default();
        }
    };
    drop(parent);
    let st = match stat::stat_fd(fd.as_fd()) {
        Ok(st) => st,
        Err(e) => {
            out.send(Found::Error(ErrorKind::Unreadable, path, e));
            return Listing::default();
        }
    };
    // Another st_dev is another filesystem, except for btrfs subvolumes.
    if st.st_dev != ctx.root_dev && ctx.fs != FsKind::Btrfs {
        out.send(Found::SkipDir(SkipReason::MountPoint));
        return Listing::default();
    }
    if let Err(r) = dir_allowed_fd(fd.as_fd(), &path, &st, ctx.fs, ctx.policy) {
        out.send(Found::SkipDir(r));
        return Listing::default();
    }
    read_dir(ctx, queue, (Arc::new(fd), (st.st_dev, st.st_ino)), &path, None, buf, out)
}

/// Longest path of a directory the crawl enters (64 KiB, 16 × PATH_MAX).
/// A user can nest directories without limit; every entry's path is built
/// from its parent's and stored in the database, so a tree a million levels
/// deep would cost the crawl time and memory quadratic in its depth. Files
/// deeper than PATH_MAX up to this are opened in pieces
/// (`sys::beneath::open_long`); below it a directory is left out, counted
/// `too_deep` in `skipped_dirs` and said (the data there is not looked at).
pub const MAX_PATH_BYTES: usize = 64 << 10;

/// Subdirectories queued at once by a thread listing a directory, so that
/// idle threads can start on them before the listing ends.
const PUSH_BATCH: usize = 4;

/// Subdirectories one listing queues before it stops and leaves the rest
/// of its directory for later ([`Job::Rest`]): bounds the queue (a job is
/// about 130 bytes: 1,000,000 empty subdirectories of one directory held
/// 129 MB before).
pub(super) const MAX_SUBDIRS: usize = 4096;

/// What a listing found below it: subdirectories to read, and the rest of
/// the directory if it stopped early.
#[derive(Default)]
struct Listing {
    jobs: Vec<Job>,
    rest: Option<Job>,
}

/// List the open directory `fd` (at `path`, `(st_dev, st_ino)` `id`), from
/// the start or from the offset `from` (a [`Job::Rest`]): files and other
/// entries go to `out`, subdirectories become jobs holding `fd` (queued in
/// batches of [`PUSH_BATCH`] while listing; the last ones are returned).
/// After [`MAX_SUBDIRS`] subdirectories the listing stops and returns the
/// rest of the directory as a job.
fn read_dir(
    ctx: &Ctx<'_>,
    queue: &Queue,
    (fd, id): (Arc<OwnedFd>, (u64, u64)),
    path: &Path,
    from: Option<u64>,
    buf: &mut [MaybeUninit<u8>],
    out: &mut Out,
) -> Listing {
    let mut found = Listing::default();
    match from {
        None if !ctx.listed.first(id) => {
            out.send(Found::SkipDir(SkipReason::MovedDuringCrawl));
            return found;
        }
        None => {}
        Some(cookie) => {
            if let Err(e) = rustix::fs::seek(&fd, rustix::fs::SeekFrom::Start(cookie)) {
                out.send(Found::Error(ErrorKind::Unreadable, path.to_owned(), e.into()));
                return found;
            }
        }
    }
    let mut subdirs = 0;
    let mut dir = RawDir::new(fd.as_fd(), buf);
    while let Some(entry) = dir.next() {
        if ctx.stop.load(Ordering::Relaxed) {
            break;
        }
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                out.send(Found::Error(ErrorKind::Unreadable, path.to_owned(), e.into()));
                break;
            }
        };
        let name = entry.file_name();
        if matches!(name.to_bytes(), b"." | b"..") {
            continue;
        }
        let child = crate::file::child_path(path.as_os_str().as_bytes(), name.to_bytes());
        let child = match classify(ctx, fd.as_fd(), id, name, entry.file_type(), child) {
            Entry::Dir(child) => child,
            Entry::Other(f) => {
                if !out.send(f) {
                    break;
                }
                continue;
            }
        };
        found.jobs.push(Job::Open { parent: Arc::clone(&fd), name: name.to_owned(), path: child });
        if found.jobs.len() >= PUSH_BATCH {
            queue.push(&mut found.jobs);
        }
        subdirs += 1;
        if subdirs >= MAX_SUBDIRS {
            let cookie = entry.next_entry_cookie();
            found.rest = Some(Job::Rest { dir: Arc::clone(&fd), id, path: path.to_owned(), cookie });
            break;
        }
    }
    found
}

/// A directory entry, as [`classify`] finds it.
enum Entry {
    /// A directory to read.
    Dir(PathBuf),
    /// Anything else: a file, or a skip to report.
    Other(Found),
}

/// What the entry `name` of the directory `fd` (`id`) is, at `child`.
fn classify(ctx: &Ctx<'_>, fd: BorrowedFd<'_>, id: (u64, u64), name: &CStr, mut ft: FileType, child: PathBuf) -> Entry {
    let mut st = None;
    let file_like = matches!(ft, FileType::RegularFile | FileType::Unknown);
    // The database's files by name, before any stat: SQLite creates and
    // removes some of them while the crawl runs.
    if file_like && ctx.policy.is_own_database(id, name.to_bytes()) {
        return Entry::Other(Found::Skip(SkipReason::OwnDatabase));
    }
    if file_like {
        // d_type said regular (or nothing); the stat must agree (a FIFO may
        // have taken the name). On another device than its directory it is
        // a mount on the name (a user's FUSE file); a directory is refused when opened.
        match stat::stat_at(fd, name) {
            Ok(s) => {
                ft = FileType::from_raw_mode(s.st_mode);
                if s.st_dev != id.0 && !ft.is_dir() {
                    return Entry::Other(Found::Skip(SkipReason::MountPoint));
                }
                st = Some(s);
            }
            Err(_) => return Entry::Other(Found::Skip(SkipReason::Vanished)),
        }
    }
    Entry::Other(match ft {
        FileType::Directory if child.as_os_str().len() > MAX_PATH_BYTES => Found::TooDeep(child),
        FileType::Directory => return Entry::Dir(child),
        FileType::RegularFile => match st {
            Some(s) => Found::File(child, s),
            None => Found::Skip(SkipReason::Vanished),
        },
        FileType::Symlink => Found::Skip(SkipReason::Symlink),
        FileType::Fifo => Found::Skip(SkipReason::Fifo),
        FileType::Socket => Found::Skip(SkipReason::Socket),
        _ => Found::Skip(SkipReason::Device),
    })
}

/// Inode number of every btrfs subvolume's root directory.
const BTRFS_FIRST_FREE_OBJECTID: u64 = 256;

/// Whether the open directory `fd` (at `path`, `fstat` `st`) may be entered:
/// read-only snapshots, excludes and nodedup markers, all checked on the
/// descriptor that is then listed.
fn dir_allowed_fd(fd: BorrowedFd<'_>, path: &Path, st: &Stat, fs: FsKind, policy: &Policy) -> Result<(), SkipReason> {
    // A btrfs subvolume's root directory is inode 256.
    if fs == FsKind::Btrfs
        && !policy.include_readonly_snapshots
        && st.st_ino == BTRFS_FIRST_FREE_OBJECTID
        && crate::sys::inode::is_readonly_subvolume_fd(fd)
    {
        return Err(SkipReason::ReadonlySnapshot);
    }
    policy.check_dir_fd(fd, path)
}

/// Warn about a problem with `path` and count it.
fn error(result: &mut WalkResult, progress: &dyn Progress, kind: ErrorKind, path: &Path, e: &io::Error) {
    progress.warn(&format!("{}: {kind}: {e}", display_path(path)));
    *result.errors.entry(kind).or_default() += 1;
}

#[cfg(test)]
mod tests;
