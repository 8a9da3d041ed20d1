//! Filesystems mounted under one UUID. A clone of a device (a `dd` copy,
//! an LVM snapshot, a copied VM image) carries its original's UUID, and
//! mounted beside it (XFS with `nouuid`; btrfs gives the later one a
//! temporary fsid, Linux 6.7 and later) the two are different filesystems
//! the UUID cannot tell apart. The device under each can: its stable name
//! ([`device_name`]) is what keeps their databases apart.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use super::fs::{fs_info, on_disk_fsid, FsInfo, FsKind};
use super::inode::open_path_readonly;
use super::mounts;

/// A stable name of the block device(s) under the filesystem of `fd`
/// (`info` its facts), the same across reboots where anything is: the
/// device-mapper UUID (LVM), a loop device's backing file, a disk's WWID
/// with the partition number, else the kernel's name (`sdb2`). A btrfs on
/// several devices is named by all of them. `None` where sysfs names none.
pub fn device_name(info: &FsInfo, fd: BorrowedFd<'_>) -> Option<String> {
    match info.kind {
        FsKind::Btrfs => btrfs_devices(&info.instance),
        FsKind::Xfs | FsKind::Other => {
            let st = rustix::fs::fstat(fd).ok()?;
            let (major, minor) = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
            block_name(&Path::new("/sys/dev/block").join(format!("{major}:{minor}")))
        }
    }
}

/// The names of the devices of the btrfs filesystem the kernel holds as
/// `fsid`, sorted, joined by commas.
fn btrfs_devices(fsid: &str) -> Option<String> {
    let dir = Path::new("/sys/fs/btrfs").join(fsid).join("devices");
    let mut names: Vec<String> = std::fs::read_dir(dir).ok()?.filter_map(|e| block_name(&e.ok()?.path())).collect();
    names.sort();
    (!names.is_empty()).then(|| names.join(","))
}

/// The stable name of the block device whose sysfs directory is `sys`.
fn block_name(sys: &Path) -> Option<String> {
    let sys = sys.canonicalize().ok()?;
    let read = |p: PathBuf| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty());
    if let Some(uuid) = read(sys.join("dm/uuid")) {
        return Some(format!("dm:{uuid}"));
    }
    if let Some(file) = read(sys.join("loop/backing_file")) {
        return Some(format!("loop:{file}"));
    }
    let wwid = |d: &Path| read(d.join("wwid")).or_else(|| read(d.join("device/wwid")));
    let found = match read(sys.join("partition")) {
        Some(n) => sys.parent().and_then(wwid).map(|w| format!("{w}-part{n}")),
        None => wwid(&sys),
    };
    match found {
        Some(w) => Some(format!("wwid:{w}")),
        None => Some(format!("dev:{}", sys.file_name()?.to_string_lossy())),
    }
}

/// The device names of the other mounted filesystems with the UUID of
/// `info` (the filesystem of `fd`): its clones, or its original.
pub fn twins(info: &FsInfo, fd: BorrowedFd<'_>) -> Vec<String> {
    match info.kind {
        FsKind::Btrfs => std::fs::read_dir("/sys/fs/btrfs")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|fsid| fsid.len() == 36 && *fsid != info.instance)
            .filter(|fsid| *fsid == info.uuid || on_disk_fsid(fsid).as_deref() == Some(info.uuid.as_str()))
            .filter_map(|fsid| btrfs_devices(&fsid))
            .collect(),
        FsKind::Xfs => {
            let Ok(own) = rustix::fs::fstat(fd) else { return Vec::new() };
            let own = (rustix::fs::major(own.st_dev), rustix::fs::minor(own.st_dev));
            mounts::mounted("xfs")
                .into_iter()
                .filter(|&(dev, _)| dev != own)
                .filter_map(|(dev, at)| xfs_twin(info, dev, &at))
                .collect()
        }
        FsKind::Other => Vec::new(),
    }
}

/// The device name of the XFS filesystem `dev` mounted at `at`, when it
/// has the UUID of `info`. Only its root is opened, for `fstat` and the
/// UUID; a mount point covered by another mount is passed over.
fn xfs_twin(info: &FsInfo, dev: (u32, u32), at: &Path) -> Option<String> {
    let f = open_path_readonly(at).ok()?;
    let st = rustix::fs::fstat(&f).ok()?;
    if (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev)) != dev {
        return None;
    }
    let other = fs_info(f.as_fd()).ok()?;
    (other.uuid == info.uuid).then(|| device_name(&other, f.as_fd()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop device is named by its backing file: check on whichever loop
    /// device this machine has set up, if any.
    #[test]
    fn loop_devices_are_named_by_their_backing_file() {
        for e in std::fs::read_dir("/sys/block").into_iter().flatten().flatten() {
            let backing = e.path().join("loop/backing_file");
            if let Ok(file) = std::fs::read_to_string(&backing) {
                assert_eq!(block_name(&e.path()), Some(format!("loop:{}", file.trim())));
            }
        }
    }

    /// A directory without any of the attributes falls back to its name.
    #[test]
    fn unknown_devices_fall_back_to_their_kernel_name() {
        let d = tempfile::tempdir().unwrap();
        let sda = d.path().join("sda7");
        std::fs::create_dir(&sda).unwrap();
        assert_eq!(block_name(&sda).as_deref(), Some("dev:sda7"));
        std::fs::write(sda.join("partition"), "7\n").unwrap();
        std::fs::write(d.path().join("wwid"), "naa.5000c500a1b2c3d4\n").unwrap();
        assert_eq!(block_name(&sda).as_deref(), Some("wwid:naa.5000c500a1b2c3d4-part7"));
    }
}
