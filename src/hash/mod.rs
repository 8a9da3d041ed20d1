//! Block fingerprints.
//!
//! In: an open file and its expected size. Out: a [`FileHash`] whose
//! [`BlockMap`] holds one fingerprint per block (the first 8 bytes of the
//! block's SHA-256, kept as the 4-byte block-map fingerprint). Runs on the
//! rayon hashing threads; one call reads one file sequentially in large
//! chunks.
//!
//! Memory follows the file's *data*, never its apparent size: holes are
//! found with `SEEK_DATA`/`SEEK_HOLE` and appended to the map as one zero run
//! (8 bytes, however long), never read and never expanded, and every
//! allocation sized from the file is fallible ([`MapError`] →
//! `ErrorKind::OutOfMemory` / `FileTooLarge`), so a hostile sparse file costs
//! a per-file error at worst, not the run (issue 12). Holes and all-zero
//! blocks get the fingerprint [`ZERO_FP`] and are never used as matches:
//! sharing zeros frees nothing that a hole would not.
//!
//! **Physical extents (issue 14).** With an [`ExtentCache`], a file is mapped
//! with FIEMAP before it is read; an extent that FIEMAP flags `SHARED` and
//! whose logical↔physical mapping is provably linear block for block (no
//! `UNKNOWN`, `DELALLOC`, `ENCODED`, inline, tail-packed, unaligned or
//! unwritten flag; physical and logical offsets congruent modulo the block
//! size; only whole blocks) is hashed once per run: the fingerprints are kept
//! by physical block address, and a reflinked copy, a writable snapshot or
//! a file already deduplicated costs one FIEMAP call instead of a read.
//! Everything else is read as before.
//!
//! I/O: `POSIX_FADV_SEQUENTIAL` on open, `WILLNEED` on the next chunk before
//! hashing the current one (reading overlaps hashing), and with `--drop-cache`
//! `DONTNEED` on chunks already hashed, so a nightly scan does not evict the
//! server's working set. Off by default: the share phase rereads every
//! duplicate range (the kernel compares both sides), and finds it cached.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::sync::{Condvar, Mutex};

use nix::errno::Errno;
use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
use nix::unistd::{lseek, Whence};
use rustc_hash::FxHashMap;

use sha2::{Digest, Sha256};

use crate::blockmap::{BlockMap, MapError};
use crate::plan::{short_fp, Fp};
use crate::sys::fiemap::{self, flags, Extent};

/// Fingerprint of a block that is a hole or all zeros: never matched.
pub const ZERO_FP: u64 = 0;

/// Bytes read per `pread`: large enough that the disk streams.
pub const CHUNK: usize = 1 << 20;

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

/// The block-map fingerprint of one block's bytes.
fn block_fp(blk: &[u8]) -> Fp {
    if is_zero(blk) {
        0
    } else {
        let d: [u8; 32] = Sha256::digest(blk).into();
        short_fp(fingerprint(&d))
    }
}

/// Hash `file`, expected to be `size` bytes long, in blocks of `block_size`.
///
/// `buf` is a reusable read buffer (grown to [`CHUNK`]). A file that turns
/// out shorter than `size` yields an `UnexpectedEof` error: the caller treats
/// it as changed during the scan.
pub fn hash_file(file: &File, size: u64, block_size: u64, buf: &mut Vec<u8>) -> io::Result<FileHash> {
    hash_file_with(file, size, block_size, buf, false, None)
}

/// Whether a file of `size` bytes is mapped (FIEMAP) before it is read:
/// when it has more than one block. A one-block file is one `pread`, about
/// what the FIEMAP call costs; from two blocks on, a shared file saves its
/// reads (on the SMALL benchmark corpus, mapping from 64 KiB up left a full
/// rerun after a dedupe reading 67% of the first run's bytes, from two
/// blocks up 59%, at no measurable cost in scan time).
fn worth_mapping(size: u64, block_size: u64) -> bool {
    size > block_size
}

/// Bytes mapped per FIEMAP call at most, so the extent list stays bounded
/// (a fragmented file is mapped window by window as it is read).
const MAP_WINDOW: u64 = 256 << 20;

/// [`hash_file`], optionally dropping every chunk from the page cache once
/// it is hashed (`drop_behind`, see `--drop-cache`) and reusing the
/// fingerprints of physical extents hashed earlier in the run (`cache`).
pub fn hash_file_with(
    file: &File,
    size: u64,
    block_size: u64,
    buf: &mut Vec<u8>,
    drop_behind: bool,
    cache: Option<&ExtentCache>,
) -> io::Result<FileHash> {
    assert!(block_size.is_power_of_two() && block_size as usize <= CHUNK);
    if buf.len() < CHUNK {
        buf.try_reserve_exact(CHUNK - buf.len()).map_err(|_| map_err(MapError::OutOfMemory { blocks: 0 }))?;
        buf.resize(CHUNK, 0);
    }
    let mut h = Hasher {
        file,
        size,
        bs: block_size,
        buf,
        drop_behind,
        cache: cache.filter(|c| c.block_size == block_size && worth_mapping(size, block_size)),
        out: FileHash { size, map: BlockMap::new(), bytes_read: 0, bytes_reused: 0, cached: Vec::new() },
    };
    // A file that fits in one read is read in one `pread`: no hole search,
    // no read-ahead advice (four system calls fewer per small file; a hole
    // reads as zeros, which is what a hole hashes as anyway).
    let small = size <= CHUNK as u64;
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
            h.out.map.push_zeros((data_start - pos).div_ceil(block_size)).map_err(map_err)?;
            pos = data_start;
        }
        // A region ends on a block boundary or at EOF.
        let data_end = if data_end < size { data_end.div_ceil(block_size) * block_size } else { size }.min(size);
        if pos < data_end {
            h.region(pos, data_end)?;
            pos = data_end;
        }
    }
    debug_assert_eq!(h.out.map.len(), size.div_ceil(block_size));
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

/// Extent flags under which FIEMAP's physical address does not say where
/// each logical block's bytes are (or says it only for now): such extents
/// are always read. `NOT_ALIGNED`, `DATA_TAIL`, `DATA_ENCRYPTED` and
/// `MERGED` are not in `sys::fiemap::flags`.
const UNPROVABLE: u32 = flags::UNKNOWN
    | flags::DELALLOC
    | flags::ENCODED
    | flags::DATA_INLINE
    | flags::UNWRITTEN
    | 0x80 // DATA_ENCRYPTED
    | 0x100 // NOT_ALIGNED
    | 0x400 // DATA_TAIL
    | 0x1000; // MERGED

/// One file being hashed.
struct Hasher<'a> {
    file: &'a File,
    size: u64,
    bs: u64,
    buf: &'a mut Vec<u8>,
    drop_behind: bool,
    cache: Option<&'a ExtentCache>,
    out: FileHash,
}

impl Hasher<'_> {
    /// Hash the data region `[start, end)` (`start` block-aligned, `end`
    /// block-aligned or EOF): through the cache where FIEMAP proves a
    /// shared extent, by reading elsewhere.
    fn region(&mut self, start: u64, end: u64) -> io::Result<()> {
        let Some(cache) = self.cache else { return self.read(start, end) };
        let mut pos = start;
        while pos < end {
            let win_end = end.min(pos.saturating_add(MAP_WINDOW));
            let extents = match fiemap::fiemap(self.file.as_fd(), pos, win_end - pos) {
                Ok(e) => e,
                // No FIEMAP here: read everything.
                Err(_) => return self.read(pos, end),
            };
            let tail = tail_phys(&extents, self.bs, self.size);
            let whole_end = self.size / self.bs * self.bs;
            for (s, e, phys) in segments(&extents, pos, win_end, self.bs, self.size) {
                match (phys, tail) {
                    (Some(p), _) => self.reuse(cache, s, e, p)?,
                    (None, Some(tp)) if e == self.size && s <= whole_end => {
                        self.read(s, whole_end)?;
                        self.reuse_tail(cache, whole_end, tp)?;
                    }
                    (None, _) => self.read(s, e)?,
                }
            }
            pos = win_end;
        }
        Ok(())
    }

    /// Read and hash `[start, end)` in chunks.
    fn read(&mut self, start: u64, end: u64) -> io::Result<()> {
        let mut pos = start;
        while pos < end {
            let got = self.read_chunk(pos, end)?;
            for blk in self.buf[..got].chunks(self.bs as usize) {
                let fp = block_fp(blk);
                self.out.map.push_short(fp).map_err(map_err)?;
            }
            self.after_chunk(pos, got as u64);
            pos += got as u64;
        }
        Ok(())
    }

    /// Read the next chunk of `[pos, end)` into the buffer; returns its length.
    fn read_chunk(&mut self, pos: u64, end: u64) -> io::Result<usize> {
        let want = (end - pos).min(CHUNK as u64) as usize;
        let got = read_full_at(self.file, &mut self.buf[..want], pos)?;
        // Ask for the next chunk now, so the disk reads it while this
        // one is hashed.
        if pos + (got as u64) < self.size {
            advise(self.file, pos + got as u64, CHUNK as u64, PosixFadviseAdvice::POSIX_FADV_WILLNEED);
        }
        if got < want {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank while it was read"));
        }
        self.out.bytes_read += got as u64;
        Ok(got)
    }

    fn after_chunk(&self, pos: u64, len: u64) {
        if self.drop_behind {
            // A nightly scan must not evict the server's working set.
            advise(self.file, pos, len, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
        }
    }

    /// `[start, end)` (whole blocks) lies in a shared extent at physical
    /// address `phys`: take each chunk's fingerprints from the cache, or
    /// read it (once for all the files that share it) and remember them.
    fn reuse(&mut self, cache: &ExtentCache, start: u64, end: u64, phys: u64) -> io::Result<()> {
        let bs = self.bs;
        let piece = |pos: u64| {
            let len = (end - pos).min(CHUNK as u64);
            ((phys + (pos - start)) / bs, len / bs, len)
        };
        // The next chunk, claimed by this thread before it releases the
        // current one: the reader of a shared extent stays the reader (its
        // own read-ahead, in its own file's page cache, is what the next
        // read finds), while the copies' threads take each chunk from the
        // cache behind it.
        let mut ahead: Option<ClaimGuard<'_>> = None;
        let mut pos = start;
        while pos < end {
            let (pb, n, len) = piece(pos);
            let claim = match ahead.take() {
                Some(g) => Claim::Mine(g),
                None => cache.claim(pb, n),
            };
            match claim {
                Claim::Hit(fps) => {
                    for fp in fps {
                        self.out.map.push_short(fp).map_err(map_err)?;
                    }
                    self.out.bytes_reused += len;
                }
                Claim::Mine(guard) => {
                    let got = self.read_chunk(pos, pos + len)?;
                    let mut fps = Vec::with_capacity(n as usize);
                    for blk in self.buf[..got].chunks(self.bs as usize) {
                        let fp = block_fp(blk);
                        fps.push(fp);
                        self.out.map.push_short(fp).map_err(map_err)?;
                    }
                    if pos + len < end {
                        let (npb, nn, _) = piece(pos + len);
                        ahead = cache.try_claim(npb, nn);
                    }
                    guard.fill(&fps);
                    self.out.cached.push((pb, n));
                    self.after_chunk(pos, len);
                }
            }
            pos += len;
        }
        Ok(())
    }

    /// The partial last block `[start, size)` lies at physical address
    /// `phys` of a shared extent: its fingerprint is that of the first
    /// `size - start` bytes there, the same for every file that ends in this
    /// block at this length (a whole-file copy), so it is cached by both.
    fn reuse_tail(&mut self, cache: &ExtentCache, start: u64, phys: u64) -> io::Result<()> {
        let (pb, len) = (phys / self.bs, self.size - start);
        let fp = match cache.tail(pb, len) {
            Some(fp) => {
                self.out.bytes_reused += len;
                fp
            }
            None => {
                let got = self.read_chunk(start, self.size)?;
                let fp = block_fp(&self.buf[..got]);
                cache.fill_tail(pb, len, fp);
                self.out.cached.push((pb, 1));
                fp
            }
        };
        self.out.map.push_short(fp).map_err(map_err)
    }
}

/// Physical address of the partial last block, when it lies in a shared
/// extent whose mapping is provable (as for [`segments`]).
fn tail_phys(extents: &[Extent], bs: u64, size: u64) -> Option<u64> {
    let whole_end = size / bs * bs;
    if whole_end == size {
        return None;
    }
    let x = extents.iter().find(|x| x.logical <= whole_end && x.logical.saturating_add(x.length) >= size)?;
    let provable = x.is_shared() && x.flags & UNPROVABLE == 0 && x.physical % bs == x.logical % bs;
    provable.then(|| x.physical + (whole_end - x.logical))
}

/// Split `[start, end)` into segments `(start, end, physical address of
/// start)` along `extents`: `Some` only for a run of whole blocks inside one
/// shared extent whose mapping is linear block for block (see
/// [`UNPROVABLE`]); `None` for everything else, which is read.
fn segments(extents: &[Extent], start: u64, end: u64, bs: u64, size: u64) -> Vec<(u64, u64, Option<u64>)> {
    let mut out: Vec<(u64, u64, Option<u64>)> = Vec::new();
    let mut push = |s: u64, e: u64, p: Option<u64>| {
        if s >= e {
            return;
        }
        match (out.last_mut(), p) {
            (Some(last), None) if last.2.is_none() && last.1 == s => last.1 = e,
            _ => out.push((s, e, p)),
        }
    };
    // Only whole blocks can be reused: the partial last block's
    // fingerprint depends on where the file ends.
    let whole_end = size / bs * bs;
    let mut pos = start;
    for x in extents {
        let (xs, xe) = (x.logical.max(pos), x.logical.saturating_add(x.length).min(end));
        if xe <= pos {
            continue;
        }
        if xs >= end {
            break;
        }
        let provable = x.is_shared() && x.flags & UNPROVABLE == 0 && x.physical % bs == x.logical % bs;
        // Whole blocks of this extent within the window.
        let (bs_start, bs_end) = (xs.div_ceil(bs) * bs, (xe / bs * bs).min(whole_end));
        if provable && bs_start < bs_end {
            push(pos, bs_start, None);
            push(bs_start, bs_end, Some(x.physical + (bs_start - x.logical)));
            pos = bs_end;
        }
    }
    push(pos, end, None);
    out
}

/// Fingerprints of physical blocks hashed in this run, shared by the
/// hashing threads (issue 14: a reflinked copy is not read again).
///
/// Keyed by physical block number (address / block size), so copies that
/// share an extent at different logical offsets, or only part of it, find
/// each other. Bounded: two generations of at most `cap` blocks each; when
/// the young one is full the old one is dropped and the young one ages (a
/// hit is copied into the young generation, so what is in use survives).
/// At the default cap this is at most ~40 MB.
///
/// Parallel hashers of copies usually start together (files are hashed
/// largest first, and copies have the same size). A thread that finds a
/// chunk's blocks being read by another one waits for it rather than read
/// them too: the copies then advance in step behind one reader.
pub struct ExtentCache {
    block_size: u64,
    cap: usize,
    inner: Mutex<CacheInner>,
    filled: Condvar,
}

#[derive(Default)]
struct CacheInner {
    young: FxHashMap<u64, Fp>,
    old: FxHashMap<u64, Fp>,
    /// Partial last blocks: `(physical block, length)` → fingerprint.
    tails: FxHashMap<(u64, u64), Fp>,
    /// Physical block ranges `[start, end)` being read by some thread.
    busy: Vec<(u64, u64)>,
}

/// Physical blocks remembered per generation by default (4 GiB of data
/// with 4 KiB blocks, ~18 MB).
pub const CACHE_BLOCKS: usize = 1 << 20;

/// The answer of [`ExtentCache::claim`].
pub enum Claim<'c> {
    /// Every block was hashed already: their fingerprints.
    Hit(Vec<Fp>),
    /// Nobody has them: read them and [`ClaimGuard::fill`] (dropping the
    /// guard without filling lets a waiting thread read instead).
    Mine(ClaimGuard<'c>),
}

/// A claimed physical range; released on drop.
pub struct ClaimGuard<'c> {
    cache: &'c ExtentCache,
    range: (u64, u64),
}

impl ExtentCache {
    pub fn new(block_size: u64) -> ExtentCache {
        ExtentCache::with_capacity(block_size, CACHE_BLOCKS)
    }

    pub fn with_capacity(block_size: u64, cap: usize) -> ExtentCache {
        ExtentCache { block_size, cap, inner: Mutex::new(CacheInner::default()), filled: Condvar::new() }
    }

    /// The fingerprints of physical blocks `[pb, pb + n)`, or the right to
    /// read them. Waits while another thread reads any of them.
    pub fn claim(&self, pb: u64, n: u64) -> Claim<'_> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(fps) = g.lookup(pb, n, self.cap) {
                return Claim::Hit(fps);
            }
            if g.busy.iter().any(|&(s, e)| s < pb + n && pb < e) {
                g = self.filled.wait(g).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            g.busy.push((pb, pb + n));
            return Claim::Mine(ClaimGuard { cache: self, range: (pb, pb + n) });
        }
    }

    /// Claim `[pb, pb + n)` if nobody has hashed or is reading any of it;
    /// never waits (the caller holds another claim).
    pub fn try_claim(&self, pb: u64, n: u64) -> Option<ClaimGuard<'_>> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let known = (pb..pb + n).any(|b| g.young.contains_key(&b) || g.old.contains_key(&b));
        if known || g.busy.iter().any(|&(s, e)| s < pb + n && pb < e) {
            return None;
        }
        g.busy.push((pb, pb + n));
        Some(ClaimGuard { cache: self, range: (pb, pb + n) })
    }

    /// Forget physical blocks `[pb, pb + n)` (their file changed while it
    /// was read: what we hashed may not be what the blocks hold).
    pub fn forget(&self, ranges: &[(u64, u64)]) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for &(pb, n) in ranges {
            for b in pb..pb + n {
                g.young.remove(&b);
                g.old.remove(&b);
            }
            g.tails.retain(|&(b, _), _| !(pb..pb + n).contains(&b));
        }
    }

    /// The fingerprint of the first `len` bytes of physical block `pb`, if
    /// a file ending there was hashed. Tails are not claimed: two threads
    /// may both read one block, which costs less than waiting.
    pub fn tail(&self, pb: u64, len: u64) -> Option<Fp> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.tails.get(&(pb, len)).copied()
    }

    pub fn fill_tail(&self, pb: u64, len: u64, fp: Fp) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.tails.len() >= self.cap / 4 {
            g.tails.clear();
        }
        g.tails.insert((pb, len), fp);
    }
}

impl CacheInner {
    fn lookup(&mut self, pb: u64, n: u64, cap: usize) -> Option<Vec<Fp>> {
        let mut fps = Vec::with_capacity(n as usize);
        let mut from_old = false;
        for b in pb..pb + n {
            let fp = match self.young.get(&b) {
                Some(&fp) => fp,
                None => {
                    from_old = true;
                    *self.old.get(&b)?
                }
            };
            fps.push(fp);
        }
        if from_old {
            self.insert(pb, &fps, cap);
        }
        Some(fps)
    }

    fn insert(&mut self, pb: u64, fps: &[Fp], cap: usize) {
        if self.young.len() + fps.len() > cap {
            self.old = std::mem::take(&mut self.young);
        }
        for (i, &fp) in fps.iter().enumerate() {
            self.young.insert(pb + i as u64, fp);
        }
    }
}

impl ClaimGuard<'_> {
    /// Remember the fingerprints read for the claimed range, and release it.
    pub fn fill(self, fps: &[Fp]) {
        debug_assert_eq!(fps.len() as u64, self.range.1 - self.range.0);
        let mut g = self.cache.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.insert(self.range.0, fps, self.cache.cap);
    }
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        let mut g = self.cache.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.busy.retain(|&r| r != self.range);
        drop(g);
        self.cache.filled.notify_all();
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

    #[test]
    fn segments_reuse_only_whole_blocks_of_provable_shared_extents() {
        let bs = 4096;
        let shared = flags::SHARED;
        let ext = |logical, physical, length, flags| Extent { logical, physical, length, flags };
        // Aligned shared extent, then an unshared one, then a compressed
        // shared one, then a shared one ending in the partial last block.
        let x = [
            ext(0, 1 << 20, 8 * bs, shared),
            ext(8 * bs, 2 << 20, 4 * bs, 0),
            ext(12 * bs, 3 << 20, 4 * bs, shared | flags::ENCODED),
            ext(16 * bs, 4 << 20, 4 * bs, shared | flags::LAST),
        ];
        let size = 19 * bs + 100;
        let segs = segments(&x, 0, size, bs, size);
        assert_eq!(
            segs,
            vec![
                (0, 8 * bs, Some(1 << 20)),
                (8 * bs, 16 * bs, None),
                (16 * bs, 19 * bs, Some(4 << 20)),
                (19 * bs, size, None)
            ]
        );
        // Physical address not congruent with the logical one: read.
        let odd = [ext(0, (1 << 20) + 512, 8 * bs, shared)];
        assert_eq!(segments(&odd, 0, 8 * bs, bs, 8 * bs), vec![(0, 8 * bs, None)]);
        // An extent starting mid-window and mid-block: only its whole blocks.
        let mid = [ext(bs + 512, (1 << 20) + 512, 4 * bs, shared)];
        assert_eq!(
            segments(&mid, 0, 8 * bs, bs, 8 * bs),
            vec![(0, 2 * bs, None), (2 * bs, 5 * bs, Some((1 << 20) + bs)), (5 * bs, 8 * bs, None)]
        );
    }

    #[test]
    fn a_partial_tail_is_reused_only_from_a_provable_shared_extent() {
        let bs = 4096;
        let ext = |flags| [Extent { logical: 0, physical: 1 << 20, length: 3 * bs, flags }];
        assert_eq!(tail_phys(&ext(flags::SHARED), bs, 2 * bs + 10), Some((1 << 20) + 2 * bs));
        assert_eq!(tail_phys(&ext(0), bs, 2 * bs + 10), None);
        assert_eq!(tail_phys(&ext(flags::SHARED | flags::ENCODED), bs, 2 * bs + 10), None);
        // No partial block, or one the extent does not reach.
        assert_eq!(tail_phys(&ext(flags::SHARED), bs, 3 * bs), None);
        assert_eq!(tail_phys(&ext(flags::SHARED), bs, 3 * bs + 10), None);
        let c = ExtentCache::new(bs);
        assert_eq!(c.tail(7, 10), None);
        c.fill_tail(7, 10, 99);
        assert_eq!((c.tail(7, 10), c.tail(7, 11)), (Some(99), None));
        c.forget(&[(7, 1)]);
        assert_eq!(c.tail(7, 10), None);
    }

    #[test]
    fn cache_hands_out_what_one_reader_filled() {
        let c = ExtentCache::with_capacity(4096, 8);
        let Claim::Mine(g) = c.claim(100, 4) else { panic!("empty cache hit") };
        g.fill(&[1, 2, 3, 4]);
        match c.claim(101, 2) {
            Claim::Hit(fps) => assert_eq!(fps, vec![2, 3]),
            Claim::Mine(_) => panic!("miss"),
        }
        // Partly known: read again.
        assert!(matches!(c.claim(102, 4), Claim::Mine(_)));
        // Over capacity, the young generation ages; both stay visible.
        let Claim::Mine(g) = c.claim(200, 6) else { panic!() };
        g.fill(&[5; 6]);
        assert!(matches!(c.claim(100, 4), Claim::Hit(_)));
        // Claiming ahead never takes what is known or being read.
        assert!(c.try_claim(103, 2).is_none());
        let ahead = c.try_claim(300, 2).expect("free");
        assert!(c.try_claim(301, 1).is_none());
        drop(ahead);
        assert!(c.try_claim(301, 1).is_some());
        c.forget(&[(100, 1)]);
        assert!(matches!(c.claim(100, 4), Claim::Mine(_)));
    }

    #[test]
    fn a_waiting_thread_gets_the_readers_fingerprints() {
        let c = ExtentCache::new(4096);
        let Claim::Mine(g) = c.claim(0, 2) else { panic!() };
        std::thread::scope(|s| {
            let waiter = s.spawn(|| match c.claim(1, 1) {
                Claim::Hit(fps) => fps,
                Claim::Mine(_) => panic!("read twice"),
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            g.fill(&[7, 8]);
            assert_eq!(waiter.join().unwrap(), vec![8]);
        });
    }
}
