//! Extent reuse (issue 14): each physical extent is hashed once per run.
//!
//! With an [`ExtentCache`], a file is mapped
//! with FIEMAP before it is read; an extent that FIEMAP flags `SHARED` and
//! whose logical↔physical mapping is provably linear block for block (no
//! `UNKNOWN`, `DELALLOC`, `ENCODED`, inline, tail-packed, unaligned or
//! unwritten flag; physical and logical offsets congruent modulo the block
//! size; only whole blocks) is hashed once per run: the fingerprints are kept
//! by physical block address, and a reflinked copy, a writable snapshot or
//! a file already deduplicated costs one FIEMAP call instead of a read.
//! Everything else is read as before.

use std::io;
use std::os::fd::AsFd;
use std::sync::{Condvar, Mutex};

use rustc_hash::FxHashMap;

use super::{block_fp, record, Hasher};
use crate::blockmap::Fp;
use crate::sys::fiemap::{self, Extent};

/// Whether a file of `size` bytes is mapped (FIEMAP) before it is read:
/// when it has more than one block. A one-block file is one `pread`, about
/// what the FIEMAP call costs; from two blocks on, a shared file saves its
/// reads (on the SMALL benchmark corpus, mapping from 64 KiB up left a full
/// rerun after a dedupe reading 67% of the first run's bytes, from two
/// blocks up 59%, at no measurable cost in scan time).
pub(super) fn worth_mapping(size: u64, block_size: u64) -> bool {
    size > block_size
}

/// Bytes mapped per FIEMAP call at most, so the extent list stays bounded
/// (a fragmented file is mapped window by window as it is read).
const MAP_WINDOW: u64 = 256 << 20;

impl Hasher<'_> {
    /// Hash the data region `[start, end)` (`start` block-aligned, `end`
    /// block-aligned or EOF): through the cache where FIEMAP proves a
    /// shared extent, by reading elsewhere.
    pub(super) fn region(&mut self, start: u64, end: u64) -> io::Result<()> {
        let Some(cache) = self.cache else { return self.read(start, end) };
        let mut pos = start;
        while pos < end {
            let win_end = end.min(pos.saturating_add(MAP_WINDOW));
            let extents = match fiemap::fiemap(self.file.as_fd(), pos, win_end - pos) {
                Ok(e) => e,
                // No FIEMAP here: read everything.
                Err(_) => {
                    self.mapped = Some(false);
                    return self.read(pos, end);
                }
            };
            let own = extents.iter().all(|e| !e.is_shared() && !e.is_inline());
            self.mapped = Some(self.mapped.unwrap_or(true) && own);
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

    /// `[start, end)` (whole blocks) lies in a shared extent at physical
    /// address `phys`: take each chunk's fingerprints from the cache, or
    /// read it (once for all the files that share it) and remember them.
    fn reuse(&mut self, cache: &ExtentCache, start: u64, end: u64, phys: u64) -> io::Result<()> {
        let (bs, chunk) = (self.bs, self.chunk());
        let piece = |pos: u64| {
            let len = (end - pos).min(chunk);
            ((phys + (pos - start)) / bs, len / bs, len)
        };
        // The next chunk, claimed by this thread before it releases the
        // current one: the reader of a shared extent stays the reader (its
        // own read-ahead, in its own file's page cache, is what the next
        // read finds), while the copies' threads take each chunk from the
        // cache behind it.
        self.shared_run(start / bs, phys / bs, (end - start) / bs);
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
                        self.push(fp)?;
                    }
                    self.out.bytes_reused += len;
                }
                Claim::Mine(guard) => {
                    let got = self.read_chunk(pos, pos + len)?;
                    let mut fps = Vec::with_capacity(n as usize);
                    for blk in self.buf[..got].chunks(self.bs as usize) {
                        let fp = block_fp(blk);
                        fps.push(fp);
                        record(&mut self.out, self.salt, fp)?;
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

    /// Note `n` blocks from block `block` at physical block `pb`, merged
    /// with the run before when they continue it.
    fn shared_run(&mut self, block: u64, pb: u64, n: u64) {
        match self.out.shared_runs.last_mut() {
            Some((b, p, len)) if *b + *len == block && *p + *len == pb => *len += n,
            _ => self.out.shared_runs.push((block, pb, n)),
        }
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
        self.push(fp)
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
    let provable = x.is_shared() && x.is_block_exact() && x.physical % bs == x.logical % bs;
    provable.then(|| x.physical + (whole_end - x.logical))
}

/// Split `[start, end)` into segments `(start, end, physical address of
/// start)` along `extents`: `Some` only for a run of whole blocks inside one
/// shared extent whose mapping is linear block for block (see
/// [`Extent::is_block_exact`]); `None` for everything else, which is read.
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
        let provable = x.is_shared() && x.is_block_exact() && x.physical % bs == x.logical % bs;
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
/// Files are hashed in the order the crawl finds them, so copies are often
/// hashed at the same time. A thread that finds a chunk's blocks being read
/// by another one waits for it rather than read them too: the copies then
/// advance in step behind one reader.
pub struct ExtentCache {
    /// Block size the fingerprints are of: a file hashed with another one
    /// does not use the cache.
    pub(super) block_size: u64,
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
    /// An empty cache of [`CACHE_BLOCKS`] blocks per generation, for
    /// fingerprints of `block_size` blocks.
    pub fn new(block_size: u64) -> ExtentCache {
        ExtentCache::with_capacity(block_size, CACHE_BLOCKS)
    }

    /// An empty cache of `cap` blocks per generation (tests use a small one).
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

    /// Remember the fingerprint of the first `len` bytes of physical block
    /// `pb` (bounded: the tails are dropped together when a quarter of the
    /// capacity is reached).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::fiemap::flags;

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
