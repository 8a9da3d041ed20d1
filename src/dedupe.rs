//! Executing a plan: share ranges with `FIDEDUPERANGE`, or, in a dry run,
//! compare them byte for byte in user space so the preview is exact.
//!
//! In: a [`Plan`] and the scanned facts of every file it names. Out: an
//! [`Outcome`] with verified, submitted and confirmed bytes and every
//! per-destination status. Runs on the calling thread, one source at a time.
//!
//! Before a file is used its identity (device, inode, size, mtime, ctime) is
//! checked against the scan; a file that changed since is left for the next
//! run. Blocks whose source and destination already map to the same
//! physical extent (FIEMAP) are not submitted again, so a second run on an
//! unchanged volume submits nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::errno::Errno;

use crate::bookend::{self, DestExtent};
use crate::plan::{Plan, Range};
use crate::progress::Progress;
use crate::report::{display_path, DedupeStatuses};
use crate::sys::fiemap::{flags as fiemap_flags, physical_map};
use crate::sys::{self, dedupe::MAX_DESTS, dedupe::MAX_REQUEST_LEN, DedupeStatus, DestResult};
use crate::types::FileId;
use crate::walk::Candidate;

/// Whether to share for real.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Compare in user space, share nothing.
    DryRun,
    /// Submit to the kernel.
    Share,
}

/// What executing a plan did.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    /// Bytes verified equal (dry run) or submitted to the kernel.
    pub duplicate_bytes: u64,
    /// Bytes the kernel confirmed shared.
    pub deduped_bytes: u64,
    /// Bytes skipped because they already share the source's extents.
    pub already_shared_bytes: u64,
    pub status: DedupeStatuses,
    /// Files that changed since the scan and were left alone.
    pub changed_files: u64,
    /// Files whose data is inline in metadata (btrfs): nothing to share.
    pub inline_files: u64,
    /// Bytes of partly covered extents copied into fresh extents so the old
    /// ones can be freed (btrfs); in a dry run, what would be.
    pub rewritten_bytes: u64,
    /// Files that could not be opened or mapped.
    pub errors: BTreeMap<String, u64>,
    /// Set when sharing was stopped because the filesystem refuses it.
    pub refused: Option<String>,
}

/// One destination of a source range, maybe split into the sub-ranges that
/// are not shared yet (offsets relative to the range start).
struct Dest {
    id: FileId,
    file: File,
    off: u64,
    parts: Vec<(u64, u64)>,
}

/// One destination of one request: borrows the open file of a [`Dest`].
struct Target<'f> {
    id: FileId,
    file: &'f File,
    off: u64,
}

impl Dest {
    fn target(&self, rel: u64) -> Target<'_> {
        Target { id: self.id, file: &self.file, off: self.off + rel }
    }
}

struct Executor<'a> {
    files: &'a HashMap<FileId, Candidate>,
    block_size: u64,
    mode: Mode,
    progress: &'a dyn Progress,
    bad: HashSet<FileId>,
    inline: HashSet<FileId>,
    out: Outcome,
    buf_a: Vec<u8>,
    buf_b: Vec<u8>,
}

/// Rewriting remainders of partly covered extents (btrfs; see [`crate::bookend`]).
#[derive(Debug, Clone)]
pub struct Bookends {
    /// A directory on the same filesystem for the unnamed temporary files.
    pub tmp_dir: PathBuf,
    /// Rewrite a remainder only when it is at most this many times the
    /// covered part of its extent.
    pub max_ratio: f64,
}

/// Execute `plan`. `stop` is polled between source ranges. With
/// `bookends`, partly covered destination extents are freed first.
pub fn execute(
    plan: &Plan,
    files: &HashMap<FileId, Candidate>,
    block_size: u64,
    mode: Mode,
    bookends: Option<&Bookends>,
    progress: &dyn Progress,
    stop: &AtomicBool,
) -> Outcome {
    let mut ex = Executor {
        files,
        block_size,
        mode,
        progress,
        bad: HashSet::new(),
        inline: HashSet::new(),
        out: Outcome::default(),
        buf_a: vec![0; 1 << 20],
        buf_b: vec![0; 1 << 20],
    };
    if let Some(b) = bookends {
        // Before any range is shared: a rewritten remainder may be the
        // source of other ranges, which must then share its new extent.
        ex.free_bookends(plan, b, stop);
    }
    let mut src_file: Option<(FileId, File)> = None;
    let mut i = 0;
    while i < plan.ranges.len() {
        if stop.load(Ordering::Relaxed) || ex.out.refused.is_some() {
            break;
        }
        let first = plan.ranges[i];
        let mut j = i + 1;
        while j < plan.ranges.len() && same_source(&plan.ranges[j], &first) {
            j += 1;
        }
        let group = &plan.ranges[i..j];
        i = j;
        progress.inc(group.iter().map(|r| r.len).sum());
        if src_file.as_ref().map(|(id, _)| *id) != Some(first.src) {
            src_file = ex.open(first.src).map(|f| (first.src, f));
        }
        let Some((_, src)) = &src_file else { continue };
        ex.source_group(src, &first, group);
    }
    ex.out
}

/// Why sharing stops when the filesystem cannot share extents at all.
const REFUSED: &str = "the filesystem does not support sharing extents (FIDEDUPERANGE: operation not supported); on XFS this needs a filesystem made with reflink=1";

/// Statuses that mean "this filesystem cannot share", not "this file".
fn unsupported(s: DedupeStatus) -> bool {
    matches!(s, DedupeStatus::Error(Errno::EOPNOTSUPP | Errno::ENOTTY))
}

fn same_source(a: &Range, b: &Range) -> bool {
    (a.src, a.src_off, a.len) == (b.src, b.src_off, b.len)
}

impl Executor<'_> {
    /// Open a file read-only and check that it is still what was scanned.
    fn open(&mut self, id: FileId) -> Option<File> {
        if self.bad.contains(&id) {
            return None;
        }
        let c = self.files.get(&id)?;
        let res = sys::open_readonly(&c.path).and_then(|f| Ok((f.metadata()?, f)));
        match res {
            Ok((m, f)) => {
                let now = Candidate::from_metadata(c.path.clone(), &m);
                if now != *c || !m.is_file() {
                    self.progress.warn(&format!(
                        "{}: changed since it was scanned; left alone, it is rehashed next run",
                        display_path(&c.path)
                    ));
                    self.out.changed_files += 1;
                    self.bad.insert(id);
                    return None;
                }
                Some(f)
            }
            Err(e) => {
                let kind = if e.kind() == std::io::ErrorKind::NotFound { "vanished" } else { "open" };
                self.progress.warn(&format!("{}: cannot open: {e}", display_path(&c.path)));
                *self.out.errors.entry(kind.to_owned()).or_default() += 1;
                self.bad.insert(id);
                None
            }
        }
    }

    fn source_group(&mut self, src: &File, r: &Range, group: &[Range]) {
        let Some(src_map) = self.map(src.as_fd(), r.src, r.src_off, r.len) else { return };
        let mut whole: Vec<Dest> = Vec::new();
        let mut partial: Vec<Dest> = Vec::new();
        for d in group {
            let Some(file) = self.open(d.dest) else { continue };
            let Some(dst_map) = self.map(file.as_fd(), d.dest, d.dest_off, d.len) else { continue };
            let parts = unshared_parts(&src_map, &dst_map, self.block_size, r.len);
            let unshared: u64 = parts.iter().map(|p| p.1).sum();
            self.out.already_shared_bytes += r.len - unshared;
            if parts.is_empty() {
                continue;
            }
            let dest = Dest { id: d.dest, file, off: d.dest_off, parts };
            if dest.parts == [(0, r.len)] {
                whole.push(dest);
            } else {
                partial.push(dest);
            }
        }
        for batch in whole.chunks(MAX_DESTS) {
            let targets: Vec<Target<'_>> = batch.iter().map(|d| d.target(0)).collect();
            self.submit(src, r.src_off, r.len, &targets);
        }
        for d in &partial {
            for &(o, l) in &d.parts {
                self.submit(src, r.src_off + o, l, &[d.target(o)]);
            }
        }
    }

    /// For every destination file, rewrite the uncovered remainders of its
    /// partly covered extents (see [`crate::bookend`]).
    fn free_bookends(&mut self, plan: &Plan, b: &Bookends, stop: &AtomicBool) {
        let mut by_dest: BTreeMap<FileId, Vec<(u64, u64)>> = BTreeMap::new();
        for r in &plan.ranges {
            by_dest.entry(r.dest).or_default().push((r.dest_off, r.len));
        }
        for (id, ranges) in by_dest {
            if stop.load(Ordering::Relaxed) || self.out.refused.is_some() {
                return;
            }
            let Some(file) = self.open(id) else { continue };
            let size = self.files[&id].size;
            let Ok(extents) = sys::fiemap(file.as_fd(), 0, size) else { continue };
            let unstable =
                fiemap_flags::UNKNOWN | fiemap_flags::DELALLOC | fiemap_flags::ENCODED | fiemap_flags::DATA_INLINE;
            let extents: Vec<DestExtent> = extents
                .iter()
                .map(|e| DestExtent {
                    logical: e.logical,
                    length: e.length,
                    shared: e.is_shared(),
                    unstable: e.flags & unstable != 0,
                })
                .collect();
            let pieces = bookend::remainders(&extents, &bookend::union(ranges), size, b.max_ratio);
            if pieces.is_empty() {
                continue;
            }
            match self.mode {
                Mode::DryRun => self.out.rewritten_bytes += pieces.iter().map(|p| p.1).sum::<u64>(),
                Mode::Share => {
                    if let Err(e) = self.rewrite(&file, size, &pieces, &b.tmp_dir) {
                        let path = display_path(&self.files[&id].path);
                        self.progress.warn(&format!("{path}: cannot rewrite partly shared extents: {e}"));
                        *self.out.errors.entry("rewrite".to_owned()).or_default() += 1;
                    }
                }
            }
        }
    }

    /// Copy `pieces` of `dest` into an unnamed temporary file on the same
    /// filesystem (at the same offsets, same size, so an unaligned tail ends
    /// at both EOFs), then share them back into `dest`: the kernel compares
    /// the bytes, and `dest` then references fresh extents there.
    fn rewrite(&mut self, dest: &File, size: u64, pieces: &[(u64, u64)], dir: &std::path::Path) -> std::io::Result<()> {
        let tmp = sys::inode::open_tmpfile(dir)?;
        tmp.set_len(size)?;
        for &(off, len) in pieces {
            let mut pos = 0;
            while pos < len {
                let n = ((len - pos) as usize).min(self.buf_a.len());
                dest.read_exact_at(&mut self.buf_a[..n], off + pos)?;
                tmp.write_all_at(&self.buf_a[..n], off + pos)?;
                pos += n as u64;
            }
        }
        for &(off, len) in pieces {
            let mut pos = 0;
            while pos < len {
                let n = (len - pos).min(MAX_REQUEST_LEN);
                let r = sys::dedupe_range(tmp.as_fd(), off + pos, n, &[(dest.as_fd(), off + pos)])
                    .map_err(std::io::Error::from)?;
                match r[0] {
                    DestResult { status: DedupeStatus::Same, bytes_deduped } if bytes_deduped > 0 => {
                        self.out.rewritten_bytes += bytes_deduped;
                        pos += bytes_deduped;
                    }
                    // Changed meanwhile, or refused: the file keeps its old extent.
                    _ => break,
                }
            }
        }
        Ok(())
    }

    /// Physical address per block of a range (`None` where unknown), or
    /// `None` for a file whose data is inline in metadata: sharing it frees
    /// nothing, and btrfs would report success every run.
    fn map(&mut self, fd: BorrowedFd<'_>, id: FileId, off: u64, len: u64) -> Option<Vec<Option<u64>>> {
        Some(match sys::fiemap(fd, off, len) {
            Ok(ext) if ext.iter().any(|e| e.flags & sys::fiemap::flags::DATA_INLINE != 0) => {
                if self.inline.insert(id) {
                    self.out.inline_files += 1;
                }
                return None;
            }
            Ok(ext) => physical_map(&ext, off, len, self.block_size),
            Err(e) => {
                if e != Errno::EOPNOTSUPP {
                    let path = self.files.get(&id).map(|c| display_path(&c.path)).unwrap_or_default();
                    self.progress.info(&format!("{path}: fiemap: {e}"));
                }
                vec![None; len.div_ceil(self.block_size) as usize]
            }
        })
    }

    /// Share (or verify) `src[off..off+len]` into every destination, in
    /// requests of at most 16 MiB.
    fn submit(&mut self, src: &File, off: u64, len: u64, dests: &[Target<'_>]) {
        let mut alive: Vec<bool> = vec![true; dests.len()];
        let mut done = 0;
        while done < len && alive.iter().any(|&a| a) && self.out.refused.is_none() {
            let chunk = (len - done).min(MAX_REQUEST_LEN);
            match self.mode {
                Mode::DryRun => {
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
                Mode::Share => {
                    let idx: Vec<usize> = (0..dests.len()).filter(|&k| alive[k]).collect();
                    let fds: Vec<(BorrowedFd<'_>, u64)> =
                        idx.iter().map(|&k| (dests[k].file.as_fd(), dests[k].off + done)).collect();
                    self.out.duplicate_bytes += chunk * idx.len() as u64;
                    match sys::dedupe_range(src.as_fd(), off + done, chunk, &fds) {
                        Ok(results) if results.iter().any(|r| unsupported(r.status)) => {
                            self.out.duplicate_bytes -= chunk * idx.len() as u64;
                            self.out.refused = Some(REFUSED.to_owned());
                        }
                        Ok(results) => {
                            for (res, &k) in results.iter().zip(&idx) {
                                if !self.record(dests[k].id, res.status, res.bytes_deduped) {
                                    alive[k] = false;
                                } else if res.bytes_deduped < chunk {
                                    // The kernel may share less than asked:
                                    // carry on from where it stopped.
                                    if !self.finish_short(src, off + done, chunk, &dests[k], done, res.bytes_deduped) {
                                        alive[k] = false;
                                    }
                                }
                            }
                        }
                        Err(Errno::EOPNOTSUPP | Errno::ENOTTY | Errno::EXDEV) => {
                            self.out.duplicate_bytes -= chunk * idx.len() as u64;
                            self.out.refused = Some(REFUSED.to_owned());
                        }
                        Err(e) => {
                            for &k in &idx {
                                self.dest_error(
                                    dests[k].id,
                                    e.desc(),
                                    e.to_string().split(':').next().unwrap_or("errno"),
                                );
                                alive[k] = false;
                            }
                        }
                    }
                }
            }
            done += chunk;
        }
    }

    /// Re-issue the rest of a request the kernel shared only partly.
    fn finish_short(&mut self, src: &File, src_off: u64, chunk: u64, d: &Target<'_>, done: u64, first: u64) -> bool {
        let mut got = first;
        while got < chunk {
            let fd = [(d.file.as_fd(), d.off + done + got)];
            match sys::dedupe_range(src.as_fd(), src_off + got, chunk - got, &fd) {
                Ok(r) if r[0].status == DedupeStatus::Same && r[0].bytes_deduped > 0 => {
                    self.out.deduped_bytes += r[0].bytes_deduped;
                    got += r[0].bytes_deduped;
                }
                Ok(r) => {
                    self.record(d.id, r[0].status, 0);
                    return false;
                }
                Err(e) => {
                    self.dest_error(d.id, e.desc(), "short");
                    return false;
                }
            }
        }
        true
    }

    /// Count one destination's status; false when it must not be used again.
    fn record(&mut self, id: FileId, status: DedupeStatus, bytes: u64) -> bool {
        match status {
            DedupeStatus::Same => {
                self.out.status.same += 1;
                self.out.deduped_bytes += bytes;
                true
            }
            DedupeStatus::Differs => {
                self.out.status.differs += 1;
                let path = self.files.get(&id).map(|c| display_path(&c.path)).unwrap_or_default();
                self.progress.info(&format!("{path}: contents differ from the source; not shared"));
                false
            }
            DedupeStatus::Error(e) => {
                let name = format!("{e:?}");
                *self.out.status.errors.entry(name).or_default() += 1;
                let path = self.files.get(&id).map(|c| display_path(&c.path)).unwrap_or_default();
                self.progress.warn(&format!("{path}: kernel refused to share: {}", e.desc()));
                false
            }
        }
    }

    fn dest_error(&mut self, id: FileId, msg: &str, kind: &str) {
        let path = self.files.get(&id).map(|c| display_path(&c.path)).unwrap_or_default();
        self.progress.warn(&format!("{path}: {msg}"));
        *self.out.status.errors.entry(kind.to_owned()).or_default() += 1;
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

/// What FIEMAP says about one planned range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeState {
    /// This many of its bytes do not share the source's extents yet.
    Unshared(u64),
    /// A file's data is inline in metadata (btrfs): it can never be shared.
    Inline,
    /// A file could not be opened or mapped.
    Unknown,
}

/// The state of every range of `plan`, from FIEMAP alone (no data is read).
pub fn range_states(plan: &Plan, files: &HashMap<FileId, Candidate>, block_size: u64) -> Vec<RangeState> {
    let map = |id: FileId, off: u64, len: u64| -> Result<Vec<Option<u64>>, RangeState> {
        let c = files.get(&id).ok_or(RangeState::Unknown)?;
        let f = sys::open_readonly(&c.path).map_err(|_| RangeState::Unknown)?;
        let ext = sys::fiemap(f.as_fd(), off, len).map_err(|_| RangeState::Unknown)?;
        if ext.iter().any(|e| e.flags & fiemap_flags::DATA_INLINE != 0) {
            return Err(RangeState::Inline);
        }
        Ok(physical_map(&ext, off, len, block_size))
    };
    plan.ranges
        .iter()
        .map(|r| match (map(r.src, r.src_off, r.len), map(r.dest, r.dest_off, r.len)) {
            (Ok(s), Ok(d)) => RangeState::Unshared(unshared_parts(&s, &d, block_size, r.len).iter().map(|p| p.1).sum()),
            (Err(RangeState::Inline), _) | (_, Err(RangeState::Inline)) => RangeState::Inline,
            _ => RangeState::Unknown,
        })
        .collect()
}

/// The parts of a range (offset, length relative to its start) whose blocks
/// do not already map to the same physical address in source and
/// destination. Unknown addresses count as not shared.
pub fn unshared_parts(src: &[Option<u64>], dst: &[Option<u64>], block: u64, len: u64) -> Vec<(u64, u64)> {
    let mut parts: Vec<(u64, u64)> = Vec::new();
    for (i, (s, d)) in src.iter().zip(dst).enumerate() {
        let shared = s.is_some() && s == d;
        if shared {
            continue;
        }
        let off = i as u64 * block;
        let l = block.min(len - off);
        match parts.last_mut() {
            Some((o, pl)) if *o + *pl == off => *pl += l,
            _ => parts.push((off, l)),
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unshared_parts_skips_shared_blocks() {
        let s = [Some(10), Some(20), Some(30), Some(40)];
        let d = [Some(10), Some(99), None, Some(40)];
        assert_eq!(unshared_parts(&s, &d, 4, 16), vec![(4, 8)]);
        assert_eq!(unshared_parts(&s, &s, 4, 16), vec![]);
        // A partial last block keeps the range's real length.
        let d2 = [Some(10), Some(20), Some(30), Some(41)];
        assert_eq!(unshared_parts(&s, &d2, 4, 14), vec![(12, 2)]);
        let none = [None, None];
        assert_eq!(unshared_parts(&none, &none, 4, 8), vec![(0, 8)]);
    }
}
