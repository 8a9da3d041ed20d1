//! A request whose destinations met a read error (`EIO`: a bad sector, a
//! btrfs checksum failure). The kernel's answer does not say which side it
//! could not read, so the source's part of the request is read once more,
//! here, to tell:
//! - the source cannot be read: its copies are not to blame. They are
//!   shared with each other instead, from the first of them, for the rest
//!   of the range, and the source is named once (three copies of a file
//!   whose original had one bad block freed nothing before, every night);
//! - the source reads: the destination is the damaged one, and is named.
//!
//! Nothing damaged is ever made a source of anything: the kernel compares
//! every byte, and a block it cannot read is not shared.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

use super::executor::{Executor, Target};
use super::extents::unshared;
use super::workers::locked;

/// The destinations of one request that could not be compared for a read
/// error: their index in the request's destinations, and the error.
pub(super) type ReadFailures = Vec<(usize, std::io::Error)>;

impl Executor<'_> {
    /// After the request at `done` (`chunk` bytes) of range `source`
    /// (`len` bytes) into `dests`: deal with the destinations in `failed`
    /// (see the module doc), which take no part in the rest of the range
    /// (`alive`). `kind` is what a destination's error is counted as.
    pub(super) fn read_failures(
        &mut self,
        source: &Target<'_>,
        (len, done, chunk): (u64, u64, u64),
        dests: &[Target<'_>],
        failed: ReadFailures,
        alive: &mut [bool],
        kind: &str,
    ) {
        if failed.is_empty() {
            return;
        }
        failed.iter().for_each(|&(k, _)| alive[k] = false);
        let Some(e) = read_error(source.file, source.off + done, chunk, &mut self.buf_a) else {
            for (k, e) in failed {
                self.dest_error(dests[k].id, &format!("cannot be read ({e}); not shared"), kind);
            }
            return;
        };
        self.source_unreadable(source, &e, failed.len() - 1, kind);
        let at = |k: usize| dests[k].at(done);
        if let Some((&(first, _), rest)) = failed.split_first() {
            let rest: Vec<Target<'_>> = rest.iter().map(|&(k, _)| at(k)).collect();
            self.among_copies(&at(first), len - done, &rest);
        }
    }

    /// Share `len` bytes of `first` into each of `rest`, where they do not
    /// share its blocks already (FIEMAP): a nightly run on an unchanged
    /// volume submits nothing again, damaged source or not.
    fn among_copies(&mut self, first: &Target<'_>, len: u64, rest: &[Target<'_>]) {
        if rest.is_empty() {
            return;
        }
        let Some(src) = self.map(first.file.as_fd(), first.id, first.off, len) else { return };
        for d in rest {
            let Some(dst) = self.map(d.file.as_fd(), d.id, d.off, len) else { continue };
            let parts = unshared(&src.extents, first.off, &dst.extents, d.off, self.block_size, len);
            self.out.already_shared_bytes += len - parts.iter().map(|p| p.1).sum::<u64>();
            for (o, l) in parts {
                self.submit(&first.at(o), l, &[d.at(o)]);
            }
        }
    }

    /// Name an unreadable source once per run and count it (as `kind`):
    /// `others` of its copies are shared with each other instead.
    fn source_unreadable(&mut self, source: &Target<'_>, e: &std::io::Error, others: usize, kind: &str) {
        if !locked(&self.ctx.unreadable).insert(source.id) {
            return;
        }
        *self.out.status.errors.entry(kind.to_owned()).or_default() += 1;
        let instead = match others {
            0 => "its copy is left as it is".to_owned(),
            n => format!("its {} copies are shared with each other instead", n + 1),
        };
        let path = self.path_of(source.id);
        self.progress.warn(&format!(
            "{path}: cannot be read ({e}); not used as a source, {instead}; the disk may be failing (see the kernel log)"
        ));
    }
}

/// The first error reading `len` bytes of `f` from `off`, through `buf`
/// (`None`: it reads).
fn read_error(f: &File, off: u64, len: u64, buf: &mut [u8]) -> Option<std::io::Error> {
    let mut pos = 0;
    while pos < len {
        let n = ((len - pos) as usize).min(buf.len());
        match f.read_at(&mut buf[..n], off + pos) {
            Ok(0) => return None,
            Ok(k) => pos += k as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Some(e),
        }
    }
    None
}
