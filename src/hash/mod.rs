//! Block fingerprints.
//!
//! In: an open file and its expected size. Out: a [`FileHash`] whose
//! [`BlockMap`] holds one fingerprint per block (the first 8 bytes of the
//! block's SHA-256, kept as the 6-byte block-map fingerprint). One call reads
//! one file sequentially in large chunks, on a thread of the hashing pool
//! ([`pool`], which also opens each file and applies the per-file policy);
//! [`reuse`] takes the fingerprints of physical extents already hashed in
//! the run instead of reading them again.
//!
//! Memory follows the file's *data*, never its apparent size. In a file
//! larger than one read ([`CHUNK`]), holes are found with
//! `SEEK_DATA`/`SEEK_HOLE` and never read; a file of up to one read is read
//! with one `pread`, holes included (they read as zeros, which hash as a
//! hole does, so the map is the same). Either way a hole is appended to the
//! map as one zero run (12 bytes, however long), never expanded, and every
//! allocation sized from the file is fallible ([`MapError`] →
//! `ErrorKind::OutOfMemory` / `FileTooLarge`), so a hostile sparse file costs
//! a per-file error at worst, not the run (issue 12). Holes and all-zero
//! blocks get the fingerprint [`ZERO_FP`] and are never used as matches:
//! sharing zeros frees nothing that a hole would not.
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

pub use crate::blockmap::ZERO_FP;
use crate::blockmap::{short_fp, BlockMap, Fp, MapError, FP_MAX};

pub mod budget;
mod cached;
pub mod pool;
pub mod refused;
pub mod reuse;
pub mod settle;

pub use budget::MapBytes;
use reuse::worth_mapping;
pub use reuse::{Claim, ClaimGuard, ExtentCache, CACHE_BLOCKS};

/// Bytes read per `pread` (or one block, when blocks are larger): each
/// hashing thread keeps a buffer of this size for the run. The disk streams
/// on [`AHEAD`], not on this: the kernel reads ahead what we advise. With
/// 1 MiB reads, the sixteen threads of a 2-CPU machine held 16.8 MB of
/// buffers, the largest item of the scan and, once the plan's components
/// shrank, of the whole run (heaptrack on FULL).
pub const CHUNK: usize = 256 << 10;

/// Read-ahead asked for past each read (`POSIX_FADV_WILLNEED`), so the disk
/// reads the next stretch while this one is hashed.
pub const AHEAD: u64 = 1 << 20;

/// The block fingerprints of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHash {
    /// Size the file had while it was read.
    pub size: u64,
    /// One fingerprint per block (the last block may be partial), holes as
    /// zero runs.
    pub map: BlockMap,
    /// Bytes actually read from disk (holes of files larger than one read
    /// are not read).
    pub bytes_read: u64,
    /// Bytes whose fingerprints were taken from the [`ExtentCache`] instead
    /// of being read: the same physical blocks were hashed earlier in the run.
    pub bytes_reused: u64,
    /// Physical block ranges this call put into the cache, so that the
    /// caller can take them back if the file turns out to have changed
    /// while it was read.
    pub cached: Vec<(u64, u64)>,
    /// The file was mapped (FIEMAP) while it was hashed and every extent
    /// was its own: none shared with another file or snapshot, none inline.
    /// The share phase then needs no FIEMAP of it as a destination (see
    /// `dedupe::executor`): nothing can already share the source's blocks.
    pub unshared: bool,
    /// Where the file's blocks lie in extents FIEMAP showed shared with
    /// another file or snapshot: `(first block, first physical block,
    /// blocks)`, in file order, adjacent runs merged. The plan groups each
    /// such physical block once (see `plan::claims`): a reflinked clone or
    /// a file deduplicated before costs no grouping memory for what it
    /// already shares.
    pub shared_runs: Vec<SharedRun>,
    /// The [`owner_salt`] its fingerprints were recorded with: blocks of
    /// two owners are never grouped together, so they never claim each
    /// other's shared blocks either (see `plan::claims`).
    pub salt: Fp,
}

impl FileHash {
    /// A file of `size` bytes before any block is hashed, its fingerprints
    /// to be salted by `salt`.
    pub fn empty(size: u64, salt: Fp) -> FileHash {
        FileHash {
            size,
            map: BlockMap::new(),
            bytes_read: 0,
            bytes_reused: 0,
            cached: Vec::new(),
            unshared: false,
            shared_runs: Vec::new(),
            salt,
        }
    }
}

/// A run of blocks of a file lying in a shared extent: `(first block,
/// first physical block, blocks)`, in units of the block size.
pub type SharedRun = (u64, u64, u64);

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

/// The block-map fingerprint of one block's bytes.
pub fn block_fp(blk: &[u8]) -> Fp {
    if is_zero(blk) {
        0
    } else {
        let d: [u8; 32] = Sha256::digest(blk).into();
        short_fp(fingerprint(&d))
    }
}

/// The salt of the fingerprints of files owned by `uid`: an odd multiplier
/// (modulo 2⁴⁸, a bijection of block-map fingerprints that keeps 0, the zero block, at 0 and
/// every other fingerprint non-zero), 1 for root, so the same content owned
/// by two users gets fingerprints that do not match. The planner then never
/// joins files of different owners, which must not be shared (sharing shows
/// in FIEMAP: a user could confirm a guess at a file they cannot read), and
/// the database of a root-owned tree reads as before.
pub fn owner_salt(uid: u32) -> Fp {
    if uid == 0 {
        return 1;
    }
    let mut z = u64::from(uid).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    match ((z ^ (z >> 31)) & FP_MAX) | 1 {
        1 => 3,
        m => m,
    }
}

/// The salt of the fingerprints of a btrfs file that keeps no data
/// checksums (made on a volume mounted `nodatasum`, or `NOCOW` once),
/// multiplied into its owner's ([`owner_salt`]): btrfs refuses to share
/// between a file with checksums and one without (`EINVAL`), so the
/// planner must not pair them, as it does not pair owners. Two such files
/// still pair with each other. Odd, so the product stays a bijection.
pub fn checksum_salt(salt: Fp, nodatasum: bool) -> Fp {
    match nodatasum {
        true => salt.wrapping_mul(0x5bd1_e995_2f0b) & FP_MAX,
        false => salt,
    }
}

/// Hash `file`, expected to be `size` bytes long, in blocks of `block_size`.
///
/// `buf` is a reusable read buffer (grown to [`CHUNK`]). A file that turns
/// out shorter than `size` yields an `UnexpectedEof` error: the caller treats
/// it as changed during the scan.
pub fn hash_file(file: &File, size: u64, block_size: u64, buf: &mut Vec<u8>) -> io::Result<FileHash> {
    hash_file_with(file, size, block_size, buf, false, None, 1)
}

/// [`hash_file`], optionally dropping every chunk from the page cache once
/// it is hashed (`drop_behind`, see `--drop-cache`), reusing the
/// fingerprints of physical extents hashed earlier in the run (`cache`),
/// with every fingerprint recorded salted by `salt` ([`owner_salt`]).
pub fn hash_file_with(
    file: &File,
    size: u64,
    block_size: u64,
    buf: &mut Vec<u8>,
    drop_behind: bool,
    cache: Option<&ExtentCache>,
    salt: Fp,
) -> io::Result<FileHash> {
    assert!(block_size.is_power_of_two());
    // The buffer's length is the read size (see `Hasher::chunk`).
    let chunk = CHUNK.max(block_size as usize);
    if buf.len() != chunk {
        buf.clear();
        buf.try_reserve_exact(chunk).map_err(|_| map_err(MapError::OutOfMemory { blocks: 0 }))?;
        buf.resize(chunk, 0);
    }
    let mut h = Hasher {
        file,
        size,
        bs: block_size,
        buf,
        drop_behind: cached::DropBehind::new(drop_behind, size, chunk as u64),
        cache: cache.filter(|c| c.block_size == block_size && worth_mapping(size, block_size)),
        out: FileHash::empty(size, salt),
        mapped: None,
        salt,
        watch: if size > WATCH_EVERY { Some((stamp(file)?, WATCH_EVERY)) } else { None },
    };
    let read = h.regions();
    h.drop_behind.finish(file, size);
    if read.is_err() {
        // What was read may not be what the shared blocks hold.
        if let Some(cache) = h.cache {
            cache.forget(&h.out.cached);
        }
    }
    read?;
    debug_assert_eq!(h.out.map.len(), size.div_ceil(block_size));
    h.out.unshared = h.mapped == Some(true);
    Ok(h.out)
}

/// An error of the block map as an I/O error the caller can sort.
fn map_err(e: MapError) -> io::Error {
    let kind = match e {
        MapError::OutOfMemory { .. } => io::ErrorKind::OutOfMemory,
        MapError::TooLarge { .. } => io::ErrorKind::FileTooLarge,
    };
    io::Error::new(kind, e)
}

/// Record the next block's fingerprint `fp` in `out`, salted by `salt`.
fn record(out: &mut FileHash, salt: Fp, fp: Fp) -> io::Result<()> {
    out.map.push_short(fp.wrapping_mul(salt) & FP_MAX).map_err(map_err)
}

/// One file being hashed.
struct Hasher<'a> {
    file: &'a File,
    size: u64,
    bs: u64,
    buf: &'a mut Vec<u8>,
    /// `--drop-cache`: what of the file was cached before it was read, so
    /// that only the pages the read brought in are dropped.
    drop_behind: cached::DropBehind,
    cache: Option<&'a ExtentCache>,
    out: FileHash,
    /// `None` until FIEMAP mapped a region; then whether every extent it
    /// showed was the file's own (see [`FileHash::unshared`]).
    mapped: Option<bool>,
    /// [`owner_salt`] of the file's owner (1: fingerprints as they are).
    salt: Fp,
    /// A file larger than [`WATCH_EVERY`]: its size and times when the
    /// read began, and the bytes read at which to compare them again.
    watch: Option<(Stamp, u64)>,
}

/// Bytes read between two looks at a large file's size and times while it
/// is read: a file written meanwhile (a running VM's image, a growing log)
/// cannot be recorded, and was read to its end before that was found — a
/// 100 GiB image in use, read every night for nothing. One `fstat` per
/// 64 MiB, and none for smaller files.
const WATCH_EVERY: u64 = 64 << 20;

/// Size, mtime and ctime (seconds, nanoseconds) of an open file.
type Stamp = (u64, i64, i64, i64, i64);

fn stamp(file: &File) -> io::Result<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata()?;
    Ok((m.size(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()))
}

impl Hasher<'_> {
    /// Hash every region of the file: data read (or found in the extent
    /// cache), holes as zero runs.
    fn regions(&mut self) -> io::Result<()> {
        let (file, size, block_size) = (self.file, self.size, self.bs);
        // A file that fits in one read is read in one `pread`: no hole
        // search, no read-ahead advice (four system calls fewer per small
        // file; a hole reads as zeros, which is what a hole hashes as).
        let small = size <= self.chunk();
        if !small {
            // Sequential: the kernel doubles its read-ahead window.
            advise(file, 0, 0, PosixFadviseAdvice::POSIX_FADV_SEQUENTIAL);
        }
        let mut pos = 0u64; // next block-aligned offset to account for
        while pos < size {
            // Find the next data region; everything before it is a hole.
            let next = if small { Some((0, size)) } else { next_data(file, pos, size)? };
            let (data_start, data_end) = match next {
                Some((s, e)) => (s - s % block_size, e.min(size)),
                None => (size, size),
            };
            let data_start = data_start.max(pos);
            if data_start > pos {
                // A hole: one zero run, never expanded.
                self.out.map.push_zeros((data_start - pos).div_ceil(block_size)).map_err(map_err)?;
                pos = data_start;
            }
            // A region ends on a block boundary or at EOF.
            let data_end = if data_end < size { data_end.div_ceil(block_size) * block_size } else { size }.min(size);
            if pos < data_end {
                self.region(pos, data_end)?;
                pos = data_end;
            }
        }
        Ok(())
    }

    /// Bytes per read: the buffer's length, [`CHUNK`] or one block.
    fn chunk(&self) -> u64 {
        self.buf.len() as u64
    }

    /// Record the next block's fingerprint, salted. The extent cache keeps
    /// them unsalted: a reflinked copy may belong to another owner.
    fn push(&mut self, fp: Fp) -> io::Result<()> {
        record(&mut self.out, self.salt, fp)
    }

    /// Read and hash `[start, end)` in chunks.
    fn read(&mut self, start: u64, end: u64) -> io::Result<()> {
        let mut pos = start;
        while pos < end {
            let got = self.read_chunk(pos, end)?;
            for blk in self.buf[..got].chunks(self.bs as usize) {
                record(&mut self.out, self.salt, block_fp(blk))?;
            }
            self.after_chunk(pos, got as u64);
            pos += got as u64;
            self.watch()?;
        }
        Ok(())
    }

    /// Past every [`WATCH_EVERY`] bytes read, whether the file is still as
    /// it was when the read began; if not, stop (the caller counts it
    /// changed during the scan and it is read again next run).
    fn watch(&mut self) -> io::Result<()> {
        let Some((was, at)) = self.watch else { return Ok(()) };
        if self.out.bytes_read < at {
            return Ok(());
        }
        if stamp(self.file)? != was {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "changed while it was read"));
        }
        self.watch = Some((was, self.out.bytes_read + WATCH_EVERY));
        Ok(())
    }

    /// Read the next chunk of `[pos, end)` into the buffer; returns its length.
    fn read_chunk(&mut self, pos: u64, end: u64) -> io::Result<usize> {
        let want = (end - pos).min(self.chunk()) as usize;
        let got = self.drop_behind.read(self.file, &mut self.buf[..want], pos)?;
        // Ask for the next chunk now, so the disk reads it while this
        // one is hashed.
        if pos + (got as u64) < self.size {
            advise(self.file, pos + got as u64, AHEAD.max(self.chunk()), PosixFadviseAdvice::POSIX_FADV_WILLNEED);
        }
        if got < want {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank while it was read"));
        }
        self.out.bytes_read += got as u64;
        Ok(got)
    }

    fn after_chunk(&mut self, pos: u64, len: u64) {
        // A nightly scan must not evict the server's working set: what it
        // brought into the page cache goes, what was there stays.
        self.drop_behind.read_done(self.file, pos, len);
    }
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

    fn dense(h: &FileHash) -> Vec<Fp> {
        h.map.to_dense(u64::MAX).unwrap()
    }

    #[test]
    fn checksum_salts_tell_files_without_checksums_apart() {
        let owners: std::collections::HashSet<Fp> = (0..10_000).map(owner_salt).collect();
        for &s in &owners {
            assert_eq!(checksum_salt(s, false), s);
            let other = checksum_salt(s, true);
            assert_eq!(other % 2, 1, "an even salt is not a bijection");
            assert!(other <= FP_MAX && !owners.contains(&other), "{s} without checksums looks like an owner");
        }
    }

    #[test]
    fn owner_salts_keep_zero_and_tell_owners_apart() {
        assert_eq!(owner_salt(0), 1, "root's fingerprints are the plain ones");
        let salts: std::collections::HashSet<Fp> = (0..10_000).map(owner_salt).collect();
        assert_eq!(salts.len(), 10_000, "two owners share a salt");
        for s in salts {
            assert_eq!(s % 2, 1, "an even salt is not a bijection");
            assert!(s <= FP_MAX);
            assert_eq!(0u64.wrapping_mul(s) & FP_MAX, 0);
            assert_ne!(1u64.wrapping_mul(s) & FP_MAX, 0);
            assert_ne!(FP_MAX.wrapping_mul(s) & FP_MAX, 0);
        }
    }

    #[test]
    fn identical_content_same_blocks() {
        let data: Vec<u8> = (0..20000u32).map(|i| (i * 7 % 251) as u8).collect();
        let a = file_with(&[(0, &data)], data.len() as u64);
        let b = file_with(&[(0, &data)], data.len() as u64);
        let (ha, hb) = (h(&a, 20000), h(&b, 20000));
        assert_eq!(ha, hb);
        assert_eq!(ha.map.len(), 5);
        assert!(dense(&ha).iter().all(|&fp| fp != 0));
    }

    #[test]
    fn hole_and_written_zeros_are_the_same_content() {
        let x = vec![9u8; 4096];
        let sparse = file_with(&[(0, &x), (3 * 4096, &x)], 4 * 4096);
        let dense_zeros = file_with(&[(0, &x), (4096, &[0u8; 8192]), (3 * 4096, &x)], 4 * 4096);
        let (hs, hd) = (h(&sparse, 4 * 4096), h(&dense_zeros, 4 * 4096));
        assert_eq!(hs.map, hd.map);
        let d = dense(&hs);
        assert_eq!(d[1], 0);
        assert_eq!(d[0], d[3]);
    }

    #[test]
    fn one_byte_changes_one_block() {
        let mut data = vec![5u8; 3 * 4096];
        let a = file_with(&[(0, &data)], data.len() as u64);
        data[4096 + 17] = 6;
        let b = file_with(&[(0, &data)], data.len() as u64);
        let (ha, hb) = (dense(&h(&a, 12288)), dense(&h(&b, 12288)));
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
    }

    #[test]
    fn partial_tail_block_is_hashed() {
        let a = file_with(&[(0, &[1u8; 5000])], 5000);
        let ha = h(&a, 5000);
        assert_eq!(ha.map.len(), 2);
        assert_eq!(ha.bytes_read, 5000);
    }

    #[test]
    fn shrunk_file_is_an_error() {
        let a = file_with(&[(0, &[1u8; 5000])], 5000);
        let e = hash_file(&a, 9000, 4096, &mut Vec::new()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_huge_hole_costs_one_zero_run() {
        // 4 TiB apparent, one block of data near the end (tmpfs and most
        // filesystems allow this much sparse size).
        let size = 4u64 << 40;
        let off = size - (1 << 30);
        let f = file_with(&[(off, &[3u8; 4096])], size);
        let hf = h(&f, size);
        assert_eq!(hf.map.len(), size / 4096);
        assert!(hf.map.as_bytes().len() <= 32, "{:?}", hf.map);
        assert_eq!(hf.map.data_blocks().map(|(b, _)| b).collect::<Vec<_>>(), vec![off / 4096]);
        assert_eq!(hf.bytes_read, 4096);
    }
}
