//! Opening files safely and reading the inode flags and extended attributes
//! that decide whether a file may be shared.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;

use super::FsKind;

/// Open a volume file for reading only: never for writing, never through a
/// symlink in the last component, never blocking on a FIFO that appeared
/// since the `lstat`, and without updating its access time where the kernel
/// allows it (owner or CAP_FOWNER).
pub fn open_readonly(path: &Path) -> std::io::Result<File> {
    let base = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    let open = |flags| std::fs::OpenOptions::new().read(true).custom_flags(flags).open(path);
    match open(base | libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(base),
        other => other,
    }
}

/// Open a directory or file read-only for `fstatfs`/ioctls on it.
pub fn open_path_readonly(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// Inode flags that make sharing impossible or unwise.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct InodeFlags {
    /// `chattr +i` (immutable): left alone, the file may not change.
    pub immutable: bool,
    /// `chattr +a` (append only): left alone, only appends are allowed.
    pub append_only: bool,
    /// btrfs `chattr +C` (nodatacow): cannot share extents.
    pub nocow: bool,
    /// DAX (direct access) files bypass the page cache; XFS refuses reflink.
    pub dax: bool,
    /// XFS realtime files cannot be reflinked.
    pub realtime: bool,
}

const FS_IMMUTABLE_FL: i32 = 0x0000_0010;
const FS_APPEND_FL: i32 = 0x0000_0020;
const FS_NOCOW_FL: i32 = 0x0080_0000;
const FS_DAX_FL: i32 = 0x0200_0000;
const FS_XFLAG_REALTIME: u32 = 0x0000_0001;
const FS_XFLAG_IMMUTABLE: u32 = 0x0000_0008;
const FS_XFLAG_APPEND: u32 = 0x0000_0010;
const FS_XFLAG_DAX: u32 = 0x0000_8000;

// FS_IOC_GETFLAGS is declared with `long` but the kernel reads and writes an
// int; the request code is the one for 64-bit `long`.
nix::ioctl_read_bad!(
    /// `FS_IOC_GETFLAGS`.
    ioctl_getflags, 0x8008_6601, libc::c_int
);

nix::ioctl_write_ptr_bad!(
    /// `FS_IOC_SETFLAGS` (an int, like `FS_IOC_GETFLAGS`).
    ioctl_setflags, 0x4008_6602, libc::c_int
);

/// Set (or clear) `NOCOW` on `fd`, its other flags kept. On btrfs, on an
/// empty file, it also drops (or gives back) the file's data checksums
/// (see `sys::btrfs_tree::match_checksums`).
pub fn set_nocow(fd: BorrowedFd<'_>, on: bool) -> Result<(), Errno> {
    let mut fl: libc::c_int = 0;
    // SAFETY: `fl` is a valid int the kernel writes the flags into.
    unsafe { ioctl_getflags(fd.as_raw_fd(), &mut fl) }?;
    let fl = if on { fl | FS_NOCOW_FL } else { fl & !FS_NOCOW_FL };
    // SAFETY: the kernel reads one int from `&fl`.
    unsafe { ioctl_setflags(fd.as_raw_fd(), &fl) }?;
    Ok(())
}

/// `struct fsxattr` from `<linux/fs.h>`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct FsXattr {
    fsx_xflags: u32,
    fsx_extsize: u32,
    fsx_nextents: u32,
    fsx_projid: u32,
    fsx_cowextsize: u32,
    fsx_pad: [u8; 8],
}
nix::ioctl_read!(
    /// `FS_IOC_FSGETXATTR`.
    ioctl_fsgetxattr, b'X', 31, FsXattr
);

/// Read the flags of an open file on a filesystem of kind `fs`, with one
/// ioctl where one says all that applies (this runs for every file hashed):
/// on btrfs `FS_IOC_GETFLAGS` (there is no realtime or DAX there), on XFS
/// `FS_IOC_FSGETXATTR` (there is no NOCOW there); elsewhere both.
/// Filesystems without these ioctls report no flags.
pub fn inode_flags(fd: BorrowedFd<'_>, fs: FsKind) -> Result<InodeFlags, Errno> {
    let mut fl: libc::c_int = 0;
    if fs != FsKind::Xfs {
        // SAFETY: `fl` is a valid int the kernel writes the flags into.
        match unsafe { ioctl_getflags(fd.as_raw_fd(), &mut fl) } {
            Ok(_) => {}
            Err(Errno::ENOTTY) | Err(Errno::EOPNOTSUPP) | Err(Errno::EINVAL) => fl = 0,
            Err(e) => return Err(e),
        }
    }
    let mut xflags = 0;
    if fs != FsKind::Btrfs {
        let mut x = FsXattr::default();
        // SAFETY: `x` is a valid, writable `struct fsxattr`.
        if unsafe { ioctl_fsgetxattr(fd.as_raw_fd(), &mut x) }.is_ok() {
            xflags = x.fsx_xflags;
        }
    }
    Ok(InodeFlags {
        immutable: fl & FS_IMMUTABLE_FL != 0 || xflags & FS_XFLAG_IMMUTABLE != 0,
        append_only: fl & FS_APPEND_FL != 0 || xflags & FS_XFLAG_APPEND != 0,
        nocow: fl & FS_NOCOW_FL != 0,
        dax: fl & FS_DAX_FL != 0 || xflags & FS_XFLAG_DAX != 0,
        realtime: xflags & FS_XFLAG_REALTIME != 0,
    })
}

nix::ioctl_read!(
    /// `BTRFS_IOC_SUBVOL_GETFLAGS`.
    ioctl_btrfs_subvol_getflags, 0x94, 25, u64
);
const BTRFS_SUBVOL_RDONLY: u64 = 1 << 1;

/// Whether `dir` is the root of a read-only btrfs subvolume (a read-only
/// snapshot). Not btrfs, or not a subvolume root: `false`.
pub fn is_readonly_subvolume(dir: &Path) -> bool {
    let Ok(f) = open_path_readonly(dir) else { return false };
    use std::os::fd::AsFd;
    is_readonly_subvolume_fd(f.as_fd())
}

/// [`is_readonly_subvolume`] of an open directory (the crawl asks on the
/// descriptor it then lists).
pub fn is_readonly_subvolume_fd(dir: BorrowedFd<'_>) -> bool {
    let mut flags: u64 = 0;
    // SAFETY: `flags` is a valid u64 the kernel writes the subvolume flags into.
    match unsafe { ioctl_btrfs_subvol_getflags(dir.as_raw_fd(), &mut flags) } {
        Ok(_) => flags & BTRFS_SUBVOL_RDONLY != 0,
        Err(_) => false,
    }
}

/// `struct btrfs_ioctl_get_subvol_info_args` from `<linux/btrfs.h>` (504
/// bytes); only `flags` is read.
#[repr(C)]
struct SubvolInfo {
    treeid: u64,
    name: [u8; 256],
    parent_id: u64,
    dirid: u64,
    generation: u64,
    flags: u64,
    uuid: [u8; 16],
    parent_uuid: [u8; 16],
    received_uuid: [u8; 16],
    transids: [u64; 4],
    /// Four `struct btrfs_ioctl_timespec` (`u64` seconds, `u32`
    /// nanoseconds, padded to 16 bytes each).
    times: [u64; 8],
    reserved: [u64; 8],
}
nix::ioctl_read!(
    /// `BTRFS_IOC_GET_SUBVOL_INFO` (Linux 4.18): no privilege needed.
    ioctl_btrfs_get_subvol_info, 0x94, 60, SubvolInfo
);
/// `BTRFS_ROOT_SUBVOL_RDONLY`: the root item's flag, as
/// `BTRFS_IOC_GET_SUBVOL_INFO` reports it (not [`BTRFS_SUBVOL_RDONLY`]).
const BTRFS_ROOT_SUBVOL_RDONLY: u64 = 1;

/// Whether the btrfs subvolume holding `fd` (any file or directory in it,
/// not only its root) is read-only: a starting path deep inside a read-only
/// snapshot is inside it as much as its root is. Not btrfs, or a kernel
/// without the ioctl: `false`.
pub fn in_readonly_subvolume(fd: BorrowedFd<'_>) -> bool {
    let mut info = std::mem::MaybeUninit::<SubvolInfo>::zeroed();
    // SAFETY: `info` is a zeroed, writable `struct
    // btrfs_ioctl_get_subvol_info_args` of the size the request code names;
    // the kernel fills it in.
    match unsafe { ioctl_btrfs_get_subvol_info(fd.as_raw_fd(), info.as_mut_ptr()) } {
        // SAFETY: every field is plain integers, valid when zeroed, and the
        // kernel wrote the rest.
        Ok(_) => unsafe { info.assume_init() }.flags & BTRFS_ROOT_SUBVOL_RDONLY != 0,
        Err(_) => false,
    }
}

/// Whether `path` (not followed if a symlink) carries the extended attribute
/// `name`. No such attribute, no xattr support or no such path: `false`.
/// Asked of protection markers, so any other failure (an I/O error, no
/// permission) answers `true`: the path is left alone.
pub fn has_xattr(path: &Path, name: &str) -> bool {
    let (Ok(p), Ok(n)) = (CString::new(path.as_os_str().as_bytes()), CString::new(name)) else {
        return false;
    };
    // SAFETY: both pointers are valid NUL-terminated strings; a null buffer
    // with size 0 asks only for the value's length.
    let r = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
    r >= 0
        || !matches!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ENODATA | libc::ENOTSUP | libc::ENOENT | libc::ENOTDIR)
        )
}

/// The kernel's coarse wall clock (`CLOCK_REALTIME_COARSE`), in nanoseconds
/// since the epoch: the clock that stamps inode times, advanced once per
/// tick (1–10 ms).
pub fn coarse_clock_ns() -> i128 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid, writable `timespec`; the clock id is constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut t) };
    if rc != 0 {
        return 0;
    }
    i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_codes_match_the_kernel() {
        let x = nix::request_code_read!(b'X', 31, std::mem::size_of::<FsXattr>());
        assert_eq!(x as u64, 0x801c_581f);
        assert_eq!(std::mem::size_of::<FsXattr>(), 28);
    }

    #[test]
    fn subvol_info_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<SubvolInfo>(), 504);
        assert_eq!(std::mem::offset_of!(SubvolInfo, flags), 288);
        let code = nix::request_code_read!(0x94, 60, std::mem::size_of::<SubvolInfo>());
        assert_eq!(code as u64, 0x81f8_943c);
        // Not btrfs (or not read-only): false, never an error.
        let d = tempfile::tempdir().unwrap();
        let f = std::fs::File::open(d.path()).unwrap();
        use std::os::fd::AsFd;
        assert!(!in_readonly_subvolume(f.as_fd()));
    }

    #[test]
    fn open_readonly_refuses_symlinks() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"x").unwrap();
        std::os::unix::fs::symlink(d.path().join("f"), d.path().join("l")).unwrap();
        assert!(open_readonly(&d.path().join("f")).is_ok());
        let e = open_readonly(&d.path().join("l")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
    }

    #[test]
    fn plain_file_has_no_flags_and_no_nodedup() {
        let f = tempfile::NamedTempFile::new().unwrap();
        use std::os::fd::AsFd;
        let fl = inode_flags(f.as_file().as_fd(), FsKind::Other).unwrap();
        assert!(!fl.immutable && !fl.append_only);
        assert!(!has_xattr(f.path(), "user.nodedup"));
    }

    /// A marker attribute that cannot be read counts as present: only "no
    /// such attribute", no xattr support or no such path say it is not.
    #[test]
    fn a_marker_attribute_that_cannot_be_read_counts_as_present() {
        let d = tempfile::tempdir().unwrap();
        assert!(!has_xattr(&d.path().join("nothing"), "user.nodedup"));
        assert!(has_xattr(&d.path().join("x".repeat(300)), "user.nodedup"));
        // getxattr on an O_PATH descriptor fails with EBADF.
        let opath = rustix::fs::open(d.path(), rustix::fs::OFlags::PATH, rustix::fs::Mode::empty()).unwrap();
        assert!(super::super::beneath::has_xattr_fd(std::os::fd::AsFd::as_fd(&opath), "user.nodedup"));
        let dir = std::fs::File::open(d.path()).unwrap();
        assert!(!super::super::beneath::has_xattr_fd(std::os::fd::AsFd::as_fd(&dir), "user.nodedup"));
    }
}
