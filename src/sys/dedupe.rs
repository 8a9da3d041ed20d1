//! `FIDEDUPERANGE`: ask the kernel to compare two ranges under lock and, when
//! they hold the same bytes, make the destinations share the source's extents.
//!
//! The kernel is the last line of defence: it compares the bytes itself, so a
//! wrong match from the planner can only cost time, never data.

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

/// Largest length one request may ask for. The kernel silently caps a request
/// at 16 MiB on both btrfs and XFS, so asking for more only hides the cap.
pub const MAX_REQUEST_LEN: u64 = 16 * 1024 * 1024;

/// Most destinations the kernel accepts in one call (the request must fit in
/// one page).
pub const MAX_DESTS: usize = 127;

/// `struct file_dedupe_range` from `<linux/fs.h>` (header only; the
/// destinations follow it in memory).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct FileDedupeRange {
    src_offset: u64,
    src_length: u64,
    dest_count: u16,
    reserved1: u16,
    reserved2: u32,
}

/// `struct file_dedupe_range_info` from `<linux/fs.h>`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct FileDedupeRangeInfo {
    dest_fd: i64,
    dest_offset: u64,
    bytes_deduped: u64,
    status: i32,
    reserved: u32,
}

const FILE_DEDUPE_RANGE_SAME: i32 = 0;
const FILE_DEDUPE_RANGE_DIFFERS: i32 = 1;

nix::ioctl_readwrite!(
    /// `FIDEDUPERANGE` (`_IOWR(0x94, 54, struct file_dedupe_range)`).
    ioctl_fideduperange, 0x94, 54, FileDedupeRange
);

/// What the kernel said about one destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupeStatus {
    /// The bytes were equal; `bytes_deduped` of them now share the source.
    Same,
    /// The bytes differ (the file changed since it was hashed, or a
    /// fingerprint collided): nothing was shared.
    Differs,
    /// The kernel refused this destination with an errno.
    Error(Errno),
}

/// Result for one destination of a [`dedupe_range`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DestResult {
    /// What the kernel answered for this destination.
    pub status: DedupeStatus,
    /// Bytes now shared (may be less than asked: continue from there).
    pub bytes_deduped: u64,
}

/// One `FIDEDUPERANGE` call: share `src[src_off..src_off+len]` into every
/// `(fd, offset)` of `dests`.
///
/// `len` must be at most [`MAX_REQUEST_LEN`] and `dests` at most
/// [`MAX_DESTS`] long. Returns one result per destination, in order, or the
/// errno of the whole call (e.g. `EINVAL` for a bad source range,
/// `EOPNOTSUPP` where the filesystem cannot share).
pub fn dedupe_range(
    src: BorrowedFd<'_>,
    src_off: u64,
    len: u64,
    dests: &[(BorrowedFd<'_>, u64)],
) -> Result<Vec<DestResult>, Errno> {
    assert!(len <= MAX_REQUEST_LEN, "request too long: {len}");
    assert!(!dests.is_empty() && dests.len() <= MAX_DESTS, "bad destination count {}", dests.len());
    // The request is a header followed by `dests.len()` info records. Build it
    // in a u64 buffer so it is 8-byte aligned like the C structs.
    let header_words = std::mem::size_of::<FileDedupeRange>() / 8;
    let info_words = std::mem::size_of::<FileDedupeRangeInfo>() / 8;
    let mut buf = vec![0u64; header_words + info_words * dests.len()];
    let base = buf.as_mut_ptr();
    // SAFETY: `buf` is large enough for the header plus `dests.len()` info
    // records, 8-byte aligned, and both structs are `repr(C)` plain data of
    // sizes that are multiples of 8.
    unsafe {
        let hdr = base as *mut FileDedupeRange;
        *hdr = FileDedupeRange {
            src_offset: src_off,
            src_length: len,
            dest_count: dests.len() as u16,
            ..Default::default()
        };
        let infos = base.add(header_words) as *mut FileDedupeRangeInfo;
        for (i, (fd, off)) in dests.iter().enumerate() {
            *infos.add(i) =
                FileDedupeRangeInfo { dest_fd: fd.as_raw_fd() as i64, dest_offset: *off, ..Default::default() };
        }
        // SAFETY: the pointer refers to a live, correctly sized request; the
        // kernel reads the header and writes only into the info records.
        ioctl_fideduperange(src.as_raw_fd(), hdr)?;
        Ok((0..dests.len())
            .map(|i| {
                let info = *infos.add(i);
                let status = match info.status {
                    FILE_DEDUPE_RANGE_SAME => DedupeStatus::Same,
                    FILE_DEDUPE_RANGE_DIFFERS => DedupeStatus::Differs,
                    e if e < 0 => DedupeStatus::Error(Errno::from_raw(-e)),
                    other => DedupeStatus::Error(Errno::from_raw(other)),
                };
                DestResult { status, bytes_deduped: info.bytes_deduped }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<FileDedupeRange>(), 24);
        assert_eq!(std::mem::size_of::<FileDedupeRangeInfo>(), 32);
    }

    #[test]
    fn request_code_matches_the_kernel() {
        // _IOWR(0x94, 54, struct file_dedupe_range) = 0xc0189436
        let code = nix::request_code_readwrite!(0x94, 54, std::mem::size_of::<FileDedupeRange>());
        assert_eq!(code as u64, 0xc018_9436);
    }
}
