//! btrfs: an inode known only by its subvolume id and inode number (as
//! `BTRFS_IOC_LOGICAL_INO_V2` names the holders of an extent) — whether it
//! is still as it was ([`stamp`]), and its name, for messages. Both need
//! `CAP_SYS_ADMIN`.

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

use super::btrfs_tree;
use super::fs::{ioctl_btrfs_ino_lookup, InoLookupArgs};

/// `BTRFS_FS_TREE_OBJECTID`: the top-level subvolume.
const FS_TREE: u64 = 5;
/// The root tree (`BTRFS_ROOT_TREE_OBJECTID`).
const ROOT_TREE: u64 = 1;
/// `BTRFS_ROOT_BACKREF_KEY`: a subvolume's entry in its parent.
const ROOT_BACKREF_KEY: u32 = 144;
/// Subvolumes nested deeper than this are not named (a loop guard).
const MAX_DEPTH: usize = 64;

/// The path of inode `ino` within subvolume `root` (`BTRFS_IOC_INO_LOOKUP`,
/// on any file of the volume `fd` is on): its first name, without the
/// kernel's trailing `/`. `Ok(None)`: it has none (deleted, or its
/// subvolume is).
fn in_subvolume(fd: BorrowedFd<'_>, root: u64, ino: u64) -> Result<Option<Vec<u8>>, Errno> {
    let mut a = InoLookupArgs { treeid: root, objectid: ino, name: [0; 4080] };
    // SAFETY: `a` is a valid, writable 4 KiB `btrfs_ioctl_ino_lookup_args`.
    match unsafe { ioctl_btrfs_ino_lookup(fd.as_raw_fd(), &mut a) } {
        Ok(_) => {
            let len = a.name.iter().position(|&b| b == 0).unwrap_or(a.name.len());
            Ok(Some(a.name[..len].strip_suffix(b"/").unwrap_or(&a.name[..len]).to_vec()))
        }
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `BTRFS_INODE_ITEM_KEY`.
const INODE_ITEM_KEY: u32 = 1;

/// What tells an inode's state apart from a later one, or from an inode
/// that took its number later: the transaction that made it
/// (`generation`) and its change time, which every write, truncation,
/// `setxattr` or link count change moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// `btrfs_inode_item.generation`.
    pub generation: u64,
    /// `btrfs_inode_item.ctime`, in nanoseconds.
    pub ctime_ns: i64,
}

/// The [`Stamp`] of inode `ino` of subvolume `root`, on the volume `fd` is
/// on, from its inode item (`BTRFS_IOC_TREE_SEARCH`). `Ok(None)`: there is
/// none (the inode is deleted, and no longer open); a deleted subvolume
/// answers `ENOENT`.
pub fn stamp(fd: BorrowedFd<'_>, root: u64, ino: u64) -> Result<Option<Stamp>, Errno> {
    let items = btrfs_tree::search(fd, root, ino, INODE_ITEM_KEY, 0..=0)?;
    Ok(items.first().and_then(|i| inode_stamp(&i.data)))
}

/// The [`Stamp`] in `struct btrfs_inode_item`'s bytes (little-endian:
/// `generation` first, `ctime`'s seconds at 124 and nanoseconds at 132).
fn inode_stamp(item: &[u8]) -> Option<Stamp> {
    let u64_at = |p: usize| item.get(p..p + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    let nsec = item.get(132..136).map(|b| u32::from_le_bytes(b.try_into().unwrap()))?;
    let secs = i64::try_from(u64_at(124)?).ok()?;
    Some(Stamp { generation: u64_at(0)?, ctime_ns: secs.checked_mul(1_000_000_000)?.checked_add(nsec.into())? })
}

/// The path of subvolume `root` from the top-level subvolume, from the
/// entries each subvolume has in its parent (`ROOT_BACKREF` items).
fn subvolume(fd: BorrowedFd<'_>, mut root: u64) -> Option<Vec<u8>> {
    let mut parts: Vec<Vec<u8>> = Vec::new();
    for _ in 0..MAX_DEPTH {
        if root == FS_TREE {
            parts.reverse();
            return Some(parts.join(&b'/'));
        }
        let item = btrfs_tree::search(fd, ROOT_TREE, root, ROOT_BACKREF_KEY, 0..=u64::MAX).ok()?.into_iter().next()?;
        // `struct btrfs_root_ref`: dirid, sequence (`u64`), name_len (`u16`), name.
        let dirid = u64::from_le_bytes(item.data.get(0..8)?.try_into().ok()?);
        let len = u16::from_le_bytes(item.data.get(16..18)?.try_into().ok()?) as usize;
        parts.push(item.data.get(18..18 + len)?.to_vec());
        let dir = in_subvolume(fd, item.offset, dirid).ok()??;
        if !dir.is_empty() {
            parts.push(dir);
        }
        root = item.offset;
    }
    None
}

/// The path of inode `ino` of subvolume `root` from the volume's top
/// level (what `btrfs subvolume list` and `btrfs inspect-internal` show),
/// for a message; `None` if it cannot be told.
pub fn path_of(fd: BorrowedFd<'_>, root: u64, ino: u64) -> Option<Vec<u8>> {
    let sub = subvolume(fd, root)?;
    let file = in_subvolume(fd, root, ino).ok()??;
    Some(if sub.is_empty() { file } else { [sub, file].join(&b'/') })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inode_items_generation_and_change_time() {
        let mut item = vec![0u8; 160];
        item[0..8].copy_from_slice(&7u64.to_le_bytes());
        item[8..16].copy_from_slice(&99u64.to_le_bytes()); // transid: not part of it
        item[124..132].copy_from_slice(&1_700_000_000u64.to_le_bytes());
        item[132..136].copy_from_slice(&5u32.to_le_bytes());
        item[136..144].copy_from_slice(&1u64.to_le_bytes()); // mtime: not part of it
        let want = Stamp { generation: 7, ctime_ns: 1_700_000_000_000_000_005 };
        assert_eq!(inode_stamp(&item), Some(want));
        assert_eq!(inode_stamp(&item[..135]), None, "cut short");
    }
}
