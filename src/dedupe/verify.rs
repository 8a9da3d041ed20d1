//! The dry run: every request the share phase would submit is compared
//! byte for byte in user space instead, with the same plan and the same
//! FIEMAP checks, so the preview counts what a real run would share.

use std::fs::File;
use std::os::unix::fs::FileExt;

use super::executor::{Executor, Target};

impl Executor<'_> {
    /// Compare `src[off+done..][..chunk]` with the same part of every
    /// destination still `alive`; a destination that differs or cannot be
    /// read is dropped from the rest of the range.
    pub(super) fn verify(
        &mut self,
        src: &File,
        off: u64,
        done: u64,
        chunk: u64,
        dests: &[Target<'_>],
        alive: &mut [bool],
    ) {
        for (k, d) in dests.iter().enumerate() {
            if !alive[k] {
                continue;
            }
            match self.compare(src, off + done, d, d.off + done, chunk) {
                Ok(true) => {
                    self.out.duplicate_bytes += chunk;
                    self.out.status.same += 1;
                }
                Ok(false) => {
                    self.out.status.differs += 1;
                    alive[k] = false;
                }
                Err(e) => {
                    self.dest_error(d.id, &e.to_string(), "read");
                    alive[k] = false;
                }
            }
        }
    }

    /// Our own byte-for-byte compare, for dry runs.
    fn compare(&mut self, a: &File, a_off: u64, d: &Target<'_>, b_off: u64, len: u64) -> std::io::Result<bool> {
        let mut pos = 0;
        while pos < len {
            let n = ((len - pos) as usize).min(self.buf_a.len());
            a.read_exact_at(&mut self.buf_a[..n], a_off + pos)?;
            d.file.read_exact_at(&mut self.buf_b[..n], b_off + pos)?;
            if self.buf_a[..n] != self.buf_b[..n] {
                return Ok(false);
            }
            pos += n as u64;
        }
        Ok(true)
    }
}
