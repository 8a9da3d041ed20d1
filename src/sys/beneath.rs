//! Opens that a user writing to the scanned tree cannot redirect.
//!
//! A root run shares a volume with users who may rename, delete and replace
//! anything they own while the run is in it. A full path resolved again at
//! open time follows whatever its components are *now*: a directory swapped
//! for a symlink to `/etc` or to a root-only directory makes a root process
//! open files it never listed. So every open here is relative to a
//! directory descriptor the run already holds, and the kernel is told not to
//! leave it:
//!
//! - [`Tree`] holds one descriptor per starting path, opened once at the
//!   start of the run. Files are opened from it with `openat2` and
//!   `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV`: no `..` out
//!   of the starting directory, no symlink in any component (`ELOOP`), no
//!   mount crossed (`EXDEV`; btrfs subvolumes are not mounts and are
//!   crossed). On a kernel without `openat2` (`ENOSYS`, before 5.6) the path
//!   is walked one component at a time with `O_NOFOLLOW`, which refuses
//!   symlinks too.
//! - [`open_dir_at`] opens one directory entry, a single name relative to
//!   its parent's descriptor, for the crawl.
//!
//! The caller then checks the identity of what it opened (`fstat` of the
//! descriptor against what the crawl or the database recorded), and makes
//! every further check (nodedup markers, inode flags) on that descriptor.
//!
//! All calls go through `rustix`, whose wrappers are safe: no `unsafe` here.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use rustix::fs::{Access, AtFlags, Mode, OFlags, ResolveFlags};

use crate::display::display_path;

/// Flags of every open of a file to read: never for writing, never through
/// a symlink, never blocking on a FIFO that took the name since the crawl,
/// never becoming the controlling terminal.
const FILE_FLAGS: OFlags =
    OFlags::RDONLY.union(OFlags::NOFOLLOW).union(OFlags::NONBLOCK).union(OFlags::NOCTTY).union(OFlags::CLOEXEC);

/// Flags of a directory open.
const DIR_FLAGS: OFlags = OFlags::RDONLY.union(OFlags::DIRECTORY).union(OFlags::NOFOLLOW).union(OFlags::CLOEXEC);

/// What `openat2` may not do while resolving a path below a held directory.
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS).union(ResolveFlags::NO_XDEV);

/// Set once `openat2` answered `ENOSYS`: use the component walk from then on.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// `openat2(dir, rel, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
/// RESOLVE_NO_XDEV)`, or the component walk where the kernel lacks it.
/// `rel` must be relative and hold only plain names (no `..`, no `.`).
pub fn open_beneath(dir: BorrowedFd<'_>, rel: &Path, flags: OFlags) -> io::Result<OwnedFd> {
    if rel.is_absolute() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(io::Error::from_raw_os_error(libc::EXDEV));
    }
    open_resolved(dir, rel, flags, RESOLVE)
}

/// `openat2(dir, rel, flags, how)`, or the component walk (which refuses
/// every symlink, so is at least as strict as any `how` used here) where the
/// kernel lacks `openat2`.
fn open_resolved(dir: BorrowedFd<'_>, rel: &Path, flags: OFlags, how: ResolveFlags) -> io::Result<OwnedFd> {
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        match openat2(dir, rel, flags, how) {
            Err(rustix::io::Errno::NOSYS) => NO_OPENAT2.store(true, Ordering::Relaxed),
            // A path longer than PATH_MAX (4096 bytes: a user can nest
            // directories that deep) is refused whole: open it in pieces.
            Err(rustix::io::Errno::NAMETOOLONG) => return open_long(dir, rel, flags, how),
            other => return other.map_err(io::Error::from),
        }
    }
    open_components(dir, rel, flags, how.contains(ResolveFlags::NO_XDEV))
}

/// One `openat2` call.
///
/// `EAGAIN` is passed on: the kernel gives it for a rename racing a `..`
/// under `RESOLVE_BENEATH`, and the paths resolved here never hold `..`,
/// so it means that another process holds a lease on the file and the
/// open (`O_NONBLOCK`, [`FILE_FLAGS`]) declined to wait for it to break
/// (callers count the file `leased`). It was taken for a vanished file.
fn openat2<P: rustix::path::Arg>(
    dir: BorrowedFd<'_>,
    rel: P,
    flags: OFlags,
    how: ResolveFlags,
) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat2(dir, rel, flags | OFlags::CLOEXEC, Mode::empty(), how)
}

/// Most bytes of path handed to one `openat2` by [`open_long`].
const PIECE: usize = 3072;

/// [`open_resolved`] for a path longer than PATH_MAX: `openat2` on pieces of
/// at most [`PIECE`] bytes, each from the directory the previous one opened
/// (`O_PATH`), each with the same `how`, so the kernel still refuses a
/// symlink, a `..` or a mount anywhere. A few calls where the walk would
/// make one per name (a user can nest directories by the hundred thousand).
fn open_long(dir: BorrowedFd<'_>, rel: &Path, flags: OFlags, how: ResolveFlags) -> io::Result<OwnedFd> {
    let mut held: Option<OwnedFd> = None;
    let mut piece = PathBuf::new();
    for name in rel.components().map(|c| c.as_os_str()) {
        if !piece.as_os_str().is_empty() && piece.as_os_str().len() + 1 + name.len() > PIECE {
            let at = held.as_ref().map_or(dir, |f| f.as_fd());
            held = Some(openat2(at, &piece, OFlags::PATH | OFlags::DIRECTORY, how)?);
            piece.clear();
        }
        piece.push(name);
    }
    Ok(openat2(held.as_ref().map_or(dir, |f| f.as_fd()), &piece, flags, how)?)
}

/// Open the directory at the absolute `path` without following a symlink
/// in any component (`openat2` from `/` with `RESOLVE_NO_SYMLINKS`, or the
/// component walk): what was resolved is what is opened. Mounts may be
/// crossed (a starting path often lies on one below `/`).
fn open_canonical(path: &Path) -> io::Result<OwnedFd> {
    let rel = path.strip_prefix("/").map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    if rel.as_os_str().is_empty() {
        // The starting path `/`, listed too.
        return without_atime(DIR_FLAGS, |flags| rustix::fs::open("/", flags, Mode::empty()));
    }
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let root = rustix::fs::open("/", DIR_FLAGS, Mode::empty())?;
    without_atime(DIR_FLAGS, |flags| open_resolved(root.as_fd(), rel, flags, ResolveFlags::NO_SYMLINKS))
}

/// The fallback of [`open_beneath`]: open each directory of `rel` relative
/// to the previous one with `O_NOFOLLOW | O_DIRECTORY`, then the last name
/// with `O_NOFOLLOW`. A symlink anywhere answers `ELOOP` (or `ENOTDIR`).
/// With `xdev` a component that is the root of a mount answers `EXDEV`, as
/// `RESOLVE_NO_XDEV` does (`statx`'s `STATX_ATTR_MOUNT_ROOT`, Linux 5.8; on
/// older kernels the caller's identity check, device and inode against the
/// crawl, refuses what lies there).
pub(crate) fn open_components(dir: BorrowedFd<'_>, rel: &Path, flags: OFlags, xdev: bool) -> io::Result<OwnedFd> {
    let mut names = rel.components().map(|c| c.as_os_str()).peekable();
    let mut cur: Option<OwnedFd> = None;
    while let Some(name) = names.next() {
        let at = cur.as_ref().map_or(dir, |f| f.as_fd());
        let last = names.peek().is_none();
        let next = if last {
            rustix::fs::openat(at, name, flags | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?
        } else {
            rustix::fs::openat(
                at,
                name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| if e == rustix::io::Errno::NOTDIR { rustix::io::Errno::LOOP } else { e })?
        };
        if xdev && is_mount_root(next.as_fd()) {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        if last {
            return Ok(next);
        }
        cur = Some(next);
    }
    Err(io::Error::from_raw_os_error(libc::ENOENT))
}

/// Whether `fd` is the root of a mount (false where `statx` cannot say).
fn is_mount_root(fd: BorrowedFd<'_>) -> bool {
    use rustix::fs::{StatxAttributes, StatxFlags};
    rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC, StatxFlags::empty()).is_ok_and(|s| {
        s.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT)
            && s.stx_attributes.contains(StatxAttributes::MOUNT_ROOT)
    })
}

/// Open a regular file of the volume for reading, relative to `dir`, without
/// updating its access time where the kernel allows it (owner or
/// CAP_FOWNER).
pub fn open_file_beneath(dir: BorrowedFd<'_>, rel: &Path) -> io::Result<File> {
    match open_beneath(dir, rel, FILE_FLAGS | OFlags::NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open_beneath(dir, rel, FILE_FLAGS),
        other => other,
    }
    .map(File::from)
}

/// `open(flags | O_NOATIME)`, or `open(flags)` where the kernel refuses
/// that (`EPERM`: neither the owner nor CAP_FOWNER). Listing a directory
/// sets its access time as reading a file does: a nightly run would touch
/// every directory of the volume (a dry run that "changes nothing"
/// included), keep atime-based cleaners from ever finding them idle, and,
/// on btrfs, rewrite the metadata a writable snapshot shares with its
/// origin.
fn without_atime<E: Into<io::Error>>(
    flags: OFlags,
    open: impl Fn(OFlags) -> Result<OwnedFd, E>,
) -> io::Result<OwnedFd> {
    match open(flags | OFlags::NOATIME).map_err(Into::into) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(flags).map_err(Into::into),
        other => other,
    }
}

/// Open the directory entry `name` of `dir` for listing (see
/// [`without_atime`]). A symlink answers
/// `ELOOP` (it is never followed), a mount point `EXDEV` (never entered;
/// btrfs subvolumes are not mounts), a name that is no longer a directory
/// `ENOTDIR`.
pub fn open_dir_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    let opened = without_atime(DIR_FLAGS, |flags| {
        if NO_OPENAT2.load(Ordering::Relaxed) {
            return rustix::fs::openat(dir, name, flags, Mode::empty());
        }
        match openat2(dir, name, flags, RESOLVE) {
            Err(rustix::io::Errno::NOSYS) => {
                NO_OPENAT2.store(true, Ordering::Relaxed);
                rustix::fs::openat(dir, name, flags, Mode::empty())
            }
            other => other,
        }
    });
    match opened {
        // `O_DIRECTORY | O_NOFOLLOW` on a symlink answers ENOTDIR: say
        // which it is, so a directory swapped for a symlink is counted as one.
        Err(e)
            if e.raw_os_error() == Some(libc::ENOTDIR)
                && super::stat::stat_at(dir, name)
                    .is_ok_and(|s| rustix::fs::FileType::from_raw_mode(s.st_mode).is_symlink()) =>
        {
            Err(io::Error::from_raw_os_error(libc::ELOOP))
        }
        other => other,
    }
}

/// Whether the open file or directory `fd` carries the extended attribute
/// `name`. No xattr support, or no such attribute: `false`. Asked of
/// protection markers, so it fails closed: any other failure (an I/O
/// error, no memory) answers `true`, and the file is left alone.
pub fn has_xattr_fd(fd: BorrowedFd<'_>, name: &str) -> bool {
    use rustix::io::Errno;
    !matches!(rustix::fs::fgetxattr_query(fd, name), Err(Errno::NODATA | Errno::NOTSUP))
}

/// The starting paths of a run, each held open for the whole run: every
/// file under them is opened relative to these descriptors (see the module
/// doc). A starting path that is a file is held by its parent directory.
#[derive(Debug)]
pub struct Tree {
    /// (directory, its descriptor, the file's name for a starting path that
    /// is a file).
    roots: Vec<(PathBuf, OwnedFd, Option<std::ffi::CString>)>,
    /// Which of `roots` unnamed temporary files are made in, found once
    /// ([`Tree::scratch`]); otherwise why none can be.
    scratch: OnceLock<Result<usize, String>>,
}

/// The error of [`Tree::scratch`] (and so of [`Tree::tmpfile`]) when the run
/// may create files in none of its starting directories: the same for
/// every file of the run, so callers say it once ([`is_no_scratch`]).
#[derive(Debug)]
pub struct NoScratch(String);

impl std::fmt::Display for NoScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NoScratch {}

/// Whether `e` is [`NoScratch`].
pub fn is_no_scratch(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<NoScratch>())
}

impl Tree {
    /// Open the starting `paths` (canonical, absolute: resolved by
    /// `config.rs`, which follows only symlinks nobody else could have
    /// planted). They are opened without following any symlink
    /// ([`open_canonical`]), so a component another user swapped for one
    /// since they were resolved fails the open (`ELOOP`) instead of
    /// leading elsewhere; every later open stays below them.
    pub fn open(paths: &[PathBuf]) -> io::Result<Tree> {
        let mut roots = Vec::new();
        for p in paths {
            let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
                roots.push((p.clone(), open_canonical(p)?, None));
                continue;
            };
            let parent_fd = open_canonical(parent)?;
            let name = std::ffi::CString::new(name.as_bytes())?;
            let st = rustix::fs::statat(&parent_fd, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)?;
            match rustix::fs::FileType::from_raw_mode(st.st_mode) {
                rustix::fs::FileType::Directory => roots.push((
                    p.clone(),
                    without_atime(DIR_FLAGS, |flags| {
                        rustix::fs::openat(&parent_fd, name.as_c_str(), flags, Mode::empty())
                    })?,
                    None,
                )),
                rustix::fs::FileType::Symlink => return Err(io::Error::from_raw_os_error(libc::ELOOP)),
                _ => roots.push((parent.to_owned(), parent_fd, Some(name))),
            }
        }
        Ok(Tree { roots, scratch: OnceLock::new() })
    }

    /// A tree over the top directories of the mounts holding `paths` (for
    /// `report`, which reads files recorded by earlier runs of unknown
    /// starting paths). A path under no readable mount is left out; opening
    /// it then fails.
    pub fn over_mounts<'p>(paths: impl IntoIterator<Item = &'p Path>) -> Tree {
        let mounts = super::mounts::mount_points();
        let mut tops: Vec<PathBuf> = Vec::new();
        let mut seen_dirs: std::collections::HashSet<&Path> = std::collections::HashSet::new();
        for p in paths {
            // Files of one directory share their mount: look it up once.
            if !p.parent().is_some_and(|d| seen_dirs.insert(d)) {
                continue;
            }
            if let Some(top) = p.ancestors().skip(1).find(|a| mounts.contains(*a)) {
                if !tops.iter().any(|t| t == top) {
                    tops.push(top.to_owned());
                }
            }
        }
        // Longest first, so a nested mount wins over the one it sits on.
        tops.sort_by_key(|t| std::cmp::Reverse(t.as_os_str().len()));
        let roots = tops.into_iter().filter_map(|t| {
            let fd = without_atime(DIR_FLAGS, |flags| rustix::fs::open(&t, flags, Mode::empty())).ok()?;
            Some((t.clone(), fd, None))
        });
        Tree { roots: roots.collect(), scratch: OnceLock::new() }
    }

    /// The held directory `path` lies under, and `path` relative to it.
    /// `None`: outside every starting path.
    pub fn locate<'p>(&self, path: &'p Path) -> Option<(BorrowedFd<'_>, &'p Path)> {
        self.roots
            .iter()
            .filter_map(|(dir, fd, _)| Some((fd.as_fd(), dir.as_os_str().len(), path.strip_prefix(dir).ok()?)))
            .max_by_key(|x| x.1)
            .map(|(fd, _, rel)| (fd, rel))
    }

    /// Open the file at absolute `path` for reading, relative to the held
    /// directory it lies under (see [`open_file_beneath`]). Outside every
    /// starting path: `EXDEV`, never opened.
    pub fn open_file(&self, path: &Path) -> io::Result<File> {
        let (fd, rel) = self.locate(path).ok_or_else(|| io::Error::from_raw_os_error(libc::EXDEV))?;
        open_file_beneath(fd, rel)
    }

    /// Open the directory at absolute `path` (for `fstat` and ioctls)
    /// relative to the held directory it lies under, like [`Tree::open_file`].
    pub fn open_dir(&self, path: &Path) -> io::Result<OwnedFd> {
        let (fd, rel) = self.locate(path).ok_or_else(|| io::Error::from_raw_os_error(libc::EXDEV))?;
        if rel.as_os_str().is_empty() {
            return fd.try_clone_to_owned();
        }
        open_beneath(fd, rel, DIR_FLAGS)
    }

    /// The held directory of the `i`-th starting path, and the name of the
    /// file in it when the starting path is a file.
    pub fn root(&self, i: usize) -> Option<(&Path, BorrowedFd<'_>, Option<&CStr>)> {
        self.roots.get(i).map(|(p, fd, f)| (p.as_path(), fd.as_fd(), f.as_deref()))
    }

    /// Why the run must stop, when the filesystem of the first starting
    /// path stopped during it ([`super::fs::stopped_writing`]: mounted
    /// read-only since, or shut down after an error): one message for the
    /// whole run, asked only after an `EIO` or `EROFS`. `None` while it
    /// works.
    pub fn stopped(&self) -> Option<String> {
        let (dir, fd, _) = self.root(0)?;
        let why = super::fs::stopped_writing(fd)?;
        Some(format!(
            "{}: the filesystem stopped during the run ({why}; see the kernel log): the run stops here, the work \
             done is kept and the next run carries on",
            display_path(dir)
        ))
    }

    /// After an `EIO` or `EROFS`: whether the filesystem stopped
    /// ([`Tree::stopped`]). If so the run stops as on a signal (`stop`), and
    /// the one caller that stops it is handed the message to say (`say`),
    /// instead of a warning for every file left.
    pub fn stop_if_stopped(&self, stop: &AtomicBool, say: impl FnOnce(&str)) -> bool {
        if stop.load(Ordering::Relaxed) {
            return true;
        }
        let Some(why) = self.stopped() else { return false };
        if !stop.swap(true, Ordering::Relaxed) {
            say(&why);
        }
        true
    }

    /// An unnamed temporary file (`O_TMPFILE`, 0600) in the [`Tree::scratch`]
    /// directory: on the scanned filesystem, never visible, gone on close.
    pub fn tmpfile(&self) -> io::Result<File> {
        let fd = self.scratch()?;
        let flags = OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC;
        Ok(File::from(rustix::fs::openat(fd, c".", flags, Mode::from_raw_mode(0o600))?))
    }

    /// The held directory unnamed temporary files are made in: the first
    /// starting directory the run may create a file in. Asked of the kernel
    /// with the effective ids and capabilities (`faccessat`, `AT_EACCESS`),
    /// once a run and without creating anything, so a dry run learns what
    /// the run will. Root without `CAP_DAC_OVERRIDE` (a sandbox that keeps
    /// only some capabilities) may create files only in directories it owns:
    /// a starting directory of another user cannot hold them, a later root
    /// one can. A read-only mount or snapshot answers `EROFS`. None at all:
    /// [`NoScratch`], naming the first directory and why.
    pub fn scratch(&self) -> io::Result<BorrowedFd<'_>> {
        let found = self.scratch.get_or_init(|| {
            let mut first = None;
            for (i, (dir, fd, _)) in self.roots.iter().enumerate() {
                match rustix::fs::accessat(fd, c".", Access::WRITE_OK | Access::EXEC_OK, AtFlags::EACCESS) {
                    Ok(()) => return Ok(i),
                    Err(e) => {
                        first.get_or_insert((dir, io::Error::from(e)));
                    }
                }
            }
            Err(match first {
                Some((dir, e)) if e.raw_os_error() == Some(libc::EACCES) && nix::unistd::geteuid().is_root() => {
                    format!(
                        "cannot make files in {}: {e} (root without CAP_DAC_OVERRIDE may create files only in \
                     directories it owns)",
                        display_path(dir)
                    )
                }
                Some((dir, e)) => format!("cannot make files in {}: {e}", display_path(dir)),
                None => "no starting directory to make files in".to_owned(),
            })
        });
        match found {
            Ok(i) => Ok(self.roots[*i].1.as_fd()),
            Err(why) => Err(io::Error::new(io::ErrorKind::PermissionDenied, NoScratch(why.clone()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A directory `t` with `t/a/f`, an `out/secret` beside it, and
    /// `t/link` → `../out` (a symlinked intermediate component).
    fn tree() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("t");
        std::fs::create_dir_all(t.join("a")).unwrap();
        std::fs::write(t.join("a/f"), b"x").unwrap();
        std::fs::create_dir(d.path().join("out")).unwrap();
        std::fs::write(d.path().join("out/secret"), b"s").unwrap();
        symlink("../out", t.join("link")).unwrap();
        symlink(d.path().join("out"), t.join("a/abs")).unwrap();
        symlink("f", t.join("a/flink")).unwrap();
        (d, t)
    }

    fn errno<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
        r.unwrap_err().raw_os_error().unwrap()
    }

    #[test]
    fn opens_files_below_the_held_directory() {
        let (_d, t) = tree();
        let tr = Tree::open(std::slice::from_ref(&t)).unwrap();
        assert!(tr.open_file(&t.join("a/f")).is_ok());
        let (_, root, _) = tr.root(0).unwrap();
        assert!(open_components(root, Path::new("a/f"), FILE_FLAGS, true).is_ok());
    }

    #[test]
    fn a_symlinked_intermediate_component_is_refused() {
        let (_d, t) = tree();
        let tr = Tree::open(std::slice::from_ref(&t)).unwrap();
        assert_eq!(errno(tr.open_file(&t.join("link/secret"))), libc::ELOOP);
        assert_eq!(errno(tr.open_file(&t.join("a/abs/secret"))), libc::ELOOP);
        assert_eq!(errno(tr.open_file(&t.join("a/flink"))), libc::ELOOP);
        let (_, root, _) = tr.root(0).unwrap();
        for rel in ["link/secret", "a/abs/secret", "a/flink"] {
            assert_eq!(errno(open_components(root, Path::new(rel), FILE_FLAGS, true)), libc::ELOOP, "{rel}");
        }
    }

    #[test]
    fn starting_paths_are_opened_without_following_symlinks() {
        let (d, t) = tree();
        let top = std::fs::canonicalize(d.path()).unwrap();
        assert!(Tree::open(&[top.join("t/a"), top.join("t/a/f")]).is_ok());
        // Resolved before a component became a symlink: refused, not followed.
        // (A symlink as the last directory of the path answers ENOTDIR to
        // O_DIRECTORY | O_NOFOLLOW.)
        for p in ["t/link", "t/link/secret", "t/a/abs/secret", "t/a/flink"] {
            let e = errno(Tree::open(&[top.join(p)]));
            assert!(e == libc::ELOOP || e == libc::ENOTDIR, "{p}: {e}");
        }
        assert_eq!(errno(Tree::open(&[t.join("nothing")])), libc::ENOENT);
    }

    #[test]
    fn paths_outside_or_with_dotdot_are_refused() {
        let (d, t) = tree();
        let tr = Tree::open(std::slice::from_ref(&t)).unwrap();
        assert_eq!(errno(tr.open_file(&d.path().join("out/secret"))), libc::EXDEV);
        let (_, root, _) = tr.root(0).unwrap();
        assert_eq!(errno(open_beneath(root, Path::new("../out/secret"), FILE_FLAGS)), libc::EXDEV);
        assert_eq!(errno(open_beneath(root, Path::new("/etc/passwd"), FILE_FLAGS)), libc::EXDEV);
    }

    #[test]
    fn directory_entries_are_opened_without_following() {
        let (_d, t) = tree();
        let tr = Tree::open(std::slice::from_ref(&t)).unwrap();
        let (_, root, _) = tr.root(0).unwrap();
        assert!(open_dir_at(root, c"a").is_ok());
        assert_eq!(errno(open_dir_at(root, c"link")), libc::ELOOP);
        let a = open_dir_at(root, c"a").unwrap();
        assert_eq!(errno(open_dir_at(a.as_fd(), c"f")), libc::ENOTDIR);
        use super::super::stat::has_entry_at;
        assert!(has_entry_at(a.as_fd(), c"abs") && !has_entry_at(a.as_fd(), c"nothing"));
        assert!(super::super::stat::stat_at(a.as_fd(), c"abs").is_ok());
    }

    #[test]
    fn a_mount_point_is_not_entered() {
        // /proc is a mount below /: the kernel refuses to cross into it.
        let root = rustix::fs::open("/", DIR_FLAGS, Mode::empty()).unwrap();
        assert_eq!(errno(open_dir_at(root.as_fd(), c"proc")), libc::EXDEV);
        assert_eq!(errno(open_beneath(root.as_fd(), Path::new("proc/self/status"), FILE_FLAGS)), libc::EXDEV);
        // The component walk refuses it the same way.
        let walked = open_components(root.as_fd(), Path::new("proc/sys/kernel/osrelease"), FILE_FLAGS, true);
        assert_eq!(errno(walked), libc::EXDEV);
        assert!(open_components(root.as_fd(), Path::new("proc/sys/kernel/osrelease"), FILE_FLAGS, false).is_ok());
    }

    #[test]
    fn a_path_longer_than_path_max_is_opened_one_name_at_a_time() {
        // A user may nest directories deeper than PATH_MAX (4096 bytes):
        // openat2 refuses the whole path (ENAMETOOLONG), the walk opens it.
        let (_t, dir) = tree();
        let mut rel = PathBuf::new();
        let mut at = rustix::fs::open(&dir, DIR_FLAGS, Mode::empty()).unwrap();
        for _ in 0..300 {
            rustix::fs::mkdirat(&at, "dddddddddddddddddd", Mode::from_raw_mode(0o755)).unwrap();
            at = rustix::fs::openat(&at, "dddddddddddddddddd", DIR_FLAGS, Mode::empty()).unwrap();
            rel.push("dddddddddddddddddd");
        }
        let f = rustix::fs::openat(&at, "deep", OFlags::WRONLY | OFlags::CREATE, Mode::from_raw_mode(0o644)).unwrap();
        rustix::io::write(&f, b"deep").unwrap();
        rel.push("deep");
        assert!(rel.as_os_str().len() > 4096);
        let held = rustix::fs::open(&dir, DIR_FLAGS, Mode::empty()).unwrap();
        let opened = open_file_beneath(held.as_fd(), &rel).unwrap();
        assert_eq!(std::io::read_to_string(opened).unwrap(), "deep");
        // So does the walk of kernels without openat2.
        assert!(open_components(held.as_fd(), &rel, FILE_FLAGS, true).is_ok());
        // A symlink on the way is still refused.
        rustix::fs::symlinkat("/etc", &at, "up").unwrap();
        let mut bad = rel.clone();
        bad.set_file_name("up");
        bad.push("passwd");
        assert_eq!(errno(open_file_beneath(held.as_fd(), &bad)), libc::ELOOP);
        // And a `..` that would climb out of the held directory.
        let mut up = rel.clone();
        up.set_file_name("..");
        up.push("..");
        assert_eq!(errno(open_file_beneath(held.as_fd(), &up)), libc::EXDEV);
    }
}
