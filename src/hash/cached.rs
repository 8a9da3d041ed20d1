//! Which pages of a file were in the page cache before the scan read them,
//! so that `--drop-cache` drops only the pages the scan brought in.
//!
//! `--drop-cache` (the systemd unit's) is there so that a nightly scan does
//! not evict the server's working set. It dropped every page it read,
//! those that were cached before too: the files a nightly run reads are
//! the changed ones, often the hot ones (a database, a mail spool), and
//! their cached pages were evicted by the very option meant to keep them.
//! So before the read reaches a window of [`WINDOW`] bytes, that window's
//! residency is asked (`mincore` on a mapping of it, which reads nothing),
//! far enough ahead that neither the kernel's read-ahead nor our own
//! (`hash::AHEAD`) has touched it yet; behind the read, only the pages
//! that were not resident are dropped, in whole [`ALIGN`] stretches. A
//! probe that fails counts its pages as not resident: dropped, as before.
//! A file that fits in one read is not probed: [`read_small`].

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::AsRawFd;

use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

/// Bytes of the file probed at once, and how far ahead of the read the
/// probes stay (read-ahead reaches a few MiB ahead at most, even with a
/// large `read_ahead_kb`). One byte of answer per page: 16 KiB a window.
const WINDOW: u64 = 64 << 20;

/// Drops cover whole 2 MiB stretches (the largest page-cache folio on
/// x86-64), up to the last such boundary behind the read, the rest once the
/// file is done: a drop of part of a folio leaves all of it cached, and
/// XFS reads ahead into folios larger than a chunk (dropped a chunk at a
/// time, 77 of 92 MiB read stayed cached).
const ALIGN: u64 = 2 << 20;

/// The page size the probes count in.
fn page() -> u64 {
    // SAFETY: `sysconf` only reads a constant of the system.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as u64
}

/// The residency of the windows of one file ahead of its read.
pub(super) struct Cached {
    size: u64,
    page: u64,
    /// Probed windows: start offset, one byte per page (bit 0: resident).
    windows: VecDeque<(u64, Vec<u8>)>,
    /// Offset up to which the read's pages were dropped (or kept).
    dropped_to: u64,
}

impl Cached {
    /// For `file` of `size` bytes; nothing is probed yet.
    fn new(size: u64) -> Cached {
        Cached { size, page: page(), windows: VecDeque::new(), dropped_to: 0 }
    }

    /// Before the read of `[pos, …)`: probe the window holding `pos` and
    /// the next one, if not done yet, and forget windows behind `pos`.
    fn ahead_of(&mut self, file: &File, pos: u64) {
        // Kept while pages of them may wait to be dropped (see `ALIGN`).
        self.windows.retain(|&(start, _)| start + WINDOW + ALIGN > pos);
        let first = pos / WINDOW * WINDOW;
        for start in [first, first + WINDOW] {
            if start < self.size && !self.windows.iter().any(|w| w.0 == start) {
                let len = WINDOW.min(self.size - start);
                self.windows.push_back((start, probe(file, start, len, self.page)));
            }
        }
    }

    /// The read reached `end`: drop from the page cache the pages before
    /// the last [`ALIGN`] boundary behind it (all of them at the end of the
    /// file) that were not resident when their window was probed.
    fn read_to(&mut self, file: &File, end: u64) {
        let to = if end >= self.size { self.size } else { end / ALIGN * ALIGN };
        if to > self.dropped_to {
            self.drop_range(file, self.dropped_to, to - self.dropped_to);
            self.dropped_to = to;
        }
    }

    /// The read is over (done, or stopped): drop what is left behind it,
    /// within the windows probed.
    fn finish(&mut self, file: &File, end: u64) {
        if end > self.dropped_to {
            self.drop_range(file, self.dropped_to, end - self.dropped_to);
            self.dropped_to = end;
        }
    }

    /// Drop the pages of `[pos, pos + len)` not resident when probed.
    fn drop_range(&self, file: &File, pos: u64, len: u64) {
        let (first, end) = (pos / self.page, (pos + len).div_ceil(self.page));
        let mut run: Option<u64> = None; // first page of a run to drop
        for p in first..=end {
            let drop = p < end && self.was_resident(p * self.page) == Some(false);
            match (drop, run) {
                (true, None) => run = Some(p),
                (false, Some(s)) => {
                    let (off, l) = (s * self.page, (p - s) * self.page);
                    let _ = posix_fadvise(file, off as i64, l as i64, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
                    run = None;
                }
                _ => {}
            }
        }
    }

    /// Whether the page at `off` was resident when probed; `None` where
    /// not probed (past the read: left as it is).
    fn was_resident(&self, off: u64) -> Option<bool> {
        let (start, v) = self.windows.iter().find(|(start, _)| (*start..*start + WINDOW).contains(&off))?;
        v.get(((off - start) / self.page) as usize).map(|b| b & 1 == 1)
    }
}

/// What `--drop-cache` does with one file's reads (see the module doc).
pub(super) enum DropBehind {
    /// Off: the page cache is left as the reads leave it.
    Keep,
    /// A file that fits in one read: the bytes of the last read that were
    /// cached before it ([`read_small`]).
    Small(u64),
    /// A larger file: its windows' residency ([`Cached`]).
    Large(Cached),
}

impl DropBehind {
    /// For a file of `size` bytes read `chunk` bytes at a time.
    pub(super) fn new(on: bool, size: u64, chunk: u64) -> DropBehind {
        match (on, size <= chunk) {
            (false, _) => DropBehind::Keep,
            (true, true) => DropBehind::Small(0),
            (true, false) => DropBehind::Large(Cached::new(size)),
        }
    }

    /// Read `buf.len()` bytes at `pos` (fewer at EOF): the residency of
    /// what is read is known first.
    pub(super) fn read(&mut self, file: &File, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
        match self {
            DropBehind::Keep => super::read_full_at(file, buf, pos),
            DropBehind::Small(before) => {
                let (got, cached) = read_small(file, buf, pos)?;
                *before = cached;
                Ok(got)
            }
            DropBehind::Large(c) => {
                c.ahead_of(file, pos);
                super::read_full_at(file, buf, pos)
            }
        }
    }

    /// `len` bytes at `pos` were read (and hashed): drop what the read
    /// brought into the page cache.
    pub(super) fn read_done(&mut self, file: &File, pos: u64, len: u64) {
        match self {
            DropBehind::Keep => {}
            DropBehind::Small(cached) => drop_small(file, pos, *cached, len),
            DropBehind::Large(c) => c.read_to(file, pos + len),
        }
    }

    /// The file's read is over: drop what is left of it (see
    /// [`Cached::finish`]).
    pub(super) fn finish(&mut self, file: &File, size: u64) {
        if let DropBehind::Large(c) = self {
            c.finish(file, size);
        }
    }
}

/// Read a file that fits in one read (`buf` its whole length) for a scan
/// that drops what it brings into the page cache: first what is cached,
/// without waiting (`RWF_NOWAIT`: up to the first page not cached), then
/// the rest. Returns the bytes read and how many of them were cached
/// before. Asking a small file's residency with `mincore` cost three calls
/// more per file (10% of a `--drop-cache` scan's time on 40,000 small
/// files); this costs one where nothing is cached and saves the read where
/// all is.
fn read_small(file: &File, buf: &mut [u8], pos: u64) -> std::io::Result<(usize, u64)> {
    use rustix::io::{preadv2, Errno, ReadWriteFlags};
    let cached = match preadv2(file, &mut [std::io::IoSliceMut::new(buf)], pos, ReadWriteFlags::NOWAIT) {
        Ok(n) => n,
        // Nothing cached, or a kernel or filesystem that cannot say.
        Err(Errno::AGAIN | Errno::NOTSUP | Errno::INVAL | Errno::INTR) => 0,
        Err(e) => return Err(e.into()),
    };
    let rest = if cached < buf.len() { super::read_full_at(file, &mut buf[cached..], pos + cached as u64)? } else { 0 };
    Ok((cached + rest, cached as u64))
}

/// After [`read_small`] read `len` bytes at `pos`, `cached` of them
/// cached before: drop the pages the read brought in.
fn drop_small(file: &File, pos: u64, cached: u64, len: u64) {
    let from = pos + cached / page() * page();
    if from < pos + len {
        let _ = posix_fadvise(file, from as i64, (pos + len - from) as i64, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
    }
}

/// `mincore` of `[off, off + len)` of `file` (`off` page-aligned), one byte
/// per page; all zero (not resident) if it cannot be asked.
fn probe(file: &File, off: u64, len: u64, page: u64) -> Vec<u8> {
    let mut v = vec![0u8; len.div_ceil(page) as usize];
    // SAFETY: a shared read-only mapping of `len` bytes of a file we hold
    // open, never dereferenced (mapping reads nothing), unmapped before
    // return; `mincore` writes one byte per page of it into `v`, which
    // holds that many.
    unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            off as i64,
        );
        if map == libc::MAP_FAILED {
            return v;
        }
        if libc::mincore(map, len as usize, v.as_mut_ptr()) != 0 {
            v.fill(0);
        }
        libc::munmap(map, len as usize);
    }
    v
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// Pages of `f` resident now.
    fn resident(f: &File, len: u64) -> usize {
        probe(f, 0, len, page()).iter().filter(|&&b| b & 1 == 1).count()
    }

    /// Of a file whose first half was cached and second half not, reading
    /// all of it and dropping what was read keeps the first half cached
    /// and drops the second.
    /// A synced file of `pages` pages of `byte`, none of them cached;
    /// `None` where the filesystem keeps everything in memory (tmpfs).
    fn uncached(pages: u64, byte: u8) -> Option<(tempfile::TempDir, File, u64)> {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let len = pages * page();
        std::fs::write(d.path().join("f"), vec![byte; len as usize]).unwrap();
        let f = File::open(d.path().join("f")).unwrap();
        f.sync_all().unwrap();
        let _ = posix_fadvise(&f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
        (resident(&f, len) == 0).then_some((d, f, len))
    }

    #[test]
    fn only_pages_not_cached_before_are_dropped() {
        let Some((_d, f, len)) = uncached(64, 7) else { return };
        // Read-ahead would bring in more than a half read: read all, then
        // drop the second half.
        let mut all = vec![0u8; len as usize];
        (&f).read_exact(&mut all).unwrap();
        let _ = posix_fadvise(&f, (len / 2) as i64, (len / 2) as i64, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
        assert_eq!(resident(&f, len), 32);
        let mut c = Cached::new(len);
        c.ahead_of(&f, 0);
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut all, 0).unwrap();
        assert_eq!(resident(&f, len), 64);
        c.read_to(&f, len);
        let v = probe(&f, 0, len, page());
        assert!(v[..32].iter().all(|b| b & 1 == 1), "the pages cached before were dropped: {v:?}");
        assert!(v[32..].iter().all(|b| b & 1 == 0), "the pages the read brought in stayed: {v:?}");
    }

    /// A small file read whole: what was cached is named and kept, the
    /// rest dropped.
    #[test]
    fn a_small_file_keeps_its_cached_prefix() {
        let Some((_d, f, len)) = uncached(16, 5) else { return };
        let mut buf = vec![0u8; len as usize];
        // All cached (just read): nothing to drop.
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, 0).unwrap();
        assert_eq!(read_small(&f, &mut buf, 0).unwrap(), (len as usize, len));
        let _ = posix_fadvise(&f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
        // The first 4 pages cached, then the read brings in the rest.
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf[..4 * page() as usize], 0).unwrap();
        let _ = posix_fadvise(&f, (4 * page()) as i64, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
        let (got, cached) = read_small(&f, &mut buf, 0).unwrap();
        assert_eq!((got, cached), (len as usize, 4 * page()));
        assert!(buf.iter().all(|&b| b == 5));
        drop_small(&f, 0, cached, len);
        assert_eq!(resident(&f, len), 4);
    }
}
