//! btrfs quota groups: the room their limits leave a subvolume, which
//! `statfs` does not show (`--keep-free` counts it, `dedupe::headroom`).

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;

use nix::errno::Errno;

use super::fs::{fs_info, volume_key, FsKind};

/// The room the btrfs qgroup limits leave the subvolume of `fd`, and the
/// limit: `(room, limit)`, the tightest of the referenced and exclusive
/// limits set on its qgroup and on every qgroup above it (a write counts
/// against all of them: snapper's `1/0`, a group of subvolumes), read from
/// `/sys/fs/btrfs/<uuid>/qgroups/<level>_<id>/` (Linux 5.9 and later).
/// `None` without quotas, without a limit, or elsewhere. `statfs` does not
/// see them: a write past one fails with `EDQUOT` however much the volume
/// has free. The qgroups above are found in the quota tree, which needs
/// `CAP_SYS_ADMIN`; without it only the subvolume's own limit is read.
pub fn qgroup_room(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
    let info = fs_info(fd).ok().filter(|i| i.kind == FsKind::Btrfs)?;
    let qgroups = Path::new("/sys/fs/btrfs").join(&info.uuid).join("qgroups");
    if !qgroups.is_dir() {
        return None; // quotas are off: nothing to search
    }
    let mut todo = vec![volume_key(fd).ok()?];
    let mut seen = std::collections::BTreeSet::new();
    // Bounded: a hierarchy is a few levels deep; a cycle cannot loop.
    while let Some(q) = todo.pop().filter(|_| seen.len() < 64) {
        if seen.insert(q) {
            todo.extend(qgroup_parents(fd, q).unwrap_or_default());
        }
    }
    seen.into_iter()
        .filter_map(|q| {
            let dir = qgroups.join(format!("{}_{}", q >> 48, q & ((1 << 48) - 1)));
            qgroup_limit(|name| std::fs::read_to_string(dir.join(name)).ok()?.trim().parse().ok())
        })
        .min()
}

/// `struct btrfs_ioctl_search_key`.
#[repr(C)]
#[derive(Default)]
struct SearchKey {
    tree_id: u64,
    min_objectid: u64,
    max_objectid: u64,
    min_offset: u64,
    max_offset: u64,
    min_transid: u64,
    max_transid: u64,
    min_type: u32,
    max_type: u32,
    nr_items: u32,
    unused: [u32; 1],
    unused1: [u64; 4],
}

/// `struct btrfs_ioctl_search_args` (4 KiB): the key range, then the
/// items found, each a `btrfs_ioctl_search_header` and its data.
#[repr(C)]
struct SearchArgs {
    key: SearchKey,
    buf: [u8; 4096 - std::mem::size_of::<SearchKey>()],
}
nix::ioctl_readwrite!(
    /// `BTRFS_IOC_TREE_SEARCH`.
    ioctl_btrfs_tree_search, 0x94, 17, SearchArgs
);

/// `BTRFS_QUOTA_TREE_OBJECTID`.
const BTRFS_QUOTA_TREE_OBJECTID: u64 = 8;
/// `BTRFS_QGROUP_RELATION_KEY`: an item keyed `(member, this, group)` and
/// one keyed `(group, this, member)` for each membership.
const BTRFS_QGROUP_RELATION_KEY: u32 = 246;

/// The qgroups qgroup `id` is a direct member of (`level << 48 | id`).
fn qgroup_parents(fd: BorrowedFd<'_>, id: u64) -> Result<Vec<u64>, Errno> {
    let mut a = SearchArgs {
        key: SearchKey {
            tree_id: BTRFS_QUOTA_TREE_OBJECTID,
            min_objectid: id,
            max_objectid: id,
            max_offset: u64::MAX,
            max_transid: u64::MAX,
            min_type: BTRFS_QGROUP_RELATION_KEY,
            max_type: BTRFS_QGROUP_RELATION_KEY,
            nr_items: 4096,
            ..SearchKey::default()
        },
        buf: [0; 4096 - std::mem::size_of::<SearchKey>()],
    };
    // SAFETY: `a` is a valid, writable 4 KiB `btrfs_ioctl_search_args`.
    unsafe { ioctl_btrfs_tree_search(fd.as_raw_fd(), &mut a) }?;
    Ok(relation_parents(&a.buf, a.key.nr_items, id))
}

/// From the items a quota tree search found (`n` headers and their data in
/// `buf`), the groups `id` is a member of: relation items keyed by `id`
/// whose other end is of a higher level (the items keyed by a group name
/// its members). A buffer that ends early ends the list.
fn relation_parents(buf: &[u8], n: u32, id: u64) -> Vec<u64> {
    let u64_at = |p: usize| buf.get(p..p + 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap()));
    let u32_at = |p: usize| buf.get(p..p + 4).map(|b| u32::from_ne_bytes(b.try_into().unwrap()));
    let (mut out, mut pos) = (Vec::new(), 0);
    for _ in 0..n {
        // transid, objectid, offset (u64), type, len (u32).
        let (Some(obj), Some(other), Some(kind), Some(len)) =
            (u64_at(pos + 8), u64_at(pos + 16), u32_at(pos + 24), u32_at(pos + 28))
        else {
            break;
        };
        if kind == BTRFS_QGROUP_RELATION_KEY && obj == id && other >> 48 > id >> 48 {
            out.push(other);
        }
        pos += 32 + len as usize;
    }
    out
}

/// [`qgroup_room`] from the qgroup's sysfs values, `read` by name. The
/// kernel refuses a write when the use plus what is reserved for writes
/// in flight would pass the limit: both count.
fn qgroup_limit(read: impl Fn(&str) -> Option<u64>) -> Option<(u64, u64)> {
    let flags = read("limit_flags")?;
    let reserved: u64 = ["rsv_data", "rsv_meta_pertrans", "rsv_meta_prealloc"].iter().filter_map(|n| read(n)).sum();
    // BTRFS_QGROUP_LIMIT_MAX_RFER, BTRFS_QGROUP_LIMIT_MAX_EXCL.
    [(1, "max_referenced", "referenced"), (2, "max_exclusive", "exclusive")]
        .into_iter()
        .filter(|&(flag, _, _)| flags & flag != 0)
        .filter_map(|(_, max, used)| Some((read(max)?, read(used)?)))
        .filter(|&(max, _)| max > 0)
        .map(|(max, used)| (max.saturating_sub(used + reserved), max))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qgroup_limits_are_read_from_their_sysfs_values() {
        fn values<'a>(v: &'a [(&'a str, u64)]) -> impl Fn(&str) -> Option<u64> + 'a {
            move |name| v.iter().find(|(n, _)| *n == name).map(|&(_, x)| x)
        }
        // A referenced limit of 100 MiB, 10 MiB used.
        let rfer = [("limit_flags", 1), ("max_referenced", 100 << 20), ("referenced", 10 << 20), ("max_exclusive", 0)];
        assert_eq!(qgroup_limit(values(&rfer)), Some((90 << 20, 100 << 20)));
        // What is reserved for writes in flight counts as used.
        let rsv = [("limit_flags", 1), ("max_referenced", 100 << 20), ("referenced", 10 << 20), ("rsv_data", 4 << 20)];
        assert_eq!(qgroup_limit(values(&rsv)), Some((86 << 20, 100 << 20)));
        // Both: the tighter room wins.
        let both = [
            ("limit_flags", 3),
            ("max_referenced", 100 << 20),
            ("referenced", 10 << 20),
            ("max_exclusive", 50 << 20),
            ("exclusive", 45 << 20),
        ];
        assert_eq!(qgroup_limit(values(&both)), Some((5 << 20, 50 << 20)));
        // Over its limit already (a limit set below the use): no room.
        let over = [("limit_flags", 1), ("max_referenced", 10 << 20), ("referenced", 12 << 20)];
        assert_eq!(qgroup_limit(values(&over)), Some((0, 10 << 20)));
        // No limit, or no quotas.
        assert_eq!(qgroup_limit(values(&[("limit_flags", 0), ("max_referenced", 0)])), None);
        assert_eq!(qgroup_limit(values(&[])), None);
    }

    #[test]
    fn tree_search_request_code_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<SearchKey>(), 104);
        assert_eq!(std::mem::size_of::<SearchArgs>(), 4096);
        let code = nix::request_code_readwrite!(0x94, 17, std::mem::size_of::<SearchArgs>());
        assert_eq!(code as u64, 0xd000_9411);
    }

    #[test]
    fn the_groups_a_qgroup_is_a_member_of_are_read_from_its_relation_items() {
        fn item(obj: u64, kind: u32, offset: u64, data: &[u8]) -> Vec<u8> {
            let mut b = 7u64.to_ne_bytes().to_vec(); // transid
            b.extend(obj.to_ne_bytes());
            b.extend(offset.to_ne_bytes());
            b.extend(kind.to_ne_bytes());
            b.extend((data.len() as u32).to_ne_bytes());
            b.extend(data);
            b
        }
        let (sub, group, top) = (257, 1 << 48 | 100, 2 << 48 | 1);
        let mut buf = item(sub, BTRFS_QGROUP_RELATION_KEY, group, &[]);
        buf.extend(item(sub, 244, 0, &[1; 40])); // another kind, with data
        buf.extend(item(group, BTRFS_QGROUP_RELATION_KEY, sub, &[])); // group → member
        buf.extend(item(sub, BTRFS_QGROUP_RELATION_KEY, top, &[]));
        assert_eq!(relation_parents(&buf, 4, sub), vec![group, top]);
        // The group's own items name its member (lower) and nothing above.
        assert_eq!(relation_parents(&buf, 4, group), Vec::<u64>::new());
        // A count past the buffer ends at the buffer.
        assert_eq!(relation_parents(&buf[..40], 9, sub), vec![group]);
    }
}
