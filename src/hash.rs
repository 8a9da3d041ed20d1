//! Block fingerprints.
//!
//! In: an open file and its expected size. Out: a [`FileHash`] with one
//! 64-bit fingerprint per block (the first 8 bytes of the block's SHA-256).
//! Runs on the rayon hashing
//! threads; one call reads one file sequentially in large chunks.
//!
//! Holes are found with `SEEK_DATA`/`SEEK_HOLE` and never read. Holes and
//! all-zero blocks get the fingerprint [`ZERO_FP`] and are never used as
//! matches: sharing zeros frees nothing that a hole would not.
//!
//! I/O: `POSIX_FADV_SEQUENTIAL` on open, `WILLNEED` on the next chunk before
//! hashing the current one (reading overlaps hashing), and with `--drop-cache`
//! `DONTNEED` on chunks already hashed, so a nightly scan does not evict the
//! server's working set. Off by default: the share phase rereads every
//! duplicate range (the kernel compares both sides), and finds it cached.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use nix::errno::Errno;
use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
use nix::unistd::{lseek, Whence};

use sha2::{Digest, Sha256};

/// Fingerprint of a block that is a hole or all zeros: never matched.
pub const ZERO_FP: u64 = 0;

/// Bytes read per `pread`: large enough that the disk streams.
pub const CHUNK: usize = 1 << 20;

/// The block fingerprints of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHash {
    /// Size the file had while it was read.
    pub size: u64,
    /// One fingerprint per block (the last block may be partial).
    pub blocks: Vec<u64>,
    /// Bytes actually read from disk (holes of files larger than one read
    /// are not read).
    pub bytes_read: u64,
}

/// Fingerprint of a block digest: its first 8 bytes, never [`ZERO_FP`].
pub fn fingerprint(digest: &[u8; 32]) -> u64 {
    let fp = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
    if fp == ZERO_FP {
        1
    } else {
        fp
    }
}

fn is_zero(b: &[u8]) -> bool {
    // OR-fold 64-byte lanes: vectorises well and stops at the first
    // non-zero lane.
    let mut lanes = b.chunks_exact(64);
    let lanes_zero = lanes.all(|lane| lane.iter().fold(0u8, |acc, &x| acc | x) == 0);
    lanes_zero && b.chunks_exact(64).remainder().iter().all(|&x| x == 0)
}

/// Hash `file`, expected to be `size` bytes long, in blocks of `block_size`.
///
/// `buf` is a reusable read buffer (grown to [`CHUNK`]). A file that turns
/// out shorter than `size` yields an `UnexpectedEof` error: the caller treats
/// it as changed during the scan.
pub fn hash_file(file: &File, size: u64, block_size: u64, buf: &mut Vec<u8>) -> io::Result<FileHash> {
    hash_file_with(file, size, block_size, buf, false)
}

/// [`hash_file`], optionally dropping every chunk from the page cache once
/// it is hashed (`drop_behind`, see `--drop-cache`).
pub fn hash_file_with(
    file: &File,
    size: u64,
    block_size: u64,
    buf: &mut Vec<u8>,
    drop_behind: bool,
) -> io::Result<FileHash> {
    assert!(block_size.is_power_of_two() && block_size as usize <= CHUNK);
    let nblocks = size.div_ceil(block_size) as usize;
    let mut blocks = Vec::with_capacity(nblocks);
    if buf.len() < CHUNK {
        buf.resize(CHUNK, 0);
    }
    // A file that fits in one read is read in one `pread`: no hole search,
    // no read-ahead advice (four system calls fewer per small file; a hole
    // reads as zeros, which is what a hole hashes as anyway).
    let small = size <= CHUNK as u64;
    if !small {
        // Sequential: the kernel doubles its read-ahead window.
        advise(file, 0, 0, PosixFadviseAdvice::POSIX_FADV_SEQUENTIAL);
    }
    let mut bytes_read = 0u64;
    let mut pos = 0u64; // next block-aligned offset to account for
    while pos < size {
        // Find the next data region; everything before it is a hole.
        let next = if small { Some((0, size)) } else { next_data(file, pos, size)? };
        let (data_start, data_end) = match next {
            Some((s, e)) => (s - s % block_size, e.min(size)),
            None => (size, size),
        };
        let data_start = data_start.max(pos);
        while pos < data_start {
            let len = block_size.min(size - pos);
            blocks.push(ZERO_FP);
            pos += len;
        }
        // Read the data region in chunks, block by block.
        while pos < data_end {
            let want = ((data_end - pos).div_ceil(block_size) * block_size).min(CHUNK as u64).min(size - pos) as usize;
            let got = read_full_at(file, &mut buf[..want], pos)?;
            // Ask for the next chunk now, so the disk reads it while this
            // one is hashed.
            if pos + (got as u64) < size {
                advise(file, pos + got as u64, CHUNK as u64, PosixFadviseAdvice::POSIX_FADV_WILLNEED);
            }
            if got < want {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank while it was read"));
            }
            bytes_read += got as u64;
            for blk in buf[..got].chunks(block_size as usize) {
                if is_zero(blk) {
                    blocks.push(ZERO_FP);
                } else {
                    let d: [u8; 32] = Sha256::digest(blk).into();
                    blocks.push(fingerprint(&d));
                }
            }
            if drop_behind {
                // A nightly scan must not evict the server's working set.
                advise(file, pos, got as u64, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
            }
            pos += got as u64;
        }
    }
    debug_assert_eq!(blocks.len(), nblocks);
    Ok(FileHash { size, blocks, bytes_read })
}

/// Next data region at or after `pos`: `(start, end)` or `None` when the rest
/// of the file is a hole. Filesystems without `SEEK_DATA` report all data.
fn next_data(file: &File, pos: u64, size: u64) -> io::Result<Option<(u64, u64)>> {
    let start = match lseek(file, pos as i64, Whence::SeekData) {
        Ok(s) => s as u64,
        Err(Errno::ENXIO) => return Ok(None),
        Err(Errno::EINVAL | Errno::EOPNOTSUPP) => return Ok(Some((pos, size))),
        Err(e) => return Err(e.into()),
    };
    let end = lseek(file, start as i64, Whence::SeekHole).map_or(size, |e| e as u64);
    Ok(Some((start, end)))
}

/// Page-cache courtesy and read-ahead. Advice is only advice: errors are
/// ignored.
fn advise(file: &File, off: u64, len: u64, advice: PosixFadviseAdvice) {
    let _ = posix_fadvise(file, off as i64, len as i64, advice);
}

/// `pread` until `buf` is full or EOF; returns the bytes read.
fn read_full_at(file: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};

    fn file_with(parts: &[(u64, &[u8])], size: u64) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.set_len(size).unwrap();
        for (off, data) in parts {
            f.seek(SeekFrom::Start(*off)).unwrap();
            f.write_all(data).unwrap();
        }
        f
    }

    fn h(f: &File, size: u64) -> FileHash {
        hash_file(f, size, 4096, &mut Vec::new()).unwrap()
    }

    #[test]
    fn identical_content_same_blocks() {
        let data: Vec<u8> = (0..20000u32).map(|i| (i * 7 % 251) as u8).collect();
        let a = file_with(&[(0, &data)], data.len() as u64);
        let b = file_with(&[(0, &data)], data.len() as u64);
        let (ha, hb) = (h(&a, 20000), h(&b, 20000));
        assert_eq!(ha, hb);
        assert_eq!(ha.blocks.len(), 5);
        assert!(ha.blocks.iter().all(|&fp| fp != ZERO_FP));
    }

    #[test]
    fn hole_and_written_zeros_are_the_same_content() {
        let x = vec![9u8; 4096];
        let sparse = file_with(&[(0, &x), (3 * 4096, &x)], 4 * 4096);
        let dense = file_with(&[(0, &x), (4096, &[0u8; 8192]), (3 * 4096, &x)], 4 * 4096);
        let (hs, hd) = (h(&sparse, 4 * 4096), h(&dense, 4 * 4096));
        assert_eq!(hs.blocks, hd.blocks);
        assert_eq!(hs.blocks[1], ZERO_FP);
        assert_eq!(hs.blocks[0], hs.blocks[3]);
    }

    #[test]
    fn one_byte_changes_one_block() {
        let mut data = vec![5u8; 3 * 4096];
        let a = file_with(&[(0, &data)], data.len() as u64);
        data[4096 + 17] = 6;
        let b = file_with(&[(0, &data)], data.len() as u64);
        let (ha, hb) = (h(&a, 12288), h(&b, 12288));
        assert_eq!(ha.blocks[0], hb.blocks[0]);
        assert_ne!(ha.blocks[1], hb.blocks[1]);
    }

    #[test]
    fn partial_tail_block_is_hashed() {
        let a = file_with(&[(0, &[1u8; 5000])], 5000);
        let ha = h(&a, 5000);
        assert_eq!(ha.blocks.len(), 2);
        assert_eq!(ha.bytes_read, 5000);
    }

    #[test]
    fn shrunk_file_is_an_error() {
        let a = file_with(&[(0, &[1u8; 5000])], 5000);
        let e = hash_file(&a, 9000, 4096, &mut Vec::new()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
