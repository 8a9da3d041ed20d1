//! `FS_IOC_FIEMAP`: where a file's bytes live on disk.
//!
//! Used to skip ranges that already share one physical extent (so a second
//! run submits nothing), and by the tests to prove that sharing happened.

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

/// `struct fiemap` header from `<linux/fiemap.h>`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct FiemapHeader {
    fm_start: u64,
    fm_length: u64,
    fm_flags: u32,
    fm_mapped_extents: u32,
    fm_extent_count: u32,
    fm_reserved: u32,
}

/// `struct fiemap_extent` from `<linux/fiemap.h>`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct FiemapExtent {
    fe_logical: u64,
    fe_physical: u64,
    fe_length: u64,
    fe_reserved64: [u64; 2],
    fe_flags: u32,
    fe_reserved: [u32; 3],
}

nix::ioctl_readwrite!(
    /// `FS_IOC_FIEMAP` (`_IOWR('f', 11, struct fiemap)`).
    ioctl_fiemap, b'f', 11, FiemapHeader
);

/// Flush dirty data before mapping, so delayed allocations have addresses.
const FIEMAP_FLAG_SYNC: u32 = 0x1;

/// Extent flags (`FIEMAP_EXTENT_*` of `<linux/fiemap.h>`), as the kernel
/// reports them in [`Extent::flags`], and the masks built from them. Every
/// flag bit of the project is named here: code outside `sys/` asks the
/// methods of [`Extent`] instead of testing bits (the names are public so
/// tests can build extents).
pub mod flags {
    /// `FIEMAP_EXTENT_LAST`: the file's last extent.
    pub const LAST: u32 = 0x1;
    /// `FIEMAP_EXTENT_UNKNOWN`: where the data is is not known.
    pub const UNKNOWN: u32 = 0x2;
    /// `FIEMAP_EXTENT_DELALLOC`: not allocated yet (delayed allocation).
    pub const DELALLOC: u32 = 0x4;
    /// `FIEMAP_EXTENT_ENCODED`: compressed (btrfs): `fe_physical` is the
    /// start of the whole encoded extent, not of each logical block.
    pub const ENCODED: u32 = 0x8;
    /// `FIEMAP_EXTENT_DATA_ENCRYPTED`: the data on disk is encrypted.
    pub const DATA_ENCRYPTED: u32 = 0x80;
    /// `FIEMAP_EXTENT_NOT_ALIGNED`: not block-aligned on disk.
    pub const NOT_ALIGNED: u32 = 0x100;
    /// `FIEMAP_EXTENT_DATA_INLINE`: the data lives in metadata (btrfs small
    /// files): no extent of its own.
    pub const DATA_INLINE: u32 = 0x200;
    /// `FIEMAP_EXTENT_DATA_TAIL`: several files' tails packed in one block.
    pub const DATA_TAIL: u32 = 0x400;
    /// `FIEMAP_EXTENT_UNWRITTEN`: allocated but not written (reads as zeros).
    pub const UNWRITTEN: u32 = 0x800;
    /// `FIEMAP_EXTENT_MERGED`: several extents reported as one.
    pub const MERGED: u32 = 0x1000;
    /// `FIEMAP_EXTENT_SHARED`: another file (or offset) references it too.
    pub const SHARED: u32 = 0x2000;

    /// No stable disk address: unknown, not allocated yet, or inline in
    /// metadata.
    pub(super) const UNPLACED: u32 = UNKNOWN | DELALLOC | DATA_INLINE;

    /// The "unstable" mask: extents whose blocks have no stable address of
    /// their own ([`UNPLACED`], or compressed), which a block-level rewrite
    /// must leave alone.
    pub(super) const UNSTABLE: u32 = UNPLACED | ENCODED;

    /// Flags under which `fe_physical` does not say where each logical
    /// block's bytes are (or says it only for now): [`UNSTABLE`], unwritten,
    /// encrypted, unaligned, tail-packed or merged extents.
    pub(super) const UNPROVABLE: u32 = UNSTABLE | UNWRITTEN | DATA_ENCRYPTED | NOT_ALIGNED | DATA_TAIL | MERGED;
}

/// One mapped extent of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Offset in the file.
    pub logical: u64,
    /// Disk address (meaningful only where [`Extent::has_address`]).
    pub physical: u64,
    /// Length in bytes.
    pub length: u64,
    /// [`flags`] bits; test them with the methods below.
    pub flags: u32,
}

impl Extent {
    /// Whether the kernel says another file (or offset) references this extent too.
    pub fn is_shared(&self) -> bool {
        self.flags & flags::SHARED != 0
    }

    /// Whether the data is inline in metadata (btrfs): it has no extent of
    /// its own and can never be shared.
    pub fn is_inline(&self) -> bool {
        self.flags & flags::DATA_INLINE != 0
    }

    /// Whether the extent is compressed (btrfs): `physical` names the whole
    /// encoded extent, not the block at `logical`.
    pub fn is_encoded(&self) -> bool {
        self.flags & flags::ENCODED != 0
    }

    /// Whether `physical` is a disk address at all (not unknown, delayed
    /// or inline).
    pub fn has_address(&self) -> bool {
        self.flags & flags::UNPLACED == 0
    }

    /// Whether the extent is compressed, inline, delayed or unknown: its
    /// blocks have no stable address of their own, so a rewrite of part of
    /// it (bookends) leaves it alone.
    pub fn is_unstable(&self) -> bool {
        self.flags & flags::UNSTABLE != 0
    }

    /// Whether `physical + (offset - logical)` is where each logical block's
    /// bytes are, for good (see [`flags::UNPROVABLE`]): only then may two
    /// blocks be called equal because their addresses are.
    pub fn is_block_exact(&self) -> bool {
        self.flags & flags::UNPROVABLE == 0
    }
}

/// All extents overlapping `[start, start+len)`, in logical order.
pub fn fiemap(fd: BorrowedFd<'_>, start: u64, len: u64) -> Result<Vec<Extent>, Errno> {
    let mut out = Vec::new();
    fiemap_each(fd, start, len, |e| {
        out.push(*e);
        true
    })?;
    Ok(out)
}

/// Each extent overlapping `[start, start+len)`, in logical order, handed
/// to `each` as the kernel returns them, up to 256 at a time, until it
/// answers `false`: a file of millions of extents (a user can make one
/// cheaply, cloning one block into every other block of a sparse file)
/// costs no list of them.
///
/// The first call has room for 8 extents, and each full answer asks for
/// four times more, up to 256: most files have one extent, and this is
/// asked of every file a run or `report` goes through. A buffer for 256
/// records (14 KiB), allocated zeroed and zeroed again, was 8% of the time
/// of `report` on a million small files.
pub fn fiemap_each(
    fd: BorrowedFd<'_>,
    start: u64,
    len: u64,
    mut each: impl FnMut(&Extent) -> bool,
) -> Result<(), Errno> {
    const FIRST: usize = 8;
    const BATCH: usize = 256;
    let end = start.saturating_add(len);
    let mut pos = start;
    let header_words = std::mem::size_of::<FiemapHeader>() / 8;
    let ext_words = std::mem::size_of::<FiemapExtent>() / 8;
    let mut room = FIRST;
    let mut buf = vec![0u64; header_words + ext_words * room];
    while pos < end {
        let base = buf.as_mut_ptr();
        // SAFETY: `buf` holds the header plus `room` extent records, 8-byte
        // aligned; both structs are repr(C) plain data. The header is
        // written whole (its reserved fields zero); the kernel writes at
        // most `fm_extent_count` records, and only the `fm_mapped_extents`
        // it wrote are read.
        let (mapped, batch) = unsafe {
            let hdr = base as *mut FiemapHeader;
            *hdr = FiemapHeader {
                fm_start: pos,
                fm_length: end - pos,
                fm_flags: FIEMAP_FLAG_SYNC,
                fm_extent_count: room as u32,
                ..Default::default()
            };
            ioctl_fiemap(fd.as_raw_fd(), hdr)?;
            let n = (*hdr).fm_mapped_extents as usize;
            let exts = base.add(header_words) as *const FiemapExtent;
            (n, (0..n.min(room)).map(|i| *exts.add(i)).collect::<Vec<_>>())
        };
        if mapped >= room && room < BATCH {
            room = (room * 4).min(BATCH);
            buf.resize(header_words + ext_words * room, 0);
        }
        if mapped == 0 {
            break;
        }
        let mut last = false;
        for e in &batch {
            let ext = Extent { logical: e.fe_logical, physical: e.fe_physical, length: e.fe_length, flags: e.fe_flags };
            if !each(&ext) {
                return Ok(());
            }
            last |= e.fe_flags & flags::LAST != 0;
        }
        let tail = batch.last().expect("mapped > 0");
        let next = tail.fe_logical + tail.fe_length;
        if last || next <= pos {
            break;
        }
        pos = next;
    }
    Ok(())
}

/// Marks the address of a block in an encoded (compressed) extent in
/// [`physical_map`]: no plain disk address has the top bit set, so a
/// compressed block never equals an uncompressed one.
pub const ENCODED_ADDRESS: u64 = 1 << 63;

/// Address of every `step`-sized piece of `[start, start+len)`, or `None`
/// for a piece in a hole or in an extent without a stable address
/// (delalloc, inline, unknown). Used to compare two ranges block by block:
/// equal addresses mean sharing them again cannot free anything.
///
/// A block of a plain extent has its disk address. A block of an encoded
/// (btrfs compressed) extent has the extent's address, tagged with
/// [`ENCODED_ADDRESS`], the same for every block of the extent: btrfs
/// reports `fe_physical` as the start of the whole compressed extent and
/// keeps the offset into its decompressed data to itself (a file that
/// shares the second half of another's 128 KiB compressed extent shows
/// the same `fe_physical`; seen on 6.18, and in `fs/btrfs/fiemap.c`, which
/// adds the extent offset only for uncompressed extents), so the block
/// within it cannot be named. It need not be: btrfs frees a compressed
/// extent only whole, so when both sides of a block are in the same
/// compressed extent, sharing it again frees nothing.
pub fn physical_map(extents: &[Extent], start: u64, len: u64, step: u64) -> Vec<Option<u64>> {
    let mut out = Vec::with_capacity((len / step) as usize + 1);
    let mut off = start;
    // Extents are in logical order and do not overlap.
    let mut i = extents.partition_point(|e| e.logical + e.length <= start);
    while off < start + len {
        while i < extents.len() && extents[i].logical + extents[i].length <= off {
            i += 1;
        }
        let phys = extents.get(i).and_then(|e| {
            (e.logical <= off && e.has_address()).then(|| {
                if e.is_encoded() {
                    ENCODED_ADDRESS | e.physical
                } else {
                    e.physical + (off - e.logical)
                }
            })
        });
        out.push(phys);
        off += step;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<FiemapHeader>(), 32);
        assert_eq!(std::mem::size_of::<FiemapExtent>(), 56);
        let code = nix::request_code_readwrite!(b'f', 11, std::mem::size_of::<FiemapHeader>());
        assert_eq!(code as u64, 0xc020_660b);
    }

    #[test]
    fn physical_map_walks_extents_and_holes() {
        let ext = [
            Extent { logical: 0, physical: 1000, length: 8, flags: 0 },
            Extent { logical: 16, physical: 5000, length: 8, flags: flags::LAST },
        ];
        assert_eq!(physical_map(&ext, 0, 24, 4), vec![Some(1000), Some(1004), None, None, Some(5000), Some(5004)]);
    }

    #[test]
    fn compressed_blocks_are_named_by_their_extent() {
        let enc = flags::ENCODED;
        let a = [
            Extent { logical: 0, physical: 1 << 20, length: 16, flags: enc },
            Extent { logical: 16, physical: 1 << 21, length: 8, flags: enc | flags::SHARED },
        ];
        // The second half of a's first extent, referenced by another file
        // at offset 0: same fe_physical.
        let b = [Extent { logical: 0, physical: 1 << 20, length: 8, flags: enc }];
        let (x, y) = (ENCODED_ADDRESS | 1 << 20, ENCODED_ADDRESS | 1 << 21);
        assert_eq!(physical_map(&a, 0, 24, 4), vec![Some(x), Some(x), Some(x), Some(x), Some(y), Some(y)]);
        assert_eq!(physical_map(&a, 8, 8, 4), physical_map(&b, 0, 8, 4), "same extent: nothing to free");
        // Never equal to the plain block at that disk address.
        let plain = [Extent { logical: 0, physical: 1 << 20, length: 8, flags: 0 }];
        assert_ne!(physical_map(&plain, 0, 4, 4), physical_map(&b, 0, 4, 4));
        // Inline and delalloc stay unknown.
        let inline = [Extent { logical: 0, physical: 0, length: 8, flags: flags::DATA_INLINE | enc }];
        assert_eq!(physical_map(&inline, 0, 8, 4), vec![None, None]);
    }

    #[test]
    fn masks_name_what_callers_ask() {
        let e = |flags| Extent { logical: 0, physical: 4096, length: 4096, flags };
        assert!(e(0).has_address() && !e(0).is_unstable() && e(0).is_block_exact());
        for f in [flags::UNKNOWN, flags::DELALLOC, flags::DATA_INLINE] {
            assert!(!e(f).has_address() && e(f).is_unstable() && !e(f).is_block_exact(), "{f:#x}");
        }
        // Compressed: an address (of the whole extent), but not per block.
        let enc = e(flags::ENCODED);
        assert!(enc.has_address() && enc.is_encoded() && enc.is_unstable() && !enc.is_block_exact());
        // Unwritten: a stable address, but its blocks read as zeros.
        let unw = e(flags::UNWRITTEN | flags::SHARED);
        assert!(unw.has_address() && !unw.is_unstable() && !unw.is_block_exact() && unw.is_shared());
        assert!(e(flags::DATA_INLINE).is_inline() && !e(flags::LAST).is_shared());
    }

    #[test]
    fn maps_a_real_file() {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![7u8; 64 * 1024]).unwrap();
        f.sync_all().unwrap();
        use std::os::fd::AsFd;
        match fiemap(f.as_fd(), 0, 64 * 1024) {
            Ok(ext) => {
                let covered: u64 = ext.iter().map(|e| e.length).sum();
                assert!(covered >= 64 * 1024, "{ext:?}");
            }
            // tmpfs has no FIEMAP; that is a property of /tmp, not a bug.
            Err(Errno::EOPNOTSUPP) => {}
            Err(e) => panic!("fiemap failed: {e}"),
        }
    }

    /// A file of 700 extents (a block written every other block): every
    /// one listed once, in order, across the answers that grow from 8
    /// records to 256; and `fiemap_each` stops where it is told to.
    #[test]
    fn maps_a_file_of_many_extents_in_growing_answers() {
        use std::os::fd::AsFd;
        use std::os::unix::fs::FileExt;
        let f = tempfile::tempfile().unwrap();
        let n = 700u64;
        for i in 0..n {
            f.write_all_at(&[i as u8 | 1; 4096], i * 8192).unwrap();
        }
        f.sync_all().unwrap();
        let ext = match fiemap(f.as_fd(), 0, n * 8192) {
            Ok(ext) => ext,
            Err(Errno::EOPNOTSUPP) => return,
            Err(e) => panic!("fiemap failed: {e}"),
        };
        let starts: Vec<u64> = ext.iter().map(|e| e.logical).collect();
        assert_eq!(starts, (0..n).map(|i| i * 8192).collect::<Vec<_>>());
        assert!(ext.iter().all(|e| e.length == 4096));
        let mut seen = 0;
        fiemap_each(f.as_fd(), 0, n * 8192, |_| {
            seen += 1;
            seen < 300
        })
        .unwrap();
        assert_eq!(seen, 300);
    }
}
