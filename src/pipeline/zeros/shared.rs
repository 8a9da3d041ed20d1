//! Zeros other files share (reflinked copies): which may be punched, and
//! what a punch of them frees (see `dedupe::zeros`, "An extent flagged
//! `SHARED`").
//!
//! A shared extent is freed only once every holder has let go of it, so a
//! punch in it frees nothing by itself: only the last holder's punch,
//! which finds it no longer shared, frees, and only that one is counted
//! freed. btrfs can say who holds an extent (`BTRFS_IOC_LOGICAL_INO_V2`):
//! there its zeros are punched only when every holder is a file of the run
//! (each then lets go in turn). XFS cannot say, and frees block by block:
//! every holder in the run lets go, and a holder outside keeps the blocks,
//! the punches then changing no byte and freeing nothing.
//!
//! With `--share-snapshotted` the files of the run let go on btrfs too
//! when a file outside the run holds the extent (a read-only snapshot
//! that rotates): nothing is freed until it is deleted, and that needs no
//! later run. Such an extent counts as freeing nothing, in a dry run too.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::os::fd::BorrowedFd;

use crate::blockmap::BlockMap;
use crate::db::Db;
use crate::dedupe::zeros::ExtentWork;
use crate::dedupe::zeros::MAX_COMPARED_PER_ZERO;
use crate::file::{FileId, FileKey, IdSet};
use crate::sys::fiemap::Extent;

use super::Outside;

/// What the pass knows of the zeros other files share.
pub(super) struct SharedZeros<'a> {
    db: &'a Db,
    /// The files of the run.
    run: &'a IdSet,
    /// btrfs: whether every holder of an extent is a file of the run,
    /// asked once per extent (by its [`key`], see `may_punch`).
    in_run: HashMap<u64, Result<(), Option<Outside>>>,
    /// btrfs, `--share-snapshotted`: let go of extents a file outside the
    /// run holds too.
    outside_too: bool,
    /// Those extents (by their [`key`]), let go of by the files of the
    /// run and freed only once the holders outside are gone.
    later: HashSet<u64>,
    /// The disk space of shared zeros counted (see `freed`): in a dry run,
    /// and on btrfs.
    counted: BTreeMap<u64, u64>,
    /// XFS, a dry run: the disk space of shared zeros some file of the run
    /// would punch; counted once a second punch covers it (see `freed`).
    punched_once: BTreeMap<u64, u64>,
    /// btrfs: the extents (by their [`key`]) whose zeros were counted by
    /// disk space (see `freed`).
    by_disk: HashSet<u64>,
    /// btrfs (read as root): the holders of an extent can be listed, and
    /// an extent is freed whole once the last of them lets go.
    btrfs: bool,
    /// btrfs: the extents (by disk address) their holders were asked to
    /// let go of together (`clones`), each tried once.
    tried: HashSet<u64>,
    /// The zero runs of the last holders of such extents, most recent
    /// first: an image's extents are held by the same files, extent after
    /// extent, and its map is decoded once, not once an extent.
    runs: VecDeque<(FileId, Vec<(u64, u64)>)>,
    /// The disk space of shared zeros punched by files of the run, and how
    /// many times (see `may_compare`): disjoint spans, start → (end, times).
    compared: BTreeMap<u64, (u64, u64)>,
}

/// The holders whose zero runs are kept (`SharedZeros::runs`).
const RUNS_KEPT: usize = 16;

impl<'a> SharedZeros<'a> {
    /// The run's files `run`; `outside_too`: `--share-snapshotted`;
    /// `btrfs`: on btrfs, read as root.
    pub(super) fn new(db: &'a Db, run: &'a IdSet, outside_too: bool, btrfs: bool) -> SharedZeros<'a> {
        SharedZeros {
            db,
            run,
            in_run: HashMap::new(),
            outside_too,
            later: HashSet::new(),
            counted: BTreeMap::new(),
            punched_once: BTreeMap::new(),
            by_disk: HashSet::new(),
            btrfs,
            tried: HashSet::new(),
            runs: VecDeque::new(),
            compared: BTreeMap::new(),
        }
    }

    /// Whether `w` may be punched in the open file `fd`:
    /// not shared; or shared on XFS; or shared on btrfs with every holder
    /// of its extent (at `disk`, holding `stretches`) a file of the run,
    /// which needs `CAP_SYS_ADMIN`; or, with `--share-snapshotted`,
    /// whatever holds it outside the run (see the module's doc). If not,
    /// the newest holder outside the run (`None`: the holders cannot be
    /// listed, or not all of them).
    ///
    /// Asked once per extent, not once per file: every file of the run
    /// holding a stretch of it (reflinked pieces of one image: thousands)
    /// would otherwise walk all its holders in turn, a cost growing with
    /// the square of their number (1,500 files each holding 64 KiB of one
    /// extent of written zeros: 1,500 walks of 1,500 holders).
    pub(super) fn may_punch(
        &mut self,
        fd: BorrowedFd<'_>,
        w: &ExtentWork,
        (disk, stretches): (Option<u64>, &[Extent]),
    ) -> Result<(), Option<Outside>> {
        if !w.shared || !self.btrfs {
            return Ok(());
        }
        let Some(e) = stretches.first() else { return Err(None) };
        let (db, run, later, k) = (self.db, self.run, &mut self.later, key(disk, stretches));
        *self.in_run.entry(k).or_insert_with(|| {
            let o = crate::sys::fs::extent_owners(fd, e.physical).ok().filter(|o| o.complete).ok_or(None)?;
            let outside = |&&(volume, ino): &&Outside| {
                !matches!(db.id_of(FileKey { volume, ino }), Ok(Some(id)) if run.contains(id))
            };
            match o.refs.iter().filter(outside).max() {
                None => Ok(()),
                Some(_) if self.outside_too => {
                    later.insert(k);
                    Ok(())
                }
                Some(&by) => Err(Some(by)),
            }
        })
    }

    /// btrfs: every stretch of the extent at `disk` holding disk address
    /// `physical` (a FIEMAP address), as the holder's id and where the
    /// stretch begins in its file, if every holder is a file of the run
    /// (with `--share-snapshotted`, the holders in the run, whatever else
    /// holds it: see the module's doc). If not, the newest holder outside
    /// the run (`None`: they cannot all be listed).
    pub(super) fn holders(
        &mut self,
        fd: BorrowedFd<'_>,
        (disk, physical): (u64, u64),
    ) -> Result<Vec<(FileId, u64)>, Option<Outside>> {
        let o = crate::sys::fs::extent_owners(fd, physical).ok().filter(|o| o.complete).ok_or(None)?;
        // A file holds many stretches (a clone written in place: thousands):
        // each file is looked up once.
        let mut ids: HashMap<Outside, Option<FileId>> = HashMap::new();
        let mut id_of = |(volume, ino): Outside| {
            *ids.entry((volume, ino)).or_insert_with(|| {
                self.db.id_of(FileKey { volume, ino }).ok().flatten().filter(|&id| self.run.contains(id))
            })
        };
        let held: Vec<Option<(FileId, u64)>> =
            o.refs.iter().zip(&o.offsets).map(|(&key, &at)| id_of(key).map(|id| (id, at))).collect();
        match o.refs.iter().zip(&held).filter(|(_, h)| h.is_none()).map(|(k, _)| *k).max() {
            Some(by) if !self.outside_too => Err(Some(by)),
            outside => {
                if outside.is_some() {
                    self.later.insert(disk);
                }
                Ok(held.into_iter().flatten().collect())
            }
        }
    }

    /// Whether the extent at disk address `disk` is tried for the first
    /// time (a dry run, or a try that did not go through, leaves it where
    /// it was: its other holders would try it again).
    pub(super) fn first_try(&mut self, disk: u64) -> bool {
        self.tried.insert(disk)
    }

    /// The zero runs of at least `zeros::MIN_BYTES` of file `id` of `size`
    /// bytes (`None`: its map cannot be read).
    pub(super) fn zero_runs(&mut self, id: FileId, size: u64, block: u64) -> Option<Vec<(u64, u64)>> {
        let kept = match self.runs.iter().position(|r| r.0 == id) {
            Some(i) => self.runs.remove(i)?,
            None => {
                let map = BlockMap::from_blob(&self.db.encoded_map(id).ok()??).ok()?;
                (id, crate::dedupe::zeros::zero_runs(&map, size, block, crate::dedupe::zeros::MIN_BYTES))
            }
        };
        let runs = kept.1.clone();
        self.runs.push_front(kept);
        self.runs.truncate(RUNS_KEPT);
        Some(runs)
    }

    /// Whether the shared zeros of `w`, in the extent of `stretches`, may
    /// be punched in one more file: each punch has the kernel compare the
    /// file's stretch, read from disk where the scan never read it (a
    /// clone's extents are hashed once), so a block of disk is punched at
    /// most [`MAX_COMPARED_PER_ZERO`] times a run. A user's thousands of
    /// clones of a file of zeros of theirs would otherwise make a root run
    /// read every clone; the files past the bound keep their zeros, left
    /// pending for the next run (`zeros_many_clones`), which lets as many
    /// more go. Counted here when they may.
    pub(super) fn may_compare(&mut self, w: &ExtentWork, stretches: &[Extent]) -> bool {
        if !w.shared {
            return true;
        }
        let spans: Vec<(u64, u64)> = disk_spans(w, stretches).collect();
        if spans.iter().any(|&(s, e)| times_punched(&self.compared, s, e) >= MAX_COMPARED_PER_ZERO) {
            return false;
        }
        spans.into_iter().for_each(|(s, e)| add_punch(&mut self.compared, s, e));
        true
    }

    /// The bytes freed by letting go of the `zeros` (offsets into it) of
    /// the extent at disk address `disk` in all its holders of the run:
    /// all of them, unless a holder outside keeps it (none); a dry run
    /// counts them as `freed` does, by disk space, once.
    pub(super) fn freed_clones(&mut self, disk: u64, zeros: &[(u64, u64)], dry_run: bool) -> u64 {
        let bytes = zeros.iter().map(|z| z.1).sum();
        if self.later.contains(&disk) {
            return 0;
        }
        if !dry_run {
            return bytes;
        }
        zeros.iter().map(|&(o, l)| crate::dedupe::add_span(&mut self.counted, disk + o, disk + o + l)).sum()
    }

    /// The bytes freed by punching `bytes` of `w` in the extent of
    /// `stretches` (at `disk`): all of them, unless it is shared. A shared
    /// extent is freed only by the last holder's punch, which finds it no
    /// longer shared; counted there, the count would depend on which
    /// holder comes last (the image holding all of an extent, or a clone
    /// holding 64 KiB of it), and a dry run, which punches nothing, could
    /// not say it. So shared zeros count by disk space, once, when the
    /// first holder found punches them (or would): on btrfs, where every
    /// holder is a file of the run and lets go in turn, and the last
    /// one's punch counts only what no holder counted before; in a dry
    /// run everywhere. On XFS, which frees block by block and cannot say
    /// who holds a block, a run counts what a punch finds unshared, and a
    /// dry run counts shared zeros only where a second punch of the run
    /// covers them: FIEMAP flags a block shared with a second holder, and
    /// if no other file of the run punches it, that holder is outside and
    /// keeps it (a clone outside the run: the run frees nothing). Exact
    /// unless a block two files of the run punch is held outside too.
    pub(super) fn freed(
        &mut self,
        w: &ExtentWork,
        (disk, stretches): (Option<u64>, &[Extent]),
        bytes: u64,
        dry_run: bool,
    ) -> u64 {
        let k = key(disk, stretches);
        let by_disk = match w.shared {
            true => (dry_run || self.btrfs) && !self.later.contains(&k),
            false => self.btrfs && self.by_disk.contains(&k),
        };
        if !by_disk || stretches.is_empty() {
            return if w.shared { 0 } else { bytes };
        }
        self.by_disk.insert(k);
        let second = w.shared && dry_run && !self.btrfs;
        let mut new = 0;
        for (at, end) in disk_spans(w, stretches) {
            new += match second {
                true => punched_again(&mut self.punched_once, &mut self.counted, at, end),
                false => crate::dedupe::add_span(&mut self.counted, at, end),
            };
        }
        new.min(bytes)
    }
}

/// The disk space of `w`'s parts to punch, in the extent of `stretches`:
/// a part lies in one stretch (the runs are cut at their ends).
fn disk_spans<'w>(w: &'w ExtentWork, stretches: &'w [Extent]) -> impl Iterator<Item = (u64, u64)> + 'w {
    w.punch.iter().filter_map(|&(o, l)| {
        let e = stretches.iter().find(|e| e.logical <= o && o < e.logical + e.length)?;
        let at = e.physical + (o - e.logical);
        Some((at, at + l))
    })
}

/// The most times any block of `[start, end)` was punched (`compared`).
fn times_punched(compared: &BTreeMap<u64, (u64, u64)>, start: u64, end: u64) -> u64 {
    compared.range(..end).rev().take_while(|(_, &(e, _))| e > start).map(|(_, &(_, n))| n).max().unwrap_or(0)
}

/// Count one more punch of `[start, end)` in `compared`: the spans it
/// overlaps are cut at its ends, and the gaps between them added.
fn add_punch(compared: &mut BTreeMap<u64, (u64, u64)>, start: u64, end: u64) {
    let over: Vec<(u64, u64, u64)> =
        (compared.range(..end).rev()).take_while(|(_, &(e, _))| e > start).map(|(&s, &(e, n))| (s, e, n)).collect();
    let mut at = start;
    for (s, e, n) in over.into_iter().rev() {
        compared.remove(&s);
        if s < start {
            compared.insert(s, (start, n));
        }
        if at < s {
            compared.insert(at, (s, 1));
        }
        compared.insert(s.max(start), (e.min(end), n + 1));
        if e > end {
            compared.insert(end, (e, n));
        }
        at = e.min(end);
    }
    if at < end {
        compared.insert(at, (end, 1));
    }
}

/// The bytes of disk space `[start, end)` newly counted once punched a
/// second time: the parts `once` (punched before) holds are added to
/// `counted` (what they add is returned), then all of it to `once`.
fn punched_again(once: &mut BTreeMap<u64, u64>, counted: &mut BTreeMap<u64, u64>, start: u64, end: u64) -> u64 {
    let before: Vec<(u64, u64)> =
        once.range(..end).rev().take_while(|&(_, &e)| e > start).map(|(&s, &e)| (s.max(start), e.min(end))).collect();
    crate::dedupe::add_span(once, start, end);
    before.into_iter().map(|(s, e)| crate::dedupe::add_span(counted, s, e)).sum()
}

/// What names the extent of `stretches` (one extent's, in one file) in
/// [`SharedZeros`]' answers: its disk address where btrfs's items named it
/// (`disk`), else the first stretch's FIEMAP address, as asked. One key
/// space serves both: extents do not overlap on disk, so an address inside
/// one is never another's disk address, and a stretch at an extent's start
/// has that address.
fn key(disk: Option<u64>, stretches: &[Extent]) -> u64 {
    disk.or(stretches.first().map(|e| e.physical)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn punches_are_counted_by_disk_space() {
        let mut c = BTreeMap::new();
        add_punch(&mut c, 100, 200);
        add_punch(&mut c, 100, 200);
        assert_eq!(times_punched(&c, 0, 1000), 2);
        add_punch(&mut c, 150, 300);
        assert_eq!(
            c.iter().map(|(&s, &(e, n))| (s, e, n)).collect::<Vec<_>>(),
            [(100, 150, 2), (150, 200, 3), (200, 300, 1)]
        );
        assert_eq!((times_punched(&c, 0, 100), times_punched(&c, 0, 101), times_punched(&c, 200, 250)), (0, 2, 1));
        add_punch(&mut c, 50, 400);
        assert_eq!(
            c.iter().map(|(&s, &(e, n))| (s, e, n)).collect::<Vec<_>>(),
            [(50, 100, 1), (100, 150, 3), (150, 200, 4), (200, 300, 2), (300, 400, 1)]
        );
        add_punch(&mut c, 120, 130);
        assert_eq!(times_punched(&c, 125, 126), 4);
        assert_eq!(times_punched(&c, 100, 120), 3);
        assert_eq!(times_punched(&c, 400, 500), 0);
    }

    #[test]
    fn disk_space_counts_once_a_second_punch_covers_it() {
        let (mut once, mut counted) = (BTreeMap::new(), BTreeMap::new());
        assert_eq!(punched_again(&mut once, &mut counted, 100, 200), 0, "first punch");
        assert_eq!(punched_again(&mut once, &mut counted, 150, 250), 50, "its first half punched before");
        assert_eq!(punched_again(&mut once, &mut counted, 100, 250), 100, "counted once: 100..150 and 200..250");
        assert_eq!(punched_again(&mut once, &mut counted, 100, 250), 0, "a third punch adds nothing");
        assert_eq!(punched_again(&mut once, &mut counted, 300, 400), 0, "apart");
        // Of 50..450, only 300..400 was punched before and not counted.
        assert_eq!(punched_again(&mut once, &mut counted, 50, 450), 100, "two spans, the rest new");
        assert_eq!(punched_again(&mut once, &mut counted, 0, 500), 150, "50..450 but what was counted");
        assert_eq!(counted.iter().map(|(s, e)| e - s).sum::<u64>(), 400);
    }
}
