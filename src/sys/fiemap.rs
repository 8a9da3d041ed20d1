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

nix::ioctl_readwrite!(ioctl_fiemap, b'f', 11, FiemapHeader);

/// Flush dirty data before mapping, so delayed allocations have addresses.
const FIEMAP_FLAG_SYNC: u32 = 0x1;

/// Extent flags, as the kernel reports them.
pub mod flags {
    pub const LAST: u32 = 0x1;
    pub const UNKNOWN: u32 = 0x2;
    pub const DELALLOC: u32 = 0x4;
    pub const ENCODED: u32 = 0x8;
    pub const DATA_INLINE: u32 = 0x200;
    pub const UNWRITTEN: u32 = 0x800;
    pub const SHARED: u32 = 0x2000;
}

/// One mapped extent of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub logical: u64,
    pub physical: u64,
    pub length: u64,
    pub flags: u32,
}

impl Extent {
    /// Whether the kernel says another file (or offset) references this extent too.
    pub fn is_shared(&self) -> bool {
        self.flags & flags::SHARED != 0
    }
}

/// All extents overlapping `[start, start+len)`, in logical order.
pub fn fiemap(fd: BorrowedFd<'_>, start: u64, len: u64) -> Result<Vec<Extent>, Errno> {
    const BATCH: usize = 256;
    let mut out = Vec::new();
    let end = start.saturating_add(len);
    let mut pos = start;
    let header_words = std::mem::size_of::<FiemapHeader>() / 8;
    let ext_words = std::mem::size_of::<FiemapExtent>() / 8;
    let mut buf = vec![0u64; header_words + ext_words * BATCH];
    while pos < end {
        buf.iter_mut().for_each(|w| *w = 0);
        let base = buf.as_mut_ptr();
        // SAFETY: `buf` holds the header plus BATCH extent records, 8-byte
        // aligned; both structs are repr(C) plain data. The kernel writes at
        // most `fm_extent_count` records.
        let (mapped, batch) = unsafe {
            let hdr = base as *mut FiemapHeader;
            *hdr = FiemapHeader {
                fm_start: pos,
                fm_length: end - pos,
                fm_flags: FIEMAP_FLAG_SYNC,
                fm_extent_count: BATCH as u32,
                ..Default::default()
            };
            ioctl_fiemap(fd.as_raw_fd(), hdr)?;
            let n = (*hdr).fm_mapped_extents as usize;
            let exts = base.add(header_words) as *const FiemapExtent;
            (n, (0..n.min(BATCH)).map(|i| *exts.add(i)).collect::<Vec<_>>())
        };
        if mapped == 0 {
            break;
        }
        let mut last = false;
        for e in &batch {
            out.push(Extent { logical: e.fe_logical, physical: e.fe_physical, length: e.fe_length, flags: e.fe_flags });
            last |= e.fe_flags & flags::LAST != 0;
        }
        let tail = batch.last().expect("mapped > 0");
        let next = tail.fe_logical + tail.fe_length;
        if last || next <= pos {
            break;
        }
        pos = next;
    }
    Ok(out)
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
    let mut i = 0;
    let unstable = flags::UNKNOWN | flags::DELALLOC | flags::DATA_INLINE;
    while off < start + len {
        while i < extents.len() && extents[i].logical + extents[i].length <= off {
            i += 1;
        }
        let phys = extents.get(i).and_then(|e| {
            (e.logical <= off && e.flags & unstable == 0).then(|| {
                if e.flags & flags::ENCODED != 0 {
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
}
