//! Getting a request's pages into the page cache before the kernel's
//! compare inside `FIDEDUPERANGE` reads them: read-ahead advice for the
//! current and the next request, and, when the data comes from disk
//! ([`super::Sharing::from_disk`]), a read of our own.

use std::fs::File;
use std::os::unix::fs::FileExt;

use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

use super::executor::{Executor, Target};
use crate::sys::dedupe::MAX_REQUEST_LEN;

impl Executor<'_> {
    /// Get the pages of the request at `done` (`chunk` bytes of the
    /// `len` from `off` in `src`, and the same in the destinations `idx` of
    /// `dests`) into the page cache before the kernel compares them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn get_ready(
        &mut self,
        src: &File,
        off: u64,
        len: u64,
        done: u64,
        chunk: u64,
        dests: &[Target<'_>],
        idx: &[usize],
    ) {
        if done == 0 {
            prefetch(src, off, chunk);
            idx.iter().for_each(|&k| prefetch(dests[k].file, dests[k].off, chunk));
        }
        // The next chunk is read while the kernel compares this one (no
        // longer than this one: see `workers::request_len`).
        let next = (len - done - chunk).min(chunk);
        if next > 0 {
            prefetch(src, off + done + chunk, next);
            idx.iter().for_each(|&k| prefetch(dests[k].file, dests[k].off + done + chunk, next));
        }
        if self.ctx.from_disk {
            // The prefetch put every file's reads in flight at once; wait
            // for them here, reading what read-ahead found no room for in
            // large requests, not page by page in the kernel's compare
            // (`Sharing::from_disk`).
            self.read_into_cache(src, off + done, chunk);
            idx.iter().for_each(|&k| self.read_into_cache(dests[k].file, dests[k].off + done, chunk));
        }
    }

    /// Read `f[off..off+len]` through the page cache into the scratch
    /// buffer, so the kernel's compare finds it there. Only a warm-up: the
    /// first error or end of file ends it quietly (the request then meets
    /// it, and says so).
    fn read_into_cache(&mut self, f: &File, off: u64, len: u64) {
        let mut pos = 0;
        while pos < len {
            let n = ((len - pos) as usize).min(self.buf_a.len());
            match f.read_at(&mut self.buf_a[..n], off + pos) {
                Ok(0) | Err(_) => return,
                Ok(k) => pos += k as u64,
            }
        }
    }
}

/// Ask the kernel to read `f[off..off+len]` into the page cache now, in
/// large asynchronous requests. `FIDEDUPERANGE` compares page by page and
/// reads a missing page synchronously, without read-ahead: on data that is
/// not cached (`--drop-cache`, or a volume larger than memory) it would wait
/// for the disk once per 4 KiB. On cached data this costs a page-cache
/// lookup per page. Only advice: errors are ignored.
fn prefetch(f: &File, off: u64, len: u64) {
    let _ = posix_fadvise(f, off as i64, len as i64, PosixFadviseAdvice::POSIX_FADV_WILLNEED);
}

/// [`prefetch`] the request at `at` of a stretch of `f` ending at `end`,
/// and the next one, which is then read while the kernel compares this
/// one. For the zero pass, whose requests come one at a time: without it
/// the zeros of an image whose pages are not cached (dropped after the
/// scan, or clones the scan never read) were read a page at a time, 101
/// clones of a 64 MiB image in 19 s against 1.2 s cached.
pub(crate) fn prefetch_request(f: &File, at: u64, end: u64) {
    prefetch(f, at, (end - at).min(2 * MAX_REQUEST_LEN));
}
