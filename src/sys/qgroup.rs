//! btrfs quota groups: the room their limits leave a subvolume, which
//! `statfs` does not show (`--keep-free` counts it, `dedupe::headroom`).

use std::os::fd::BorrowedFd;
use std::path::Path;

use nix::errno::Errno;

use super::btrfs_tree::Item;
use super::fs::{fs_info, volume_key, FsKind};

/// The room the btrfs qgroup limits leave the subvolume of `fd`, and the
/// limit: `(room, limit)`, the tightest of the referenced and exclusive
/// limits set on its qgroup and on every qgroup above it (a write counts
/// against all of them: snapper's `1/0`, a group of subvolumes), read from
/// `/sys/fs/btrfs/<fsid>/qgroups/<level>_<id>/` (Linux 5.9 and later).
/// `None` without quotas, without a limit, or elsewhere. `statfs` does not
/// see them: a write past one fails with `EDQUOT` however much the volume
/// has free. The qgroups above are found in the quota tree, which needs
/// `CAP_SYS_ADMIN`; without it only the subvolume's own limit is read.
pub fn qgroup_room(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
    let info = fs_info(fd).ok().filter(|i| i.kind == FsKind::Btrfs)?;
    let qgroups = Path::new("/sys/fs/btrfs").join(&info.instance).join("qgroups");
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

/// `BTRFS_QUOTA_TREE_OBJECTID`.
const BTRFS_QUOTA_TREE_OBJECTID: u64 = 8;
/// `BTRFS_QGROUP_RELATION_KEY`: an item keyed `(member, this, group)` and
/// one keyed `(group, this, member)` for each membership.
const BTRFS_QGROUP_RELATION_KEY: u32 = 246;

/// The qgroups qgroup `id` is a direct member of (`level << 48 | id`).
fn qgroup_parents(fd: BorrowedFd<'_>, id: u64) -> Result<Vec<u64>, Errno> {
    let items = super::btrfs_tree::search(fd, BTRFS_QUOTA_TREE_OBJECTID, id, BTRFS_QGROUP_RELATION_KEY, 0..=u64::MAX)?;
    Ok(relation_parents(&items, id))
}

/// Of the relation items keyed by `id`, the groups `id` is a member of:
/// the other end is of a higher level (the items keyed by a group name
/// its members).
fn relation_parents(items: &[Item], id: u64) -> Vec<u64> {
    items
        .iter()
        .filter(|i| i.kind == BTRFS_QGROUP_RELATION_KEY && i.objectid == id && i.offset >> 48 > id >> 48)
        .map(|i| i.offset)
        .collect()
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
    fn the_groups_a_qgroup_is_a_member_of_are_read_from_its_relation_items() {
        let item = |objectid, kind, offset| Item { objectid, kind, offset, data: Vec::new() };
        let (sub, group, top) = (257, 1 << 48 | 100, 2 << 48 | 1);
        let items = [
            item(sub, BTRFS_QGROUP_RELATION_KEY, group),
            item(sub, 244, 0),                           // another kind
            item(group, BTRFS_QGROUP_RELATION_KEY, sub), // group → member
            item(sub, BTRFS_QGROUP_RELATION_KEY, top),
        ];
        assert_eq!(relation_parents(&items, sub), vec![group, top]);
        // The group's own items name its member (lower) and nothing above.
        assert_eq!(relation_parents(&items, group), Vec::<u64>::new());
    }
}
