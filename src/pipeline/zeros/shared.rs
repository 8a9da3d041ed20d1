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
use crate::file::{FileId, FileKey, IdSet};
use crate::sys::fiemap::Extent;

use super::Outside;

/// What the pass knows of the zeros other files share.
pub(super) struct SharedZeros<'a> {
    db: &'a Db,
    /// The files of the run.
    run: &'a IdSet,
    /// btrfs: whether every holder of the extent at a disk address is a
    /// file of the run, asked once per address (see `may_punch`).
    in_run: HashMap<u64, Result<(), Option<Outside>>>,
    /// btrfs, `--share-snapshotted`: let go of extents a file outside the
    /// run holds too.
    outside_too: bool,
    /// Those extents (by the disk address asked), let go of by the files
    /// of the run and freed only once the holders outside are gone.
    later: HashSet<u64>,
    /// A dry run: the disk space of shared zeros counted (see `freed`).
    counted: BTreeMap<u64, u64>,
    /// btrfs: the extents (by disk address) their holders were asked to
    /// let go of together (`clones`), each tried once.
    tried: HashSet<u64>,
    /// The zero runs of the last holders of such extents, most recent
    /// first: an image's extents are held by the same files, extent after
    /// extent, and its map is decoded once, not once an extent.
    runs: VecDeque<(FileId, Vec<(u64, u64)>)>,
}

/// The holders whose zero runs are kept (`SharedZeros::runs`).
const RUNS_KEPT: usize = 16;

impl<'a> SharedZeros<'a> {
    /// The run's files `run`; `outside_too`: `--share-snapshotted`.
    pub(super) fn new(db: &'a Db, run: &'a IdSet, outside_too: bool) -> SharedZeros<'a> {
        SharedZeros {
            db,
            run,
            in_run: HashMap::new(),
            outside_too,
            later: HashSet::new(),
            counted: BTreeMap::new(),
            tried: HashSet::new(),
            runs: VecDeque::new(),
        }
    }

    /// Whether `w` may be punched in the open file `fd` (btrfs: `btrfs`):
    /// not shared; or shared on XFS; or shared on btrfs with every holder
    /// of its extent (`stretches[0]`'s) a file of the run, which needs
    /// `CAP_SYS_ADMIN`; or, with `--share-snapshotted`, whatever holds it
    /// outside the run (see the module's doc). If not, the newest holder
    /// outside the run (`None`: the holders cannot be listed, or not all
    /// of them).
    pub(super) fn may_punch(
        &mut self,
        fd: BorrowedFd<'_>,
        w: &ExtentWork,
        stretches: &[Extent],
        btrfs: bool,
    ) -> Result<(), Option<Outside>> {
        if !w.shared || !btrfs {
            return Ok(());
        }
        let Some(e) = stretches.first() else { return Err(None) };
        let (db, run, later) = (self.db, self.run, &mut self.later);
        *self.in_run.entry(e.physical).or_insert_with(|| {
            let o = crate::sys::fs::extent_owners(fd, e.physical).ok().filter(|o| o.complete).ok_or(None)?;
            let outside = |&&(volume, ino): &&Outside| {
                !matches!(db.id_of(FileKey { volume, ino }), Ok(Some(id)) if run.contains(id))
            };
            match o.refs.iter().filter(outside).max() {
                None => Ok(()),
                Some(_) if self.outside_too => {
                    later.insert(e.physical);
                    Ok(())
                }
                Some(&by) => Err(Some(by)),
            }
        })
    }

    /// btrfs: every stretch of the extent holding disk address `physical`
    /// (a FIEMAP address), as the holder's id and where the stretch begins
    /// in its file, if every holder is a file of the run (with
    /// `--share-snapshotted`, the holders in the run, whatever else holds
    /// it: see the module's doc). If not, the newest holder outside the
    /// run (`None`: they cannot all be listed).
    pub(super) fn holders(&mut self, fd: BorrowedFd<'_>, physical: u64) -> Result<Vec<(FileId, u64)>, Option<Outside>> {
        let o = crate::sys::fs::extent_owners_all(fd, physical).ok().filter(|o| o.complete).ok_or(None)?;
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
                    self.later.insert(physical);
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

    /// The bytes freed by letting go of the `zeros` (offsets into it) of
    /// the extent at disk address `disk` (asked at `physical`) in all its
    /// holders of the run: all of them, unless a holder outside keeps it
    /// (none); a dry run counts them as `freed` does, by disk space, once.
    pub(super) fn freed_clones(&mut self, (disk, physical): (u64, u64), zeros: &[(u64, u64)], dry_run: bool) -> u64 {
        let bytes = zeros.iter().map(|z| z.1).sum();
        if self.later.contains(&physical) {
            return 0;
        }
        if !dry_run {
            return bytes;
        }
        zeros.iter().map(|&(o, l)| crate::dedupe::add_span(&mut self.counted, disk + o, disk + o + l)).sum()
    }

    /// The bytes freed by punching `bytes` of `w` in the extent of
    /// `stretches`: all of them, unless it is shared; then none, as only
    /// the last holder's punch frees, and that one finds it no longer
    /// shared. A dry run punches nothing, so there the first file found
    /// holding shared zeros counts them, once (by disk space), as the run
    /// frees them if every holder is in it and lets go.
    pub(super) fn freed(&mut self, w: &ExtentWork, stretches: &[Extent], bytes: u64, dry_run: bool) -> u64 {
        let later = stretches.first().is_some_and(|e| self.later.contains(&e.physical));
        if !w.shared || !dry_run || later {
            return if w.shared { 0 } else { bytes };
        }
        let mut new = 0;
        for &(o, l) in &w.punch {
            // A part lies in one stretch (the runs are cut at their ends).
            let Some(e) = stretches.iter().find(|e| e.logical <= o && o < e.logical + e.length) else { continue };
            let at = e.physical + (o - e.logical);
            new += crate::dedupe::add_span(&mut self.counted, at, at + l);
        }
        new.min(bytes)
    }
}
