//! `stat` of names and descriptors for the crawl and the policy: the
//! entry itself, never what a symlink points to, and never a question to
//! another filesystem mounted on a name ([`stat_at`]).

use std::ffi::CStr;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

use rustix::fs::{AtFlags, Stat};

/// How a name is stat'ed: the entry itself, no automount, nothing asked of
/// a filesystem mounted on it (see [`stat_at`]).
const NAME_FLAGS: AtFlags = AtFlags::SYMLINK_NOFOLLOW.union(AtFlags::NO_AUTOMOUNT).union(AtFlags::STATX_DONT_SYNC);

/// The entry `name` of `dir` itself: never what a symlink points to, no
/// automount triggered, and never a question to the server of another
/// filesystem mounted on the name.
///
/// A stat of a name follows a mount on it, and an unprivileged user can
/// mount FUSE on a regular file they own (`fusermount3`; root reaches it
/// with `allow_other`). A server that never answers then held the crawl's
/// `fstatat` forever: the nightly run hung, its lock held, killable only
/// by `SIGKILL`. `statx` with `AT_STATX_DONT_SYNC` takes what the kernel
/// has cached (FUSE and NFS honour it; btrfs and XFS always answer from
/// memory), and the caller sees another `st_dev` and leaves the name out.
pub fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Stat> {
    use rustix::fs::StatxFlags;
    match rustix::fs::statx(dir, name, NAME_FLAGS, StatxFlags::BASIC_STATS) {
        Ok(x) => Ok(stat_of(&x)),
        // Before Linux 4.11.
        Err(rustix::io::Errno::NOSYS) => Ok(rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?),
        Err(e) => Err(e.into()),
    }
}

/// The `struct stat` of a `statx` answer (the fields of `BASIC_STATS`).
fn stat_of(x: &rustix::fs::Statx) -> Stat {
    // SAFETY: `Stat` is integers and padding only: all zeros is a value.
    let mut st: Stat = unsafe { std::mem::zeroed() };
    st.st_dev = rustix::fs::makedev(x.stx_dev_major, x.stx_dev_minor) as _;
    st.st_ino = x.stx_ino as _;
    st.st_nlink = x.stx_nlink as _;
    st.st_mode = x.stx_mode as _;
    st.st_uid = x.stx_uid as _;
    st.st_gid = x.stx_gid as _;
    st.st_rdev = rustix::fs::makedev(x.stx_rdev_major, x.stx_rdev_minor) as _;
    st.st_size = x.stx_size as _;
    st.st_blksize = x.stx_blksize as _;
    st.st_blocks = x.stx_blocks as _;
    st.st_atime = x.stx_atime.tv_sec as _;
    st.st_atime_nsec = x.stx_atime.tv_nsec as _;
    st.st_mtime = x.stx_mtime.tv_sec as _;
    st.st_mtime_nsec = x.stx_mtime.tv_nsec as _;
    st.st_ctime = x.stx_ctime.tv_sec as _;
    st.st_ctime_nsec = x.stx_ctime.tv_nsec as _;
    st
}

/// `fstat` of an open descriptor.
pub fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    Ok(rustix::fs::fstat(fd)?)
}

/// Whether the directory `dir` holds an entry `name` of any type (not
/// followed if a symlink). Asked of protection markers, so it fails
/// closed: only "no such entry" answers `false`; a lookup failing for
/// another reason (an I/O error, no memory) answers `true`, and the
/// directory is left alone rather than shared past a marker not seen.
pub fn has_entry_at(dir: BorrowedFd<'_>, name: &CStr) -> bool {
    !matches!(stat_at(dir, name), Err(e) if e.raw_os_error() == Some(libc::ENOENT))
}

/// Whether `path` names an entry of any type (not followed if a symlink,
/// and, like [`stat_at`], never asking a filesystem mounted on it).
pub fn has_entry(path: &Path) -> bool {
    use rustix::fs::{StatxFlags, CWD};
    match rustix::fs::statx(CWD, path, NAME_FLAGS, StatxFlags::empty()) {
        Ok(_) => true,
        Err(rustix::io::Errno::NOSYS) => path.symlink_metadata().is_ok(),
        // Fails closed, as `has_entry_at` does.
        Err(e) => !matches!(e, rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR),
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    /// A protection marker that cannot be looked up counts as present:
    /// only "no such entry" says it is not there.
    #[test]
    fn a_marker_that_cannot_be_looked_up_counts_as_present() {
        let d = tempfile::tempdir().unwrap();
        let dir = std::fs::File::open(d.path()).unwrap();
        assert!(!has_entry_at(dir.as_fd(), c"nothing"));
        assert!(!has_entry(&d.path().join("nothing")));
        std::fs::write(d.path().join("m"), b"").unwrap();
        assert!(has_entry_at(dir.as_fd(), c"m") && has_entry(&d.path().join("m")));
        // A name past NAME_MAX fails with ENAMETOOLONG, not ENOENT.
        let long = std::ffi::CString::new("x".repeat(300)).unwrap();
        assert!(has_entry_at(dir.as_fd(), &long));
        assert!(has_entry(&d.path().join("x".repeat(300))));
        // A file where a directory should be is "not there" (ENOTDIR).
        assert!(!has_entry(&d.path().join("m/.nodedup")));
    }
}
