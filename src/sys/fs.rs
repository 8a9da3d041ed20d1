//! Filesystem-wide facts: which filesystem a path is on, its UUID, free
//! space (for measuring what a run freed, and what the rewrites may use),
//! and `syncfs`. The mount table is in `mounts.rs`.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::statfs::{fstatfs, FsType};

const BTRFS_SUPER_MAGIC: i64 = 0x9123_683E;
const XFS_SUPER_MAGIC: i64 = 0x5846_5342;

/// The filesystems dedupscan knows how to share on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FsKind {
    /// btrfs: shares extents; frees an extent only when no file references any part of it.
    Btrfs,
    /// XFS: shares extents when made with `reflink=1`; counts references per block.
    Xfs,
    /// Anything else: scanning and reporting work, sharing is refused.
    Other,
}

impl FsKind {
    fn from_magic(t: FsType) -> Self {
        // `f_type` is a C long on every Linux target dedupscan builds for.
        #[allow(clippy::unnecessary_cast)]
        match t.0 as i64 {
            BTRFS_SUPER_MAGIC => FsKind::Btrfs,
            XFS_SUPER_MAGIC => FsKind::Xfs,
            _ => FsKind::Other,
        }
    }

    /// Name as shown to users.
    pub fn name(self) -> &'static str {
        match self {
            FsKind::Btrfs => "btrfs",
            FsKind::Xfs => "xfs",
            FsKind::Other => "other",
        }
    }
}

/// What `statfs` and `FS_IOC_GETFSUUID` say about the filesystem of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsInfo {
    /// Which filesystem, from the `f_type` magic.
    pub kind: FsKind,
    /// Raw `f_type` magic, for messages about unsupported filesystems.
    pub magic: i64,
    /// The filesystem's UUID as written on its device, lowercase hex with
    /// dashes (the statfs fsid where the filesystem reports none): the same
    /// on every mount, and the same on a clone of the device (`dd`, an LVM
    /// snapshot, a copied image). The database is named and checked by it.
    pub uuid: String,
    /// This mounted filesystem: btrfs's fsid as the kernel holds it (its
    /// `/sys/fs/btrfs/` directory; a clone mounted beside its original gets
    /// a temporary random one, Linux 6.7 and later), elsewhere the statfs
    /// fsid (from the device number). Tells a clone from its original
    /// while both are mounted, where [`FsInfo::uuid`] cannot.
    pub instance: String,
    /// Fundamental block size (`f_frsize`).
    pub block_size: u64,
    /// Free bytes (`f_bfree * f_frsize`): what a run's "freed" is measured on.
    pub free_bytes: u64,
    /// Size of the filesystem (`f_blocks * f_frsize`).
    pub total_bytes: u64,
}

/// `struct fsuuid2` from `<linux/fs.h>`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct FsUuid2 {
    len: u8,
    uuid: [u8; 16],
}
nix::ioctl_read!(
    /// `FS_IOC_GETFSUUID`.
    ioctl_getfsuuid, 0x15, 0, FsUuid2
);

/// `struct btrfs_ioctl_fs_info_args` (1 KiB); only the fsid is read.
#[repr(C)]
#[derive(Clone, Copy)]
struct BtrfsFsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    rest: [u8; 1024 - 32],
}
nix::ioctl_read!(
    /// `BTRFS_IOC_FS_INFO`.
    ioctl_btrfs_fs_info, 0x94, 31, BtrfsFsInfoArgs
);

/// The filesystem's own UUID and its instance (see [`FsInfo`]): btrfs
/// answers `BTRFS_IOC_FS_INFO` (its statfs fsid differs per subvolume),
/// others `FS_IOC_GETFSUUID`, whose instance is the statfs fsid.
fn fs_uuid(fd: BorrowedFd<'_>, kind: FsKind) -> Option<(String, Option<String>)> {
    if kind == FsKind::Btrfs {
        let mut a = BtrfsFsInfoArgs { max_id: 0, num_devices: 0, fsid: [0; 16], rest: [0; 1024 - 32] };
        // SAFETY: `a` is a valid, writable 1 KiB `btrfs_ioctl_fs_info_args`.
        if unsafe { ioctl_btrfs_fs_info(fd.as_raw_fd(), &mut a) }.is_ok() {
            let live = format_uuid(&a.fsid);
            return Some((on_disk_fsid(&live).unwrap_or_else(|| live.clone()), Some(live)));
        }
    }
    let mut raw = FsUuid2 { len: 0, uuid: [0; 16] };
    // SAFETY: `raw` is a valid, writable `struct fsuuid2`; the kernel writes
    // at most its 17 bytes.
    match unsafe { ioctl_getfsuuid(fd.as_raw_fd(), &mut raw) } {
        Ok(_) if raw.len as usize <= 16 && raw.len > 0 => Some((format_uuid(&raw.uuid[..raw.len as usize]), None)),
        _ => None,
    }
}

/// The fsid written on the devices of the btrfs filesystem the kernel
/// holds as `live`, when that is a temporary one: a single-device btrfs
/// mounted while another with the same fsid is (a clone of its device)
/// gets a random fsid for that mount (Linux 6.7 and later, `temp_fsid` in
/// sysfs), a new one each time; the one on disk stays in `metadata_uuid`.
/// Named by the random one, the database would be new after every mount.
pub(super) fn on_disk_fsid(live: &str) -> Option<String> {
    let dir = Path::new("/sys/fs/btrfs").join(live);
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok().map(|s| s.trim().to_owned());
    read("temp_fsid").filter(|t| t == "1")?;
    read("metadata_uuid").filter(|u| u.len() == 36)
}

/// Facts about the filesystem `fd` lives on.
pub fn fs_info(fd: BorrowedFd<'_>) -> Result<FsInfo, Errno> {
    let st = fstatfs(fd)?;
    let kind = FsKind::from_magic(st.filesystem_type());
    // SAFETY: fsid_t is two ints of plain data.
    let words: [i32; 2] = unsafe { std::mem::transmute(st.filesystem_id()) };
    let fsid = format!("fsid-{:08x}{:08x}", words[0] as u32, words[1] as u32);
    // Older kernels: the statfs fsid, stable for a filesystem.
    let (uuid, live) = fs_uuid(fd, kind).unwrap_or_else(|| (fsid.clone(), None));
    let instance = live.unwrap_or(fsid);
    let frsize = st.block_size() as u64;
    Ok(FsInfo {
        kind,
        magic: st.filesystem_type().0 as i64,
        uuid,
        instance,
        block_size: frsize,
        free_bytes: st.blocks_free() * frsize,
        total_bytes: st.blocks() * frsize,
    })
}

/// Bytes available to an unprivileged writer and the size of the
/// filesystem `fd` lives on (`statfs`: `f_bavail`, `f_blocks`).
pub fn space(fd: BorrowedFd<'_>) -> Result<(u64, u64), Errno> {
    let st = fstatfs(fd)?;
    let frsize = st.block_size() as u64;
    Ok((st.blocks_available() * frsize, st.blocks() * frsize))
}

fn format_uuid(b: &[u8]) -> String {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    if hex.len() == 32 {
        format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
    } else {
        hex
    }
}

/// Flush the whole filesystem of `fd`, so that space released by sharing is
/// visible to `statfs` (btrfs frees extents at transaction commit).
pub fn syncfs(fd: impl AsFd) -> Result<(), Errno> {
    nix::unistd::syncfs(fd.as_fd())
}

/// Flush the filesystem of `fd` twice, before `statfs` counts what was
/// freed: btrfs may release extents freed by the first commit's delayed
/// references only in the next one.
pub fn commit(fd: impl AsFd) -> Result<(), Errno> {
    for _ in 0..2 {
        syncfs(fd.as_fd())?;
    }
    Ok(())
}

/// Start writing back the dirty pages of `fd` without waiting for them
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`): many files' writes are then
/// in flight together instead of one after another when each is needed.
pub fn start_writeback(fd: impl AsFd) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on a valid descriptor; no memory is passed.
    let r = unsafe { libc::sync_file_range(fd.as_fd().as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    Errno::result(r).map(drop)
}

/// `struct btrfs_ioctl_ino_lookup_args` (4 KiB).
#[repr(C)]
pub(super) struct InoLookupArgs {
    pub treeid: u64,
    pub objectid: u64,
    pub name: [u8; 4080],
}
nix::ioctl_readwrite!(
    /// `BTRFS_IOC_INO_LOOKUP`.
    ioctl_btrfs_ino_lookup, 0x94, 18, InoLookupArgs
);

/// `BTRFS_FIRST_FREE_OBJECTID`: the inode number of a subvolume's root
/// directory.
const BTRFS_FIRST_FREE_OBJECTID: u64 = 256;

/// What identifies, across remounts, the part of a filesystem a file is
/// on: on btrfs the id of its subvolume (`BTRFS_IOC_INO_LOOKUP` with tree
/// id 0 answers the root id of the tree `fd` is in, without privileges);
/// on any other filesystem `0`, since the database is per filesystem and
/// the crawl never leaves it. Never `st_dev`: btrfs hands out a subvolume's
/// `st_dev` when the subvolume is first touched after mount, so it changes
/// with the order things are looked at, and a loop device's number changes
/// between boots.
pub fn volume_key(fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    if FsKind::from_magic(fstatfs(fd)?.filesystem_type()) != FsKind::Btrfs {
        return Ok(0);
    }
    let mut a = InoLookupArgs { treeid: 0, objectid: BTRFS_FIRST_FREE_OBJECTID, name: [0; 4080] };
    // SAFETY: `a` is a valid, writable 4 KiB `btrfs_ioctl_ino_lookup_args`.
    unsafe { ioctl_btrfs_ino_lookup(fd.as_raw_fd(), &mut a) }?;
    Ok(a.treeid)
}

/// The key given to files whose [`volume_key`] could not be read: their
/// `st_dev` with the top bit set, which no real key has, so such a file is
/// never mistaken for a known one (it is hashed again next time).
pub fn unproven_key(dev: u64) -> u64 {
    dev | 1 << 63
}

/// `st_dev` → [`volume_key`], asked once per `st_dev` per run: `st_dev` is
/// stable while a filesystem stays mounted, and a run is short. Each user
/// (the crawl's consumer, each share worker) keeps its own, so no lock.
#[derive(Debug, Default)]
pub struct SubvolIds {
    by_dev: std::collections::HashMap<u64, u64>,
}

impl SubvolIds {
    /// An empty cache.
    pub fn new() -> SubvolIds {
        SubvolIds::default()
    }

    /// The key of files with `st_dev` `dev`, asking `fd` (any file or
    /// directory with that `st_dev`, checked) when `dev` is new.
    /// Where the kernel does not answer: [`unproven_key`], not remembered.
    pub fn id_for(&mut self, dev: u64, fd: &impl AsFd) -> u64 {
        if let Some(&k) = self.by_dev.get(&dev) {
            return k;
        }
        let fd = fd.as_fd();
        let same_dev = nix::sys::stat::fstat(fd).is_ok_and(|st| st.st_dev == dev);
        match volume_key(fd) {
            Ok(k) if same_dev => {
                self.by_dev.insert(dev, k);
                k
            }
            _ => unproven_key(dev),
        }
    }

    /// The key [`SubvolIds::id_for`] gave files with `st_dev` `dev`,
    /// without asking the kernel: remembered, else [`unproven_key`] (what it
    /// gave when the kernel did not answer).
    pub fn given(&self, dev: u64) -> u64 {
        self.by_dev.get(&dev).copied().unwrap_or_else(|| unproven_key(dev))
    }

    /// [`SubvolIds::id_for`] for a file found by the crawl, asking its
    /// parent directory (same subvolume: a subvolume boundary is a
    /// directory), which `open_parent` opens only when `dev` is new.
    pub fn id_for_dir<F: AsFd>(&mut self, dev: u64, open_parent: impl FnOnce() -> std::io::Result<F>) -> u64 {
        if let Some(&k) = self.by_dev.get(&dev) {
            return k;
        }
        match open_parent() {
            Ok(dir) => self.id_for(dev, &dir),
            Err(_) => unproven_key(dev),
        }
    }
}

/// Open a directory for ioctls and `fstat`, never through a symlink.
pub fn open_dir(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// `struct btrfs_ioctl_logical_ino_args`.
#[repr(C)]
#[derive(Debug, Default)]
struct LogicalInoArgs {
    logical: u64,
    size: u64,
    reserved: [u64; 3],
    flags: u64,
    inodes: u64,
}
nix::ioctl_readwrite!(
    /// `BTRFS_IOC_LOGICAL_INO_V2`.
    ioctl_btrfs_logical_ino_v2, 0x94, 59, LogicalInoArgs
);

/// Return every reference to the extent, whatever offset in it `logical` is.
const BTRFS_LOGICAL_INO_ARGS_IGNORE_OFFSET: u64 = 1;

/// Who references a btrfs data extent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtentOwners {
    /// `(subvolume id, inode)` of every reference (one per file extent
    /// item, so a file may appear more than once).
    pub refs: Vec<(u64, u64)>,
    /// Where each reference's stretch begins in its file (the item's
    /// offset), in the order of `refs`.
    pub offsets: Vec<u64>,
    /// False when the answer did not fit: there are more owners.
    pub complete: bool,
    /// The bytes of room the answer lacked.
    pub missing: u32,
}

/// Every `(subvolume, inode)` referencing the data extent holding disk
/// address `logical` (a FIEMAP `fe_physical`), with
/// `BTRFS_IOC_LOGICAL_INO_V2` (needs CAP_SYS_ADMIN; a back-reference walk,
/// about what FIEMAP's SHARED flag costs). Read-only snapshots are
/// subvolumes like any other, so their references are listed too.
///
/// Asked with 64 KiB of room (2,730 references), and again with room for
/// all of them when that did not hold them, up to the kernel's 16 MiB
/// (699,050 references; more is answered incomplete): reflinked pieces of
/// one image, or clones written in place, hold one extent in thousands of
/// stretches, and an answer cut short would name no holder outside yet
/// keep every caller from freeing the extent.
pub fn extent_owners(fd: BorrowedFd<'_>, logical: u64) -> Result<ExtentOwners, Errno> {
    const MAX: u64 = 16 << 20;
    let first = logical_ino(fd, logical, 64 << 10)?;
    match first.missing {
        0 => Ok(first),
        missing => logical_ino(fd, logical, ((64 << 10) + u64::from(missing)).min(MAX) as usize),
    }
}

/// One `BTRFS_IOC_LOGICAL_INO_V2` call with `size` bytes of room.
fn logical_ino(fd: BorrowedFd<'_>, logical: u64, size: usize) -> Result<ExtentOwners, Errno> {
    let mut buf = vec![0u64; size.div_ceil(8)];
    let mut a = LogicalInoArgs {
        logical,
        size: (buf.len() * 8) as u64,
        flags: BTRFS_LOGICAL_INO_ARGS_IGNORE_OFFSET,
        inodes: buf.as_mut_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: `a` is a valid `btrfs_ioctl_logical_ino_args`; `inodes` points
    // at `buf`, `a.size` writable bytes, 8-byte aligned, which outlives the
    // call; the kernel writes at most `size` bytes there.
    unsafe { ioctl_btrfs_logical_ino_v2(fd.as_raw_fd(), &mut a) }?;
    // struct btrfs_data_container: bytes_left, bytes_missing, elem_cnt,
    // elem_missed (u32 each), then elem_cnt u64 values, three per reference
    // (inode, offset, root).
    let field = |i: usize| {
        let b = buf[i / 2].to_ne_bytes();
        u32::from_ne_bytes([b[i % 2 * 4], b[i % 2 * 4 + 1], b[i % 2 * 4 + 2], b[i % 2 * 4 + 3]])
    };
    let (bytes_missing, elem_cnt, elem_missed) = (field(1), field(2) as usize, field(3));
    let vals = &buf[2..(2 + elem_cnt).min(buf.len())];
    Ok(ExtentOwners {
        refs: vals.chunks_exact(3).map(|v| (v[2], v[0])).collect(),
        offsets: vals.chunks_exact(3).map(|v| v[1]).collect(),
        complete: elem_missed == 0 && bytes_missing == 0,
        missing: bytes_missing,
    })
}

/// Whether `path` lies on a read-only mount (`statvfs`'s `ST_RDONLY`;
/// false where it cannot be read: the run then finds out request by
/// request).
pub fn mounted_read_only(path: &Path) -> bool {
    rustix::fs::statvfs(path).is_ok_and(|v| v.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY))
}

/// Why the filesystem of the held descriptor `fd` (a starting directory)
/// takes no more writes, or `None` while it does: mounted read-only since
/// (remounted, or btrfs forced itself read-only after an error: `statvfs`'s
/// `ST_RDONLY` counts the superblock's flag too), or shut down (XFS after
/// an error answers `EIO` to every call on its files, `fstat` included).
pub fn stopped_writing(fd: BorrowedFd<'_>) -> Option<String> {
    let said = |e: rustix::io::Errno| Errno::from_raw(e.raw_os_error()).desc();
    if let Err(e) = rustix::fs::fstat(fd) {
        return Some(format!("shut down after an error: it answers \"{}\"", said(e)));
    }
    match rustix::fs::fstatvfs(fd) {
        Ok(v) if v.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY) => {
            Some("mounted read-only now: remounted, or btrfs stopped writing after an error".to_owned())
        }
        Ok(_) => None,
        Err(e) => Some(format!("it answers \"{}\"", said(e))),
    }
}

/// Convenience for callers holding a path: open it (directory or file,
/// read-only, never following a symlink at the end) and read [`fs_info`].
pub fn fs_info_of_path(path: &Path) -> std::io::Result<FsInfo> {
    let f = super::inode::open_path_readonly(path)?;
    fs_info(f.as_fd()).map_err(std::io::Error::from)
}

/// `struct xfs_fsop_geom_v1` from `<xfs/xfs_fs.h>` (112 bytes): the oldest
/// geometry ioctl, answered by every XFS kernel. Only `flags` is read.
#[repr(C)]
#[derive(Clone, Copy)]
struct XfsFsopGeomV1 {
    sizes: [u32; 8],
    blocks: [u64; 4],
    uuid: [u8; 16],
    sunit: u32,
    swidth: u32,
    version: i32,
    flags: u32,
    logsectsize: u32,
    rtsectsize: u32,
    dirblocksize: u32,
}
const _: () = assert!(std::mem::size_of::<XfsFsopGeomV1>() == 112);
nix::ioctl_read!(
    /// `XFS_IOC_FSGEOMETRY_V1`.
    ioctl_xfs_fsgeometry_v1, b'X', 100, XfsFsopGeomV1
);
/// `XFS_FSOP_GEOM_FLAGS_REFLINK`: the filesystem can share extents.
const XFS_GEOM_FLAGS_REFLINK: u32 = 1 << 20;

/// Whether the XFS filesystem of `path` was made with `reflink=1` (without
/// it the kernel refuses FIDEDUPERANGE). `None` when it cannot be asked.
pub fn xfs_has_reflink(path: &Path) -> Option<bool> {
    let f = super::inode::open_path_readonly(path).ok()?;
    // SAFETY: all-zero is a valid value of this plain-data struct.
    let mut g: XfsFsopGeomV1 = unsafe { std::mem::zeroed() };
    // SAFETY: `g` is a valid, writable `struct xfs_fsop_geom_v1`; the
    // kernel writes at most its size, which the ioctl number encodes.
    unsafe { ioctl_xfs_fsgeometry_v1(f.as_fd().as_raw_fd(), &mut g) }.ok()?;
    Some(g.flags & XFS_GEOM_FLAGS_REFLINK != 0)
}

/// Write `contents` to `path` whole, with permissions `mode` whatever the
/// umask: into a new temporary file next to it (`O_CREAT | O_EXCL`, so
/// nothing already there, a symlink planted by another user included, is
/// opened), flushed to disk, then renamed over `path` (a rename replaces a
/// symlink itself, never what it points to). Readers see the old file or
/// the new one, never half of it.
pub fn write_replacing(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path has no file name"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(contents)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        // Make the rename itself durable; failing to is not worth an error.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ino_lookup_request_code_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<InoLookupArgs>(), 4096);
        let code = nix::request_code_readwrite!(0x94, 18, std::mem::size_of::<InoLookupArgs>());
        assert_eq!(code as u64, 0xd000_9412);
    }

    #[test]
    fn keys_off_btrfs_are_zero_and_cached_per_dev() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let dev = std::fs::metadata(d.path()).unwrap().dev();
        let mut ids = SubvolIds::new();
        let k = ids.id_for_dir(dev, || open_dir(d.path()));
        if fs_info_of_path(d.path()).unwrap().kind != FsKind::Btrfs {
            assert_eq!(k, 0);
        }
        // A wrong dev is never believed.
        assert_eq!(ids.id_for_dir(dev ^ 1, || open_dir(d.path())), unproven_key(dev ^ 1));
        assert_eq!(ids.id_for(dev, &std::fs::File::open(d.path()).unwrap()), k);
    }

    #[test]
    fn logical_ino_request_code_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<LogicalInoArgs>(), 56);
        let code = nix::request_code_readwrite!(0x94, 59, std::mem::size_of::<LogicalInoArgs>());
        assert_eq!(code as u64, 0xc038_943b);
    }

    #[test]
    fn uuid_is_formatted_with_dashes() {
        let b: Vec<u8> = (0u8..16).collect();
        assert_eq!(format_uuid(&b), "00010203-0405-0607-0809-0a0b0c0d0e0f");
    }
}
