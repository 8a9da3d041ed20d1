//! Reading btrfs's own trees (`BTRFS_IOC_TREE_SEARCH`, which needs
//! `CAP_SYS_ADMIN`): what no other interface tells — the groups a qgroup
//! is a member of (`sys::qgroup`), whether a file keeps data checksums,
//! whether deleted subvolumes are still being cleaned up, and which extent
//! on disk each stretch of a file lies in ([`file_extents`]).
//!
//! Whether a file keeps checksums matters to every unnamed file the run
//! shares into a file (a rewrite's copy, the hole written zeros are shared
//! from): btrfs refuses to share between a file with data checksums and one
//! without (`EINVAL`: "don't make the destination partly checksummed"). A
//! file is without them when it was made on a volume mounted `nodatasum`
//! or `nodatacow`, or marked `NOCOW`; an unnamed file made now takes the
//! volume's current mount options, so it must be matched to the file it is
//! for ([`match_checksums`]).

use std::ops::RangeInclusive;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

use super::fiemap::Extent;

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

/// One item a search found: its key and its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// The key's first part (an inode, a qgroup, ...).
    pub objectid: u64,
    /// The key's type (`BTRFS_*_KEY`).
    pub kind: u32,
    /// The key's last part.
    pub offset: u64,
    /// The item's bytes, as the kernel lays them out.
    pub data: Vec<u8>,
}

/// The items of tree `tree` (0: the tree of `fd`'s subvolume) keyed
/// `(objectid, kind, offset)` with `offset` in `offsets`: as many as one
/// 4 KiB answer holds (the callers ask for a few).
pub fn search(
    fd: BorrowedFd<'_>,
    tree: u64,
    objectid: u64,
    kind: u32,
    offsets: RangeInclusive<u64>,
) -> Result<Vec<Item>, Errno> {
    let mut a = SearchArgs {
        key: SearchKey {
            tree_id: tree,
            min_objectid: objectid,
            max_objectid: objectid,
            min_offset: *offsets.start(),
            max_offset: *offsets.end(),
            max_transid: u64::MAX,
            min_type: kind,
            max_type: kind,
            nr_items: 4096,
            ..SearchKey::default()
        },
        buf: [0; 4096 - std::mem::size_of::<SearchKey>()],
    };
    // SAFETY: `a` is a valid, writable 4 KiB `btrfs_ioctl_search_args`.
    unsafe { ioctl_btrfs_tree_search(fd.as_raw_fd(), &mut a) }?;
    Ok(parse_items(&a.buf, a.key.nr_items))
}

/// The `n` items of a search answer: each a header (transid, objectid,
/// offset: `u64`; type, data length: `u32`) and its data. A buffer that
/// ends early ends the list.
fn parse_items(buf: &[u8], n: u32) -> Vec<Item> {
    let u64_at = |p: usize| buf.get(p..p + 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap()));
    let u32_at = |p: usize| buf.get(p..p + 4).map(|b| u32::from_ne_bytes(b.try_into().unwrap()));
    let (mut out, mut pos) = (Vec::new(), 0);
    for _ in 0..n {
        let (Some(objectid), Some(offset), Some(kind), Some(len)) =
            (u64_at(pos + 8), u64_at(pos + 16), u32_at(pos + 24), u32_at(pos + 28))
        else {
            break;
        };
        let Some(data) = buf.get(pos + 32..pos + 32 + len as usize) else { break };
        out.push(Item { objectid, kind, offset, data: data.to_vec() });
        pos += 32 + len as usize;
    }
    out
}

/// `BTRFS_INODE_ITEM_KEY`.
const INODE_ITEM_KEY: u32 = 1;
/// Where `flags` lies in `struct btrfs_inode_item`: after generation,
/// transid, size, nbytes, block_group (`u64`), nlink, uid, gid, mode
/// (`u32`) and rdev (`u64`).
const INODE_FLAGS_AT: usize = 64;
/// `BTRFS_INODE_NODATASUM`.
const NODATASUM: u64 = 1;

/// Whether the file `fd` keeps no data checksums (its inode item's
/// `BTRFS_INODE_NODATASUM`, which no other call shows: `FS_IOC_GETFLAGS`
/// shows `NOCOW` only).
pub fn nodatasum(fd: BorrowedFd<'_>) -> Result<bool, Errno> {
    let ino = nix::sys::stat::fstat(fd)?.st_ino;
    let items = search(fd, 0, ino, INODE_ITEM_KEY, 0..=0)?;
    let flags = items.first().and_then(|i| i.data.get(INODE_FLAGS_AT..INODE_FLAGS_AT + 8)).ok_or(Errno::ENOENT)?;
    Ok(u64::from_ne_bytes(flags.try_into().unwrap()) & NODATASUM != 0)
}

/// The root tree (`BTRFS_ROOT_TREE_OBJECTID`).
const ROOT_TREE: u64 = 1;
/// `BTRFS_ORPHAN_OBJECTID` (-5): the objectid of the orphan items that
/// stand in the root tree for deleted subvolumes not yet cleaned up.
const ORPHAN_OBJECTID: u64 = -5i64 as u64;
/// `BTRFS_ORPHAN_ITEM_KEY`.
const ORPHAN_ITEM_KEY: u32 = 48;

/// Whether subvolumes or snapshots deleted on the filesystem of `fd` are
/// still waiting for, or under, the kernel's cleaner: it gives their space
/// back on its own schedule, seconds to minutes after the deletion (a
/// snapshot of 800 MB of data deleted, then synced: its space came back
/// 5–10 s later), with no call any process makes then.
pub fn deleted_subvolumes_pending(fd: BorrowedFd<'_>) -> Result<bool, Errno> {
    Ok(!search(fd, ROOT_TREE, ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, 0..=u64::MAX)?.is_empty())
}

/// `BTRFS_EXTENT_DATA_KEY`: a stretch of a file, keyed by its offset.
const EXTENT_DATA_KEY: u32 = 108;
/// `BTRFS_FILE_EXTENT_INLINE`: data kept in the item, no extent on disk.
const FILE_EXTENT_INLINE: u8 = 0;

/// A stretch of a file in one extent on disk (a `BTRFS_EXTENT_DATA_KEY`
/// item that points at one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileExtent {
    /// Offset in the file.
    pub logical: u64,
    /// Length in the file, in bytes.
    pub length: u64,
    /// Where the extent begins on disk (`disk_bytenr`): the same for
    /// every stretch of it, in this file or any other. A write into the
    /// middle of an extent splits the file's stretch of it in two, and
    /// the extent stays on disk while either is referenced.
    pub disk: u64,
    /// Where in the file the extent would begin (`logical` less the
    /// stretch's offset into it) and its length there (`ram_bytes`): a
    /// stretch of it in this file alone lies within these bytes.
    pub span: (u64, u64),
}

/// Where `struct btrfs_file_extent_item` keeps the type (`u8`), then
/// `disk_bytenr`, `disk_num_bytes`, `offset` and `num_bytes` (`u64`s),
/// after generation, ram_bytes (`u64`), compression, encryption (`u8`)
/// and other_encoding (`u16`); the struct is packed.
const FILE_EXTENT_RAM_BYTES_AT: usize = 8;
const FILE_EXTENT_TYPE_AT: usize = 20;
const FILE_EXTENT_DISK_AT: usize = 21;
const FILE_EXTENT_OFFSET_AT: usize = 37;
const FILE_EXTENT_NUM_BYTES_AT: usize = 45;

/// The stretch an item describes, if it lies in an extent on disk (not
/// inline data, not a hole).
fn file_extent(item: &Item) -> Option<FileExtent> {
    let u64_at = |p: usize| item.data.get(p..p + 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap()));
    if *item.data.get(FILE_EXTENT_TYPE_AT)? == FILE_EXTENT_INLINE {
        return None;
    }
    let (disk, length) = (u64_at(FILE_EXTENT_DISK_AT)?, u64_at(FILE_EXTENT_NUM_BYTES_AT)?);
    let (into, ram) = (u64_at(FILE_EXTENT_OFFSET_AT)?, u64_at(FILE_EXTENT_RAM_BYTES_AT)?);
    let span = (item.offset.saturating_sub(into), ram.max(into + length));
    (disk != 0 && length > 0).then_some(FileExtent { logical: item.offset, length, disk, span })
}

/// The stretches of the file `fd` that begin in `offsets` and lie in an
/// extent on disk, in file order, each handed to `each` (a file can have
/// millions: the caller keeps the few it needs). FIEMAP shows the
/// stretches but not which extent each belongs to; this does.
pub fn file_extents(
    fd: BorrowedFd<'_>,
    offsets: std::ops::Range<u64>,
    mut each: impl FnMut(FileExtent),
) -> Result<(), Errno> {
    let ino = nix::sys::stat::fstat(fd)?.st_ino;
    let mut from = offsets.start;
    while from < offsets.end {
        let items = search(fd, 0, ino, EXTENT_DATA_KEY, from..=offsets.end - 1)?;
        let Some(last) = items.last() else { break };
        let next = last.offset.checked_add(1);
        items.iter().filter_map(file_extent).for_each(&mut each);
        from = next.unwrap_or(u64::MAX);
    }
    Ok(())
}

/// The longest stretch of one extent (`BTRFS_MAX_EXTENT_SIZE` is 128 MiB;
/// with room for a preallocated extent written in part): a stretch that
/// reaches an offset begins at most this far before it.
pub const LONGEST_STRETCH: u64 = 256 << 20;

/// FIEMAP's `extents` (in file order) cut where the file's `stretches`
/// (in file order, not overlapping) begin and end, each piece with the
/// extent on disk it lies in. FIEMAP merges stretches that lie end to end
/// on disk, and names none of them by its extent. Parts no stretch covers
/// (the file changed in between) are named by none.
pub fn on_disk(extents: &[Extent], stretches: &[FileExtent]) -> Vec<(Extent, Option<u64>)> {
    let piece = |e: &Extent, from: u64, to: u64| {
        let physical = if e.has_address() { e.physical + (from - e.logical) } else { e.physical };
        Extent { logical: from, physical, length: to - from, flags: e.flags }
    };
    let mut out = Vec::with_capacity(extents.len());
    for e in extents {
        let end = e.logical + e.length;
        let first = stretches.partition_point(|s| s.logical + s.length <= e.logical);
        let mut pos = e.logical;
        for s in stretches[first..].iter().take_while(|s| s.logical < end) {
            let (from, to) = (s.logical.max(pos), (s.logical + s.length).min(end));
            if from > pos {
                out.push((piece(e, pos, from), None));
            }
            if to > from {
                out.push((piece(e, from, to), Some(s.disk)));
                pos = to;
            }
        }
        if pos < end {
            out.push((piece(e, pos, end), None));
        }
    }
    out
}

/// `pieces` grouped by the extent on disk they lie in (as named by
/// [`on_disk`]), in the order of each group's first piece; a piece of no
/// known extent is a group of its own.
pub fn by_extent<T>(pieces: impl IntoIterator<Item = (T, Option<u64>)>) -> Vec<(Option<u64>, Vec<T>)> {
    let mut groups: Vec<(Option<u64>, Vec<T>)> = Vec::new();
    let mut of_disk: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for (piece, disk) in pieces {
        match disk.map(|d| *of_disk.entry(d).or_insert(groups.len())) {
            Some(i) if i < groups.len() => groups[i].1.push(piece),
            _ => groups.push((disk, vec![piece])),
        }
    }
    groups
}

/// Whether stretch `s` lies under one of `extents` (in file order) that
/// `wanted` picks: only those need naming.
pub fn under(extents: &[Extent], s: &FileExtent, wanted: impl Fn(&Extent) -> bool) -> bool {
    let first = extents.partition_point(|e| e.logical + e.length <= s.logical);
    extents[first..].iter().take_while(|e| e.logical < s.logical + s.length).any(wanted)
}

/// Make the empty unnamed file `tmp` keep data checksums exactly when
/// `like` does, so that btrfs lets it share into `like`: setting `NOCOW`
/// on an empty file drops its checksums, clearing it gives them back (even
/// on a volume mounted `nodatasum`). Where the inode items cannot be read
/// (no `CAP_SYS_ADMIN`, not btrfs) nothing is changed: the file keeps what
/// the mount options gave it, as before.
pub fn match_checksums(tmp: BorrowedFd<'_>, like: BorrowedFd<'_>) -> Result<(), Errno> {
    let want = nodatasum(like)?;
    if nodatasum(tmp)? != want {
        super::inode::set_nocow(tmp, want)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_search_request_code_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<SearchKey>(), 104);
        assert_eq!(std::mem::size_of::<SearchArgs>(), 4096);
        let code = nix::request_code_readwrite!(0x94, 17, std::mem::size_of::<SearchArgs>());
        assert_eq!(code as u64, 0xd000_9411);
    }

    #[test]
    fn items_are_read_with_their_data() {
        fn item(obj: u64, kind: u32, offset: u64, data: &[u8]) -> Vec<u8> {
            let mut b = 7u64.to_ne_bytes().to_vec(); // transid
            b.extend(obj.to_ne_bytes());
            b.extend(offset.to_ne_bytes());
            b.extend(kind.to_ne_bytes());
            b.extend((data.len() as u32).to_ne_bytes());
            b.extend(data);
            b
        }
        let mut buf = item(257, 246, 1 << 48, &[]);
        buf.extend(item(258, 1, 0, &[9; 160]));
        buf.extend(item(259, 1, 0, &[]));
        let items = parse_items(&buf, 3);
        assert_eq!(items.len(), 3);
        assert_eq!((items[0].objectid, items[0].kind, items[0].offset), (257, 246, 1 << 48));
        assert_eq!((items[1].objectid, items[1].data.len()), (258, 160));
        assert_eq!(items[2].objectid, 259);
        // A count past the buffer, or data cut short, ends at the buffer.
        assert_eq!(parse_items(&buf, 9).len(), 3);
        assert_eq!(parse_items(&buf[..40 + 32], 3).len(), 1);
    }

    #[test]
    fn file_extent_items_name_their_extent_on_disk() {
        fn item(offset: u64, kind: u8, disk: u64, num_bytes: u64) -> Item {
            let mut data = vec![0u8; FILE_EXTENT_TYPE_AT];
            data[FILE_EXTENT_RAM_BYTES_AT..FILE_EXTENT_RAM_BYTES_AT + 8].copy_from_slice(&(1u64 << 20).to_ne_bytes());
            data.push(kind);
            for v in [disk, 1 << 20, 4096, num_bytes] {
                data.extend(v.to_ne_bytes());
            }
            assert_eq!(data.len(), 53); // sizeof(struct btrfs_file_extent_item)
            Item { objectid: 257, kind: EXTENT_DATA_KEY, offset, data }
        }
        // 12 KiB from 4 KiB into a 1 MiB extent: the extent would begin
        // at 4 KiB in the file.
        let want = FileExtent { logical: 8192, length: 12288, disk: 1 << 30, span: (4096, 1 << 20) };
        assert_eq!(file_extent(&item(8192, 1, 1 << 30, 12288)), Some(want));
        // Preallocated: an extent on disk too.
        assert_eq!(file_extent(&item(8192, 2, 1 << 30, 12288)), Some(want));
        // A hole (no extent), inline data, an item cut short: none.
        assert_eq!(file_extent(&item(0, 1, 0, 4096)), None);
        let mut inline = item(0, 1, 1 << 30, 4096);
        inline.data[FILE_EXTENT_TYPE_AT] = FILE_EXTENT_INLINE;
        assert_eq!(file_extent(&inline), None);
        let mut short = item(0, 1, 1 << 30, 4096);
        short.data.truncate(40);
        assert_eq!(file_extent(&short), None);
    }

    #[test]
    fn pieces_are_grouped_by_their_extent_on_disk() {
        let pieces = [("a", Some(7)), ("b", None), ("c", Some(9)), ("d", Some(7)), ("e", None)];
        let want = vec![(Some(7), vec!["a", "d"]), (None, vec!["b"]), (Some(9), vec!["c"]), (None, vec!["e"])];
        assert_eq!(by_extent(pieces), want);
    }

    #[test]
    fn fiemap_extents_are_cut_where_the_stretches_on_disk_begin() {
        const K: u64 = 4096;
        let fe = |logical, length, disk| FileExtent { logical, length, disk, span: (logical, length) };
        let ext = |logical, length, flags| Extent { logical, physical: (1 << 30) + logical, length, flags };
        // FIEMAP merged two stretches that lie end to end on disk; a third
        // part of it no stretch covers (changed since).
        let got = on_disk(&[ext(0, 24 * K, 0), ext(32 * K, 4 * K, 0)], &[fe(0, 8 * K, 1), fe(8 * K, 8 * K, 2)]);
        let want = [
            (ext(0, 8 * K, 0), Some(1)),
            (ext(8 * K, 8 * K, 0), Some(2)),
            (ext(16 * K, 8 * K, 0), None),
            (ext(32 * K, 4 * K, 0), None),
        ];
        assert_eq!(got, want);
        // A stretch reaching past the FIEMAP extent is cut to it; the
        // flags are the FIEMAP extent's.
        let shared = ext(4 * K, 4 * K, crate::sys::fiemap::flags::SHARED);
        assert_eq!(on_disk(&[shared], &[fe(0, 16 * K, 3)]), vec![(shared, Some(3))]);
        // Only stretches under something wanted need naming.
        let extents = [shared, ext(8 * K, 8 * K, 0)];
        let unshared = |e: &Extent| !e.is_shared();
        assert!(!under(&extents, &fe(0, 8 * K, 3), unshared));
        assert!(under(&extents, &fe(4 * K, 8 * K, 3), unshared));
        assert!(!under(&extents, &fe(16 * K, 64 * K, 3), unshared));
    }
}
