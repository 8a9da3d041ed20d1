//! The share phase's last pass: written zero blocks of the plan's files
//! turned into holes (`dedupe::zeros` says why and which).
//!
//! The files are those the plan took (`allowed`: seen by this run, policy
//! and hard-link rules applied; on an incremental run only the fresh ones),
//! streamed from the database with their maps; those with a zero run of
//! [`zeros::MIN_BYTES`] are looked up in batches of [`BATCH`] (so memory is
//! that of a batch, whatever the volume), opened below the starting paths
//! and checked to be what was scanned, as the share workers do, then mapped
//! with FIEMAP and punched.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::ops::Range;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;

use crate::blockmap::BlockMap;
use crate::db::Db;
use crate::dedupe::headroom::kept_free;
use crate::dedupe::{zeros, Bookends};
use crate::display::display_path;
use crate::errors::ErrorKind;
use crate::file::{FileFacts, FileId, IdSet};
use crate::policy::SkipReason;
use crate::progress::Progress;
use crate::sys::beneath::Tree;
use crate::sys::btrfs_names::Stamp;
use crate::sys::fiemap::{fiemap, Extent};
use crate::sys::SubvolIds;
use nix::errno::Errno;

use super::pending::{Pending, ZerosLeft};
use holes::Holes;
use said::{say_compared, say_held};
use shared::SharedZeros;
use window::{btrfs_window, Judged};

mod clones;
mod holes;
mod said;
mod shared;
mod window;

/// Files with zero runs looked up and punched at a time.
const BATCH: usize = 1024;

/// A file of the pass and its zero runs.
type Candidate = (FileId, Vec<(u64, u64)>);

/// The stretches of a file in one extent on disk, with its address there
/// where btrfs names it.
type Group = (Option<u64>, Vec<Extent>);

/// Bytes of a file mapped with one FIEMAP call (as the hasher does).
const WINDOW: u64 = 256 << 20;

/// A failure to count: its kind, what to say, the errno.
type Failure = (ErrorKind, String, Option<i32>);

/// Whether a rewrite or punch failed for want of space (`errno`).
fn is_full(errno: Option<i32>) -> bool {
    matches!(errno, Some(libc::ENOSPC | libc::EDQUOT))
}

/// The error kind of a failed rewrite or punch (`errno`).
fn error_kind(errno: Option<i32>) -> ErrorKind {
    match errno {
        Some(libc::ENOSPC | libc::EDQUOT) => ErrorKind::NoSpace,
        _ => ErrorKind::Zeros,
    }
}

/// What the pass did (a dry run: what it would do).
#[derive(Debug, Default)]
pub struct ZerosOutcome {
    /// Files with at least one part turned into holes.
    pub files: u64,
    /// Bytes turned into holes.
    pub bytes: u64,
    /// btrfs: data rewritten so that extents partly zero could be freed.
    pub rewritten: u64,
    /// Files changed since the scan, left alone.
    pub changed: u64,
    /// Files gone or leased since the scan (`SkipReason::of_reopen`).
    pub skipped: BTreeMap<SkipReason, u64>,
    /// Files that could not be opened or mapped, or that the kernel
    /// refused, by kind.
    pub errors: BTreeMap<ErrorKind, u64>,
}

/// What one file's pass left: whether it went through (opened, checked,
/// every extent judged), whether a part of it became holes, the zero
/// bytes that wait for room, those files outside the run hold, with the
/// newest holder of each such extent, and, if another process held a
/// lease on it, its zero bytes.
#[derive(Default)]
struct Left {
    handled: bool,
    holed: bool,
    waiting: u64,
    /// Bytes held, and the holders with their state, read once the file
    /// is done (see [`crate::sys::btrfs_names::Stamp`]).
    held: Option<(u64, BTreeMap<Outside, Option<Stamp>>)>,
    leased: Option<u64>,
    /// Bytes of shared zeros left to a later run: many files of the run
    /// let go of them first (`SharedZeros::may_compare`).
    many_clones: u64,
}

/// The most holders recorded for one file (the newest kept): rotating
/// snapshots give every extent the same newest holder, so more than one
/// means clones outside each holding their own regions.
const HOLDERS_KEPT: usize = 16;

/// A file outside the run holding zeros of the pass's files: subvolume
/// id and inode (btrfs).
pub(super) type Outside = (u64, u64);

impl Left {
    /// `bytes` more zeros of an extent whose newest holder outside the run
    /// is `by` (`None`: its holders could not all be listed, or one is no
    /// longer as scanned: nothing to wait for).
    fn hold(&mut self, bytes: u64, by: Option<Outside>) {
        let Some(by) = by else { return };
        let (b, all) = self.held.get_or_insert_with(Default::default);
        *b += bytes;
        all.insert(by, None);
        if all.len() > HOLDERS_KEPT {
            all.pop_first();
        }
    }

    /// The file at `path` (open as `f`) gone through: the state of the
    /// holders that keep its zeros, if any, read after the walk that
    /// found them (a change from here on is seen by the next run), and
    /// said.
    fn done(mut self, path: &std::path::Path, f: &File, progress: &dyn Progress) -> Left {
        self.handled = true;
        if let Some((bytes, all)) = &mut self.held {
            for (&(root, ino), stamp) in all.iter_mut() {
                *stamp = crate::sys::btrfs_names::stamp(f.as_fd(), root, ino).ok().flatten();
            }
            say_held(path, f, (*bytes, all), progress);
        }
        self
    }
}

/// How an extent's data was rewritten before its zeros are punched.
enum Moved {
    /// Rewritten (or nothing to rewrite): punch.
    Yes,
    /// Not all of it (the file changed, the kernel refused): leave it.
    No,
    /// No room above `--keep-free`: leave it, for a later run.
    NoRoom,
}

/// What the pass carries from batch to batch.
struct State<'a> {
    /// The holes requests share from, once made (`Err`: none could be,
    /// said once; the pass does nothing more).
    hole: Option<Result<Holes, ()>>,
    keys: SubvolIds,
    shared: SharedZeros<'a>,
    out: ZerosOutcome,
    /// The files counted in `out.files` (or by the bookend pass): a file
    /// is also let go of zeros by another file's visit (`clones`).
    counted: IdSet,
}

/// What one file's visit works with: the pass's state, lent.
struct Visit<'s, 'a> {
    holes: &'s mut Holes,
    keys: &'s mut SubvolIds,
    shared: &'s mut SharedZeros<'a>,
    out: &'s mut ZerosOutcome,
    counted: &'s mut IdSet,
}

impl Visit<'_, '_> {
    /// Count file `id` among the files let go of zeros, once.
    fn count(&mut self, id: FileId) {
        if !self.counted.contains(id) {
            self.counted.insert(id);
            self.out.files += 1;
        }
    }
}

/// How the pass runs.
pub struct ZeroPass<'a> {
    pub tree: &'a Tree,
    pub block: u64,
    /// btrfs: the bookend pass's `--rewrite-ratio` (an extent is freed
    /// only whole; see `zeros::plan_on_disk`) and its budget of free space
    /// for the rest's copy; XFS: `None`.
    pub bookends: Option<&'a Bookends>,
    pub dry_run: bool,
    /// NOCOW files are left alone (`crate::dedupe::nocow_left`).
    pub leave_nocow: bool,
    /// `--share-snapshotted`: zeros a file outside the run also holds are
    /// let go of too (btrfs; `shared`'s doc says why).
    pub outside_too: bool,
}

impl ZeroPass<'_> {
    /// The pass of a run (`None` with `--keep-zeros`).
    pub fn of<'a>(
        job: &'a super::Job,
        cfg: &crate::config::ShareConfig,
        bookends: Option<&'a Bookends>,
    ) -> Option<ZeroPass<'a>> {
        (!cfg.keep_zeros).then_some(ZeroPass {
            tree: &job.tree,
            block: job.scan.block_size,
            bookends,
            dry_run: cfg.dry_run,
            leave_nocow: job.scan.leaves_nocow(),
            outside_too: cfg.share_snapshotted,
        })
    }

    /// Turn the written zero runs of the files `allowed` (and in `fresh`,
    /// when given) into holes.
    ///
    /// The files whose zeros wait for room above `--keep-free` are left
    /// pending (`zeros_keep_free`), so the next run, incremental or not,
    /// tries them again; so are those whose zeros a file outside the run
    /// holds on btrfs (`zeros_referenced_outside_run`, with the newest
    /// holder of each such extent: tried again once one is gone or
    /// changed, `pending::retried`). The rows of the files it went
    /// through are dropped.
    /// `holed`: zeros the bookend pass left as holes (or, in a dry run,
    /// counted as it would), not looked at again.
    pub fn run(
        &self,
        db: &Db,
        (allowed, fresh, holed): (&IdSet, Option<&HashSet<FileId>>, &crate::dedupe::Holed),
        pending: &mut Pending,
        progress: &dyn Progress,
        stop: &AtomicBool,
    ) -> Result<ZerosOutcome> {
        let mut st = State {
            hole: None,
            keys: SubvolIds::new(),
            shared: SharedZeros::new(db, allowed, self.outside_too, self.bookends.is_some()),
            out: ZerosOutcome::default(),
            counted: IdSet::new(),
        };
        holed.keys().for_each(|&id| st.counted.insert(id));
        let keep = |id| allowed.contains(id) && fresh.is_none_or(|f| f.contains(&id));
        let mut batch: Vec<Candidate> = Vec::new();
        let mut failed: Option<anyhow::Error> = None;
        db.for_each_map(keep, |id, size, enc| {
            if failed.is_some() || stop.load(Ordering::Relaxed) {
                return;
            }
            // A file too small for a run is not decoded.
            if size < zeros::MIN_BYTES {
                return;
            }
            let Ok(map) = BlockMap::from_blob(enc) else { return };
            let mut runs = zeros::zero_runs(&map, size, self.block, zeros::MIN_BYTES);
            if let Some(h) = holed.get(&id) {
                runs = crate::dedupe::bookend::without(&runs, h);
                runs.retain(|r| r.1 >= zeros::MIN_BYTES);
            }
            if !runs.is_empty() {
                batch.push((id, runs));
            }
            if batch.len() >= BATCH {
                if let Err(e) = self.batch(db, &mut batch, &mut st, pending, (progress, stop)) {
                    failed = Some(e);
                }
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        self.batch(db, &mut batch, &mut st, pending, (progress, stop))?;
        Ok(st.out)
    }

    /// Punch one batch of files (emptied).
    fn batch(
        &self,
        db: &Db,
        batch: &mut Vec<Candidate>,
        st: &mut State,
        pending: &mut Pending,
        (progress, stop): (&dyn Progress, &AtomicBool),
    ) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        // The source of every request: an unnamed file on the volume, all
        // hole, made when the first file needs it (a run inside a read-only
        // snapshot, which has nothing to punch, cannot make one).
        if st.hole.is_none() {
            let hole = match self.dry_run {
                true => self.tree.scratch().map(|_| None),
                false => {
                    self.tree.tmpfile().and_then(|f| f.set_len(crate::sys::dedupe::MAX_REQUEST_LEN).map(|()| Some(f)))
                }
            }
            .map(|made| {
                // A phase of its own: the share phase's bar stays full
                // meanwhile, and on thick images the pass takes a while.
                progress.finish_phase("");
                let label = if self.dry_run { "3/3 verify: zeros to holes" } else { "3/3 share: zeros to holes" };
                progress.phase(label, None, true);
                Holes::new(made)
            });
            st.hole = Some(hole.map_err(|e| {
                *st.out.errors.entry(ErrorKind::Zeros).or_default() += 1;
                let fs_wide = matches!(e.raw_os_error(), Some(libc::EIO | libc::EROFS));
                if fs_wide && self.tree.stop_if_stopped(stop, |w| progress.warn_run(w)) {
                    return;
                }
                progress.warn(&match crate::sys::beneath::is_no_scratch(&e) {
                    true => format!("written zeros cannot be turned into holes: {e}"),
                    false => format!("cannot make an unnamed file to turn written zeros into holes: {e}"),
                });
            }));
        }
        let Some(Ok(holes)) = &mut st.hole else {
            batch.clear();
            return Ok(());
        };
        let facts = db.file_facts(batch.iter().map(|b| b.0))?;
        let mut done = ZerosLeft::default();
        for (id, runs) in batch.drain(..) {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let Some(c) = facts.get(&id) else { continue };
            let was = st.out.bytes;
            let mut v =
                Visit { holes, keys: &mut st.keys, shared: &mut st.shared, out: &mut st.out, counted: &mut st.counted };
            let left = self.file(db, (id, c), &runs, &mut v, (progress, stop));
            if left.holed {
                v.count(id);
            }
            progress.inc_files(1);
            progress.inc(st.out.bytes - was);
            if left.handled {
                done.handled.push(id);
            }
            if left.waiting > 0 {
                done.waiting.push((id, left.waiting));
            }
            if let Some((bytes, all)) = left.held {
                done.held.push((id, bytes, all.into_iter().collect()));
            }
            done.leased.extend(left.leased.map(|bytes| (id, bytes)));
            if left.many_clones > 0 {
                done.many_clones.push((id, left.many_clones));
            }
        }
        pending.zeros(&done)
    }

    /// Open file `c` again and check it: `Err(None)` if it is gone,
    /// changed since the scan or NOCOW (`crate::dedupe::nocow_left`),
    /// `Err(Some(Leased))` if another process holds a lease on it, counted
    /// and said here; the error to count otherwise.
    fn open(
        &self,
        c: &FileFacts,
        keys: &mut SubvolIds,
        out: &mut ZerosOutcome,
        progress: &dyn Progress,
    ) -> Result<Result<File, Option<SkipReason>>, Failure> {
        let path = display_path(&c.path);
        let f = match self.tree.open_file(&c.path) {
            Ok(f) => f,
            Err(e) => match SkipReason::of_reopen(&e) {
                Some(why) => {
                    *out.skipped.entry(why).or_default() += 1;
                    progress.info(&format!("{path}: zeros left: {}", why.not_reopened()));
                    return Ok(Err(Some(why).filter(|&w| w == SkipReason::Leased)));
                }
                None => return Err((ErrorKind::Open, format!("cannot open: {e}"), e.raw_os_error())),
            },
        };
        if !c.is_open_as_recorded(&f, keys) {
            progress.warn(&format!("{path}: changed since it was scanned; left alone, it is rehashed next run"));
            out.changed += 1;
            return Ok(Err(None));
        }
        match crate::dedupe::nocow_left(self.leave_nocow, &f) {
            Ok(false) => Ok(Ok(f)),
            Ok(true) => {
                *out.skipped.entry(SkipReason::Nocow).or_default() += 1;
                progress.info(&format!("{path}: zeros left: NOCOW (--include-nocow punches them)"));
                Ok(Err(None))
            }
            Err(e) => Err((ErrorKind::Flags, format!("cannot read its inode flags: {e}"), Some(e as i32))),
        }
    }

    /// One file: open, check, map, punch.
    fn file(
        &self,
        db: &Db,
        (id, c): (FileId, &FileFacts),
        runs: &[(u64, u64)],
        v: &mut Visit,
        (progress, stop): (&dyn Progress, &AtomicBool),
    ) -> Left {
        let mut left = Left::default();
        let fail = |out: &mut ZerosOutcome, (kind, why, errno): Failure| {
            self.failed(out, c, (kind, &why, errno), (progress, stop));
            Left::default()
        };
        let f = match self.open(c, v.keys, v.out, progress) {
            Ok(Ok(f)) => f,
            Ok(Err(leased)) => {
                // Tried again by the next run (`zeros_leased`).
                left.leased = leased.map(|_| runs.iter().map(|r| r.1).sum());
                return left;
            }
            Err(e) => return fail(v.out, e),
        };
        // Mapped a window at a time, so a file of millions of extents costs
        // the extents of one window (and runs close to each other, a call
        // a window). An extent is judged once, whole, in the first window
        // that finds it, against all of the file's runs.
        let (mut done, mut judged) = (zeros::Punched::default(), Judged::default());
        let mut buf = Vec::new();
        let short = self.bookends.is_none().then(|| short_runs(db, id, c.size, self.block)).flatten();
        let runs = short.as_deref().unwrap_or(runs);
        for part in zeros::windows(runs, WINDOW, zeros::MIN_BYTES) {
            let groups = match self.window(&f, part, &mut judged) {
                Ok(g) => g,
                Err(e) => {
                    return fail(v.out, (ErrorKind::Open, format!("cannot map its extents: {e}"), Some(e as i32)))
                }
            };
            for (disk, g) in &groups {
                let w = match self.judge(&f, (*disk, g), (runs, c.size), v.shared, &mut buf) {
                    Ok(w) => w,
                    Err(by) => {
                        left.hold(zeros::within(runs, g), by);
                        continue;
                    }
                };
                if w.punch.is_empty() {
                    let o = self.clones_of(db, (id, &f), (*disk, g), w.clones, v, (progress, stop));
                    done.bytes += o.freed;
                    left.waiting += o.waiting;
                    if let Some(by) = o.held {
                        left.hold(zeros::within(runs, g), Some(by));
                    }
                    continue;
                }
                if !v.shared.may_compare(&w, g) {
                    say_compared(&c.path, progress);
                    left.many_clones += w.punch.iter().map(|p| p.1).sum::<u64>();
                    continue;
                }
                let hole = v.holes.for_file(&f, self.tree);
                let mut same = || c.is_open_as_recorded(&f, v.keys);
                match self.extent((c, &f), &w, hole, &mut same, &mut v.out.rewritten, progress) {
                    Ok((Moved::Yes, p)) => {
                        left.holed |= p.bytes > 0;
                        done.bytes += v.shared.freed(&w, (*disk, g), p.bytes, self.dry_run);
                        done.differs += p.differs;
                    }
                    Ok((Moved::No, _)) => {}
                    Ok((Moved::NoRoom, _)) => left.waiting += w.punch.iter().map(|p| p.1).sum::<u64>(),
                    Err((why, errno)) if is_full(errno) => {
                        self.full(&c.path, &why, v.out, progress);
                        left.waiting += w.punch.iter().map(|p| p.1).sum::<u64>();
                    }
                    Err((why, errno)) => return fail(v.out, (error_kind(errno), why, errno)),
                }
            }
        }
        v.out.bytes += done.bytes;
        left.done(&c.path, &f, progress)
    }

    /// The work on the stretches `g` of `f`, one extent (at `disk`, where
    /// btrfs's items name it), given the file's zero `runs` and `size`
    /// (`zeros::plan_on_disk`): nothing to punch here if shared zeros may
    /// not be (`SharedZeros::may_punch`), and the short pieces between its
    /// runs tried as zeros only if they read as zeros
    /// (`zeros::gaps_are_data`). An extent clones share with data
    /// in it comes back with nothing to punch and `clones` set. Shared
    /// zeros that may not be punched come back as the holder outside the
    /// run that keeps them, if one does.
    fn judge(
        &self,
        f: &File,
        (disk, g): (Option<u64>, &[Extent]),
        (runs, size): (&[(u64, u64)], u64),
        shared: &mut SharedZeros,
        buf: &mut Vec<u8>,
    ) -> Result<zeros::ExtentWork, Option<Outside>> {
        let ratio = self.bookends.map(|b| b.max_ratio);
        let w = zeros::plan_on_disk(g, runs, size, self.block, zeros::MIN_BYTES, ratio);
        if w.punch.is_empty() {
            return Ok(w);
        }
        shared.may_punch(f.as_fd(), &w, (disk, g))?;
        Ok(match zeros::reads_zero(f, &w.gaps, buf) {
            true => w,
            false => zeros::gaps_are_data(w, ratio.unwrap_or(0.0), zeros::MIN_BYTES),
        })
    }

    /// The extents of `f` to judge for the part `part` of a zero run, none
    /// judged before, each as the stretches of one extent on disk
    /// (`zeros::plan_on_disk`). On btrfs, read as root, the part is widened
    /// to the whole of every extent on disk it touches, so that each is
    /// judged with all its stretches; elsewhere (and on XFS, which frees
    /// block by block) each FIEMAP extent stands alone.
    fn window(&self, f: &File, part: Range<u64>, judged: &mut Judged) -> Result<Vec<Group>, Errno> {
        let fd = f.as_fd();
        if self.bookends.is_some() {
            if let Some(groups) = btrfs_window(fd, part.clone(), judged) {
                return groups;
            }
        }
        let extents = fiemap(fd, part.start, part.end - part.start)?;
        Ok(extents.into_iter().filter(|e| judged.first_time(e)).map(|e| (None, vec![e])).collect())
    }

    /// One extent of the open file `f`: the data in it rewritten (see
    /// [`ZeroPass::rewrite_rest`]), then its zeros punched, unless that
    /// left it as it is. The bytes rewritten are added to `rewritten`;
    /// failures come as why and `errno`.
    fn extent(
        &self,
        (c, f): (&FileFacts, &File),
        w: &zeros::ExtentWork,
        hole: Option<&File>,
        same: &mut impl FnMut() -> bool,
        rewritten: &mut u64,
        progress: &dyn Progress,
    ) -> Result<(Moved, zeros::Punched), (String, Option<i32>)> {
        match self.rewrite_rest(c, f, w, &mut *same, progress) {
            Ok(Moved::Yes) => *rewritten += w.rewrite.iter().map(|r| r.1).sum::<u64>(),
            Ok(other) => return Ok((other, zeros::Punched::default())),
            Err(e) => return Err((format!("data not rewritten: {e}"), e.raw_os_error())),
        }
        match zeros::punch(hole, f, &w.punch, same) {
            Ok(p) => Ok((Moved::Yes, p)),
            Err(e) => Err((format!("written zero blocks not turned into holes: {e}"), Some(e as i32))),
        }
    }

    /// Rewrite the data of an extent to be punched (btrfs: `w.rewrite`,
    /// if any) into fresh extents; or say why the extent stays as it is:
    /// not all moved, or no room above `--keep-free` (said once a run).
    fn rewrite_rest(
        &self,
        c: &FileFacts,
        f: &File,
        w: &zeros::ExtentWork,
        same: impl FnMut() -> bool,
        progress: &dyn Progress,
    ) -> std::io::Result<Moved> {
        let Some(b) = self.bookends.filter(|_| !w.rewrite.is_empty()) else { return Ok(Moved::Yes) };
        match zeros::rewrite(&b.room, || self.tree.tmpfile(), f, c.size, &w.rewrite, self.dry_run, same) {
            Err(e) if kept_free(&e) => {
                if b.room.first_refusal() {
                    let not = if self.dry_run { "would not be" } else { "not" };
                    progress.warn(&format!("{}: written zeros {not} turned into holes: {e}", display_path(&c.path)));
                }
                Ok(Moved::NoRoom)
            }
            done => done.map(|all| if all { Moved::Yes } else { Moved::No }),
        }
    }
}

/// XFS: the zero runs of file `id` of any length (a whole extent of zeros
/// is punched however short: `zeros::plan_on_disk`), read from its map;
/// `None` if it cannot be read or has more than [`MAX_SHORT_RUNS`] (the
/// runs of at least `zeros::MIN_BYTES` then do).
fn short_runs(db: &Db, id: FileId, size: u64, block: u64) -> Option<Vec<(u64, u64)>> {
    let map = BlockMap::from_blob(&db.encoded_map(id).ok()??).ok()?;
    Some(zeros::zero_runs(&map, size, block, block)).filter(|r| r.len() <= MAX_SHORT_RUNS)
}

/// The most zero runs of one file looked at whatever their length: 16 MiB
/// of them.
const MAX_SHORT_RUNS: usize = 1 << 20;
