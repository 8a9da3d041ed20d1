//! The dry run: every request the share phase would submit is compared
//! byte for byte in user space instead, with the same plan and the same
//! FIEMAP checks, so the preview counts what a real run would share.
//!
//! Also where a range found different is explained ([`Executor::explain_differs`]):
//! the plan matched its blocks by their recorded fingerprints, so either
//! two different blocks share a 48-bit fingerprint (a collision, which
//! reading again would repeat), or one of the two files no longer holds
//! what was hashed although its size and times say it does. The second
//! happens: a write through a shared memory mapping to a page already
//! dirty changes no time, and on kernels before 6.13 neither does a write
//! in the same clock tick as the file's last change. Such files are
//! recorded to be read again by the next run; otherwise their stale
//! fingerprints would stand until the file changes again, missing its
//! copies for good.

use std::fs::File;
use std::os::unix::fs::FileExt;

use super::executor::{Executor, Target};
use super::unreadable::ReadFailures;

impl Executor<'_> {
    /// Compare `src[off+done..][..chunk]` with the same part of every
    /// destination still `alive`; a destination that differs is dropped
    /// from the rest of the range. Those that could not be compared for a
    /// read error are returned, for [`Executor::read_failures`] to find out
    /// which side it was.
    pub(super) fn verify(
        &mut self,
        src: &Target<'_>,
        done: u64,
        chunk: u64,
        dests: &[Target<'_>],
        alive: &mut [bool],
    ) -> ReadFailures {
        let mut failed = ReadFailures::new();
        for (k, d) in dests.iter().enumerate() {
            if !alive[k] {
                continue;
            }
            match self.first_difference(src.file, src.off + done, d.file, d.off + done, chunk) {
                Ok(None) => {
                    self.out.duplicate_bytes += chunk;
                    self.out.status.same += 1;
                }
                Ok(Some(fps)) => {
                    self.out.status.differs += 1;
                    self.note_differs(src, d, fps);
                    alive[k] = false;
                }
                Err(e) => failed.push((k, e)),
            }
        }
        failed
    }

    /// After the kernel found `src` and `d` different from `done` bytes on
    /// (the next `chunk` at most): find out why, and have the next run read
    /// the two files again if their fingerprints are stale. Unreadable now:
    /// left as it is (the next run's open says why).
    pub(super) fn explain_differs(&mut self, src: &Target<'_>, d: &Target<'_>, done: u64, chunk: u64) {
        if let Ok(Some(fps)) = self.first_difference(src.file, src.off + done, d.file, d.off + done, chunk) {
            self.note_differs(src, d, fps);
        }
    }

    /// Blocks matched by the plan, different now, whose fingerprints
    /// (`fps`: source's, destination's, unsalted) differ too: the recorded
    /// ones of one file or both are stale. Equal fingerprints are a
    /// collision: the next run would find the same.
    fn note_differs(&mut self, src: &Target<'_>, d: &Target<'_>, fps: (u64, u64)) {
        if fps.0 == fps.1 {
            return;
        }
        for id in [src.id, d.id] {
            if self.out.stale.insert(id) {
                let path = self.path_of(id);
                self.progress.info(&format!(
                    "{path}: contents changed since it was hashed, though its size and times did not; \
                     read again next run"
                ));
            }
        }
    }

    /// Our own byte-for-byte compare of `len` bytes: `None` when equal, else
    /// the fingerprints ([`crate::hash::block_fp`]) of the first block that
    /// differs, in `a` and in `b`. Both offsets are block-aligned.
    fn first_difference(
        &mut self,
        a: &File,
        a_off: u64,
        b: &File,
        b_off: u64,
        len: u64,
    ) -> std::io::Result<Option<(u64, u64)>> {
        let mut pos = 0;
        while pos < len {
            let n = ((len - pos) as usize).min(self.buf_a.len());
            a.read_exact_at(&mut self.buf_a[..n], a_off + pos)?;
            b.read_exact_at(&mut self.buf_b[..n], b_off + pos)?;
            let (a, b) = (&self.buf_a[..n], &self.buf_b[..n]);
            if let Some(blk) = first_differing_block(a, b, self.block_size as usize) {
                let fp = crate::hash::block_fp;
                return Ok(Some((fp(&a[blk.clone()]), fp(&b[blk]))));
            }
            pos += n as u64;
        }
        Ok(None)
    }
}

/// The first block of `a` and `b` (equal lengths, both starting on a block
/// boundary) whose bytes differ, as a range of indices: a whole block, or
/// the short last one as the hasher saw it at the end of the file.
fn first_differing_block(a: &[u8], b: &[u8], bs: usize) -> Option<std::ops::Range<usize>> {
    let i = a.iter().zip(b).position(|(x, y)| x != y)?;
    let start = i / bs * bs;
    Some(start..(start + bs).min(a.len()))
}

#[cfg(test)]
mod tests {
    use super::first_differing_block;

    #[test]
    fn the_first_differing_block_is_whole_or_the_tail() {
        let a = vec![7u8; 10_000];
        let mut b = a.clone();
        assert_eq!(first_differing_block(&a, &b, 4096), None);
        b[4096] = 0;
        b[9_999] = 0;
        assert_eq!(first_differing_block(&a, &b, 4096), Some(4096..8192));
        b[4096] = 7;
        assert_eq!(first_differing_block(&a, &b, 4096), Some(8192..10_000));
        b[0] = 1;
        assert_eq!(first_differing_block(&a, &b, 4096), Some(0..4096));
    }
}
