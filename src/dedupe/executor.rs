//! What one share worker does with a unit of work (the ranges of one
//! source): open each file, check it, map it, and share, counting every
//! status and leaving what cannot be done now for a later run.
//!
//! Every file is opened below the run's starting paths and checked against
//! the scan before it is used (`super::reopen`); a file that changed since
//! is left for the next run.
//!
//! The kernel compares the bytes page by page and reads a missing page
//! synchronously, so before each request both sides are prefetched
//! (`POSIX_FADV_WILLNEED`): on data no longer cached the disk then reads
//! large requests ahead of the compare instead of one page at a time.
//!
//! A destination the kernel refuses (`EOPNOTSUPP`, `EXDEV`, `EINVAL`) is
//! counted against that destination; sharing stops for the whole run only
//! when the filesystem itself cannot share, which a probe decides once, at
//! the first such refusal: two equal blocks of an unnamed temporary file on
//! the scanned filesystem, shared with each other. Blocks whose source and
//! destination already map to the same physical extent (FIEMAP, see
//! [`super::extents`]) are not submitted again, so a second run on an
//! unchanged volume submits nothing. A destination this run's scan mapped
//! and found sharing nothing (`WorkerContext::unshared`) is not mapped:
//! nothing can share the source's blocks with it yet. A destination the
//! kernel answers ENOSPC/EDQUOT to is recorded pending
//! ([`Pending::NoSpaceShare`]).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};

use nix::errno::Errno;

use super::extents::{unshared, Mapped};
use super::unreadable::ReadFailures;
use super::workers::{locked, same_source, WorkerContext};
use super::{no_space, Mode, Outcome, Pending};
use crate::display::display_path;
use crate::file::FileFacts;
use crate::file::FileId;
use crate::plan::Range;
use crate::progress::Progress;
use crate::sys::fiemap::Extent;
use crate::sys::{self, dedupe::DestResult, dedupe::MAX_DESTS, DedupeStatus};

/// One destination of a source range, maybe split into the sub-ranges that
/// are not shared yet (offsets relative to the range start).
pub(super) struct Dest {
    pub(super) id: FileId,
    pub(super) file: File,
    pub(super) off: u64,
    pub(super) parts: Vec<(u64, u64)>,
    /// FIEMAP extents in the range (fragmentation); `None`: not mapped.
    pub(super) extents: Option<usize>,
}

/// One destination of one request: borrows the open file of a [`Dest`].
pub(super) struct Target<'f> {
    pub(super) id: FileId,
    pub(super) file: &'f File,
    pub(super) off: u64,
}

impl<'f> Target<'f> {
    /// The same file `rel` bytes further on.
    pub(super) fn at(&self, rel: u64) -> Target<'f> {
        Target { id: self.id, file: self.file, off: self.off + rel }
    }
}

impl Dest {
    /// This destination at `rel` bytes into the range, for one request.
    pub(super) fn target(&self, rel: u64) -> Target<'_> {
        Target { id: self.id, file: &self.file, off: self.off + rel }
    }
}

/// Largest file whose data btrfs may keep inline in its metadata (an
/// inline extent never exceeds the sector size; `max_inline` defaults to
/// 2048 bytes).
const INLINE_MAX: u64 = 4096;

/// One worker: its own buffers and counts, merged at the end.
pub(super) struct Executor<'a> {
    /// What all workers read, and the verdicts they reach once.
    pub(super) ctx: &'a WorkerContext<'a>,
    /// `ctx.files`, and the other fields of `ctx` below, at hand.
    pub(super) files: &'a HashMap<FileId, FileFacts>,
    pub(super) block_size: u64,
    pub(super) mode: Mode,
    pub(super) progress: &'a dyn Progress,
    /// What this worker did, merged with the others' at the end.
    pub(super) out: Outcome,
    /// `st_dev` → volume key, for the identity check of opened files.
    pub(super) keys: sys::SubvolIds,
    /// Whether an extent is referenced by a file outside the plan, as
    /// found by this worker, by its disk address and by the FIEMAP
    /// addresses it was asked at (see `pinned.rs`).
    pub(super) pinned: HashMap<u64, bool>,
    /// The filesystem cannot list an extent's owners (not btrfs, no
    /// CAP_SYS_ADMIN): stop asking.
    pub(super) no_owners: bool,
    /// 1 MiB buffers: the dry run's compare, the bookend copy.
    pub(super) buf_a: Vec<u8>,
    pub(super) buf_b: Vec<u8>,
}

/// The owner of an open file (`None` if `fstat` fails).
fn owner(f: &File) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    f.metadata().ok().map(|m| m.uid())
}

impl<'a> Executor<'a> {
    /// A worker with empty counts, reading `ctx`.
    pub(super) fn new(ctx: &'a WorkerContext<'a>) -> Executor<'a> {
        Executor {
            ctx,
            files: ctx.files,
            block_size: ctx.block_size,
            mode: ctx.mode,
            progress: ctx.progress,
            out: Outcome::default(),
            keys: sys::SubvolIds::new(),
            pinned: HashMap::new(),
            no_owners: false,
            buf_a: vec![0; 1 << 20],
            buf_b: vec![0; 1 << 20],
        }
    }

    /// Run the ranges of one unit (one source, whole groups, in plan order).
    pub(super) fn run_unit(&mut self, ranges: &[Range]) {
        let mut src_file: Option<(FileId, File)> = None;
        let mut i = 0;
        while i < ranges.len() {
            if self.halted() {
                break;
            }
            let first = ranges[i];
            let mut j = i + 1;
            while j < ranges.len() && same_source(&ranges[j], &first) {
                j += 1;
            }
            let group = &ranges[i..j];
            i = j;
            if src_file.as_ref().map(|(id, _)| *id) != Some(first.src) {
                src_file = self.open(first.src).map(|f| (first.src, f));
            }
            match &src_file {
                Some((_, src)) => self.source_group(src, &first, group),
                None if self.leased(first.src) => group.iter().for_each(|d| self.pend(d.dest, Pending::Leased, d.len)),
                None => {}
            }
            // Counted once done, so the bar's ETA covers the group's work.
            self.progress.inc(group.iter().map(|r| r.len).sum());
        }
    }

    /// Share one source range into its destinations. They are opened,
    /// mapped and submitted [`MAX_DESTS`] at a time (one request's worth), so
    /// that a file with thousands of copies keeps at most that many files
    /// open per worker, well under the usual limit of 1024.
    ///
    /// The source is mapped only when a destination's range holds an extent
    /// the kernel reports shared: a destination with no shared extent there
    /// cannot already share the source's blocks, so on a first run (nothing
    /// shared yet) this halves the FIEMAP calls, which on btrfs walk the
    /// back references of every extent (a quarter of the share phase's CPU
    /// on FULL/btrfs before this).
    fn source_group(&mut self, src: &File, r: &Range, group: &[Range]) {
        let waits = locked(&self.ctx.deferred).get(&r.src).copied().filter(|why| why.waits_for_room());
        if let Some(why) = waits.filter(|_| self.ctx.wait_for_sources) {
            // Its copies wait for it (`Sharing::wait_for_sources`).
            for d in group.iter().filter(|d| !locked(&self.ctx.deferred).contains_key(&d.dest)) {
                self.pend(d.dest, why, d.len);
            }
            return;
        }
        let mut src_map: Option<Vec<Extent>> = None;
        let src_owner = owner(src);
        // A source that may be inline is mapped first, as before: sharing
        // from an inline extent into a destination that is not makes btrfs
        // copy the bytes into the destination every run instead of sharing.
        let may_be_inline =
            r.src_off == 0 && self.files.get(&r.src).is_some_and(|c| c.size <= INLINE_MAX.max(self.block_size));
        if may_be_inline && self.map_once(&mut src_map, src, r).is_none() {
            return;
        }
        for batch in group.chunks(MAX_DESTS) {
            if self.halted() {
                return;
            }
            let (mut whole, mut partial, mut pinned): (Vec<Dest>, Vec<Dest>, Vec<Dest>) = Default::default();
            for d in batch {
                if locked(&self.ctx.deferred).contains_key(&d.dest) {
                    continue;
                }
                let Some(file) = self.open(d.dest) else {
                    if self.leased(d.dest) {
                        self.pend(d.dest, Pending::Leased, d.len);
                    }
                    continue;
                };
                if !self.ctx.across_owners && owner(&file) != src_owner {
                    self.other_owner(d.dest, r.src);
                    continue;
                }
                if self.ctx.unshared.contains(d.dest) {
                    // Unchanged since the scan found every extent of it its
                    // own: nothing shares the source's blocks yet, and it
                    // is not inline. Not mapping it spares the share phase
                    // its most expensive call after the dedupe itself (on
                    // FULL/btrfs a quarter of the share threads' CPU went
                    // into destination FIEMAPs). A snapshot or reflink made
                    // since the scan is not seen: sharing then frees that
                    // destination's blocks only once the snapshot goes,
                    // and the kernel still compares every byte.
                    whole.push(Dest { id: d.dest, file, off: d.dest_off, parts: vec![(0, r.len)], extents: None });
                    continue;
                }
                let Some(dst) = self.map(file.as_fd(), d.dest, d.dest_off, d.len) else { continue };
                let parts = if dst.shared {
                    let Some(src_ext) = self.map_once(&mut src_map, src, r) else { return };
                    unshared(src_ext, r.src_off, &dst.extents, d.dest_off, self.block_size, r.len)
                } else {
                    vec![(0, r.len)]
                };
                let unshared: u64 = parts.iter().map(|p| p.1).sum();
                self.out.already_shared_bytes += r.len - unshared;
                let all = unshared == r.len;
                let parts = if dst.shared { self.drop_pinned(file.as_fd(), d, &dst.extents, parts) } else { parts };
                let dest = Dest { id: d.dest, file, off: d.dest_off, parts, extents: Some(dst.extents.len()) };
                if dest.parts.is_empty() {
                    // Kept whole by a file outside the plan: maybe the
                    // better source (see `swap.rs`).
                    if all {
                        pinned.push(dest);
                    }
                    continue;
                }
                if dest.parts == [(0, r.len)] {
                    whole.push(dest);
                } else {
                    partial.push(dest);
                }
            }
            self.share_batch(src, r, group, (&whole, &partial, &pinned));
        }
    }

    /// The source side of range `r`, mapped on first use only (`None`: it
    /// is inline, nothing to share from it).
    fn map_once<'m>(&mut self, cache: &'m mut Option<Vec<Extent>>, src: &File, r: &Range) -> Option<&'m [Extent]> {
        if cache.is_none() {
            *cache = Some(self.map(src.as_fd(), r.src, r.src_off, r.len)?.extents);
        }
        cache.as_deref()
    }

    /// Physical address per block of a range (`None` where unknown), or
    /// `None` for a file whose data is inline in metadata: sharing it frees
    /// nothing, and btrfs would report success every run.
    pub(super) fn map(&mut self, fd: BorrowedFd<'_>, id: FileId, off: u64, len: u64) -> Option<Mapped> {
        Some(match sys::fiemap(fd, off, len) {
            Ok(ext) if ext.iter().any(|e| e.is_inline()) => {
                if locked(&self.ctx.inline).insert(id) {
                    self.out.inline_files += 1;
                }
                return None;
            }
            Ok(ext) => {
                self.ctx.note_solo(&ext);
                Mapped { shared: ext.iter().any(|e| e.is_shared()), extents: ext }
            }
            Err(e) => {
                if e != Errno::EOPNOTSUPP {
                    let path = self.path_of(id);
                    self.progress.info(&format!("{path}: fiemap: {e}"));
                }
                Mapped { shared: false, extents: Vec::new() }
            }
        })
    }

    /// Share (or verify) `src[off..off+len]` into every destination, in
    /// requests of at most 16 MiB.
    pub(super) fn submit(&mut self, source: &Target<'_>, len: u64, dests: &[Target<'_>]) {
        let (src, off) = (source.file, source.off);
        let mut alive: Vec<bool> = vec![true; dests.len()];
        let mut done = 0;
        while done < len && alive.iter().any(|&a| a) && !self.refused() {
            let live = alive.iter().filter(|&&a| a).count();
            let step = super::workers::request_len(self.ctx.request_bytes, live, self.ctx.block_size);
            let chunk = (len - done).min(step);
            match self.mode {
                Mode::DryRun => {
                    let failed = self.verify(source, done, chunk, dests, &mut alive);
                    self.read_failures(source, (len, done, chunk), dests, failed, &mut alive, "read");
                }
                Mode::Share => {
                    for (k, d) in dests.iter().enumerate() {
                        alive[k] = alive[k] && self.unchanged(d.id, d.file);
                    }
                    let idx: Vec<usize> = (0..dests.len()).filter(|&k| alive[k]).collect();
                    if idx.is_empty() {
                        break;
                    }
                    self.get_ready(src, off, len, done, chunk, dests, &idx);
                    let fds: Vec<(BorrowedFd<'_>, u64)> =
                        idx.iter().map(|&k| (dests[k].file.as_fd(), dests[k].off + done)).collect();
                    self.out.duplicate_bytes += chunk * idx.len() as u64;
                    match sys::dedupe_range(src.as_fd(), off + done, chunk, &fds) {
                        Ok(results)
                            if results.iter().any(|r| super::refusal::unsupported(r.status))
                                && self.refuse_if_fs_cannot_share() =>
                        {
                            self.out.duplicate_bytes -= chunk * idx.len() as u64;
                        }
                        Ok(results) => self.answered(source, (len, done, chunk), dests, &idx, &results, &mut alive),
                        Err(Errno::EOPNOTSUPP | Errno::ENOTTY | Errno::EXDEV | Errno::EINVAL)
                            if self.refuse_if_fs_cannot_share() =>
                        {
                            self.out.duplicate_bytes -= chunk * idx.len() as u64;
                        }
                        Err(e) => {
                            self.out.duplicate_bytes -= chunk * idx.len() as u64;
                            for &k in &idx {
                                if no_space(e) {
                                    self.pend(dests[k].id, Pending::NoSpaceShare, len - done);
                                }
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

    /// What the kernel answered for the request at `done` (`chunk` bytes
    /// of `len`), destination by destination (`idx` into `dests`): counted,
    /// carried on where it shared less than asked, and `alive` no more
    /// where it refused. Read errors go to [`Executor::read_failures`].
    fn answered(
        &mut self,
        source: &Target<'_>,
        (len, done, chunk): (u64, u64, u64),
        dests: &[Target<'_>],
        idx: &[usize],
        results: &[DestResult],
        alive: &mut [bool],
    ) {
        let mut failed = ReadFailures::new();
        for (res, &k) in results.iter().zip(idx) {
            if let DedupeStatus::Error(e) = res.status {
                if self.volume_stopped(e) {
                    // Counted, not warned about: said once for the run.
                    *self.out.status.errors.entry(format!("{e:?}")).or_default() += 1;
                    alive[k] = false;
                    continue;
                }
            }
            if res.status == DedupeStatus::Error(Errno::EINVAL) && self.checksums_differ(source, &dests[k]) {
                alive[k] = false;
                continue;
            }
            if res.status == DedupeStatus::Error(Errno::EIO) {
                self.out.duplicate_bytes -= chunk;
                failed.push((k, Errno::EIO.into()));
                continue;
            }
            if matches!(res.status, DedupeStatus::Error(e) if no_space(e)) {
                self.pend(dests[k].id, Pending::NoSpaceShare, len - done);
            }
            if res.status == DedupeStatus::Differs {
                // The rest of the range is given up.
                self.out.differs.push((dests[k].id, dests[k].off + done, len - done));
                self.explain_differs(source, &dests[k], done, chunk);
            }
            // A file of one block is one extent, never held in part.
            if res.bytes_deduped > 0 && self.files.get(&source.id).is_some_and(|c| c.size > self.block_size) {
                self.out.sources.insert(source.id);
            }
            if !self.record(dests[k].id, res.status, res.bytes_deduped) {
                alive[k] = false;
            } else if res.bytes_deduped < chunk {
                // The kernel may share less than asked: carry on from
                // where it stopped.
                let (src, off) = (source.file, source.off + done);
                if !self.finish_short(src, off, chunk, &dests[k], done, res.bytes_deduped) {
                    alive[k] = false;
                }
            }
        }
        self.read_failures(source, (len, done, chunk), dests, failed, alive, "EIO");
    }

    /// After `EINVAL`: whether `src` and `dest` are btrfs files of which
    /// one keeps data checksums and the other not, which btrfs refuses to
    /// share. The plan no longer pairs them (`hash::checksum_salt`), but
    /// fingerprints recorded before it was so still do: the one without is
    /// then marked stale, read again next run and salted apart, and the
    /// refusal counted and said as such.
    fn checksums_differ(&mut self, src: &Target<'_>, dest: &Target<'_>) -> bool {
        use sys::btrfs_tree::nodatasum;
        let (Ok(a), Ok(b)) = (nodatasum(src.file.as_fd()), nodatasum(dest.file.as_fd())) else { return false };
        if a == b {
            return false;
        }
        self.out.stale.insert(if a { src.id } else { dest.id });
        *self.out.status.errors.entry(format!("{:?}", Errno::EINVAL)).or_default() += 1;
        self.progress.warn(&format!(
            "{}: not shared with {}: one keeps data checksums and the other not, which btrfs refuses; the one \
             without is read again next run and not paired again",
            self.path_of(dest.id),
            self.path_of(src.id)
        ));
        true
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
                    if matches!(r[0].status, DedupeStatus::Error(e) if no_space(e)) {
                        self.pend(d.id, Pending::NoSpaceShare, chunk - got);
                    }
                    self.record(d.id, r[0].status, 0);
                    return false;
                }
                Err(e) => {
                    if no_space(e) {
                        self.pend(d.id, Pending::NoSpaceShare, chunk - got);
                    }
                    self.dest_error(d.id, e.desc(), "short");
                    return false;
                }
            }
        }
        true
    }

    /// Leave `bytes` planned into destination `id` for a later run.
    pub(super) fn pend(&mut self, id: FileId, why: Pending, bytes: u64) {
        let e = self.out.pending.entry(id).or_insert((why, 0));
        e.0 = e.0.min(why);
        e.1 += bytes;
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
                let path = self.path_of(id);
                self.progress.info(&format!("{path}: contents differ from the source; not shared"));
                false
            }
            DedupeStatus::Error(e) => {
                let name = format!("{e:?}");
                *self.out.status.errors.entry(name).or_default() += 1;
                let path = self.path_of(id);
                self.progress.warn(&format!("{path}: kernel refused to share: {}", e.desc()));
                false
            }
        }
    }

    /// The path of file `id` as recorded, escaped for messages.
    pub(super) fn path_of(&self, id: FileId) -> String {
        self.files.get(&id).map(|c| display_path(&c.path)).unwrap_or_default()
    }

    /// Count an error of kind `kind` against a destination and warn with
    /// `msg`; the caller stops using it.
    pub(super) fn dest_error(&mut self, id: FileId, msg: &str, kind: &str) {
        let path = self.path_of(id);
        self.progress.warn(&format!("{path}: {msg}"));
        *self.out.status.errors.entry(kind.to_owned()).or_default() += 1;
    }
}
