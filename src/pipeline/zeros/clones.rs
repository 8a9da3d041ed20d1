//! btrfs: an extent reflinked clones share with data in it, freed by all
//! its holders at once (`dedupe::zeros::clones` says why and how).
//!
//! btrfs lists the holders (`BTRFS_IOC_LOGICAL_INO_V2`, as root); every
//! one must be a file of the run (so no file outside the starting paths,
//! excluded or marked `user.nodedup`, and no read-only snapshot, is
//! touched or keeps the extent). Each is opened below the starting paths
//! and checked to be what was scanned before anything is done, and again
//! before each step; its stretches of the extent are read from its items.
//! The holders already share the extent, so sharing its data among them
//! shows no one anything FIEMAP did not.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::sync::atomic::AtomicBool;

use crate::db::Db;
use crate::dedupe::headroom::kept_free;
use crate::dedupe::zeros::{self, clones};
use crate::display::display_path;
use crate::errors::ErrorKind;
use crate::file::{FileFacts, FileId};
use crate::progress::Progress;
use crate::sys::btrfs_tree;
use crate::sys::dedupe::{dedupe_range, DedupeStatus, MAX_REQUEST_LEN};
use crate::sys::fiemap::Extent;

use super::{error_kind, Outside, Visit, ZeroPass};

/// The holders of one extent kept open while it is worked on. The rest
/// are opened again, and checked again, for each step that uses them: an
/// extent a VM store's golden image shares with hundreds of its clones is
/// freed too, with never more than this many files open.
const KEPT_OPEN: usize = 256;

/// A holder of the extent, checked to be as scanned; its file kept open
/// (`None`: one of those past [`KEPT_OPEN`], opened when used).
struct Holder {
    id: FileId,
    facts: FileFacts,
    file: Option<File>,
}

/// A holder's file for one step: kept open, or opened again for it.
enum Opened<'h> {
    Kept(&'h File),
    Again(File),
}

impl std::ops::Deref for Opened<'_> {
    type Target = File;
    fn deref(&self) -> &File {
        match self {
            Opened::Kept(f) => f,
            Opened::Again(f) => f,
        }
    }
}

/// What the work on an extent came to: the bytes freed (a dry run: that
/// would be), those that wait for room above `--keep-free` (the visiting
/// file is left pending for them), and the newest holder outside the run
/// that kept it from being tried (the visiting file waits for it to go).
#[derive(Default)]
pub(super) struct Together {
    pub freed: u64,
    pub waiting: u64,
    pub held: Option<Outside>,
}

/// Why the work on an extent stopped: said with `-v` (the holder's own
/// visit says more); no room above `--keep-free` for the copy (said once
/// a run); or an error of a holder, counted and said.
enum Stop {
    Left(String),
    NoRoom(std::io::Error),
    Failed(usize, ErrorKind, String, Option<i32>),
}

impl ZeroPass<'_> {
    /// The stretches `g` of the open file `f` (id `id`) lie in an extent
    /// shared with data in it (`wanted`: `ExtentWork::clones`), at `disk`:
    /// free it with all its holders at once, if they are all files of the
    /// run and the ratio allows; tried once a run.
    pub(super) fn clones_of(
        &self,
        db: &Db,
        (id, f): (FileId, &File),
        (disk, g): (Option<u64>, &[Extent]),
        wanted: bool,
        v: &mut Visit,
        (progress, stop): (&dyn Progress, &AtomicBool),
    ) -> Together {
        let none = Together::default();
        let (Some(b), Some(disk), Some(first)) = (self.bookends.filter(|_| wanted), disk, g.first()) else {
            return none;
        };
        if !v.shared.first_try(disk) {
            return none;
        }
        let refs = match v.shared.holders(f.as_fd(), (disk, first.physical)) {
            Ok(refs) => refs,
            Err(held) => return Together { held, ..none },
        };
        let Some((holders, held)) = self.holders(db, (id, disk), &refs, v) else { return none };
        let zero_runs: Option<Vec<_>> =
            holders.iter().map(|h| v.shared.zero_runs(h.id, h.facts.size, self.block)).collect();
        let Some(z) = zero_runs else { return none };
        let work = match clones::plan(&held, &z, self.block, zeros::MIN_BYTES, b.max_ratio) {
            Ok(work) => work,
            Err(why) => {
                if let Some(why) = why.said() {
                    progress
                        .info(&format!("{}: zeros its clones share left: {why}", display_path(&holders[0].facts.path)));
                }
                return none;
            }
        };
        match self.steps(&work, &holders, b, v) {
            Ok(()) => {
                for (i, h) in holders.iter().enumerate() {
                    if work.steps.iter().any(|s| matches!(s, clones::Step::Punch { holder, .. } if *holder == i)) {
                        v.count(h.id);
                    }
                }
                Together { freed: v.shared.freed_clones(disk, &work.zeros, self.dry_run), ..none }
            }
            Err(Stop::Left(why)) => {
                progress.info(&format!("{}: zeros its clones share left: {why}", display_path(&holders[0].facts.path)));
                none
            }
            Err(Stop::NoRoom(e)) => {
                if b.room.first_refusal() {
                    let not = if self.dry_run { "would not be" } else { "not" };
                    let path = display_path(&holders[0].facts.path);
                    progress.warn(&format!("{path}: written zeros its clones share {not} turned into holes: {e}"));
                }
                Together { waiting: work.zero_bytes(), ..none }
            }
            Err(Stop::Failed(i, _, why, errno)) if super::is_full(errno) => {
                self.full(&holders[i].facts.path, &why, v.out, progress);
                Together { waiting: work.zero_bytes(), ..none }
            }
            Err(Stop::Failed(i, kind, why, errno)) => {
                self.failed(v.out, &holders[i].facts, (kind, &why, errno), (progress, stop));
                none
            }
        }
    }

    /// Every holder of the extent at `disk`, opened and checked (`id`'s
    /// first), with its stretches of it (`refs`: holder id and where a
    /// stretch begins in its file). `None` if one is not as scanned, or
    /// its stretch is not in the extent, or reaches past the end of its
    /// file. Each holder is opened once here, however many stretches it
    /// holds; the first [`KEPT_OPEN`] stay open.
    fn holders(
        &self,
        db: &Db,
        (id, disk): (FileId, u64),
        refs: &[(FileId, u64)],
        v: &mut Visit,
    ) -> Option<(Vec<Holder>, Vec<clones::Held>)> {
        let mut ids: Vec<FileId> = refs.iter().map(|r| r.0).collect();
        ids.sort_unstable_by_key(|&i| (i != id, i));
        ids.dedup();
        let index: HashMap<FileId, usize> = ids.iter().enumerate().map(|(i, &h)| (h, i)).collect();
        let mut stretches: Vec<Vec<usize>> = vec![Vec::new(); ids.len()];
        refs.iter().enumerate().for_each(|(k, r)| stretches[index[&r.0]].push(k));
        let mut facts = db.file_facts(ids.iter().copied()).ok()?;
        let mut holders = Vec::with_capacity(ids.len());
        let mut held = vec![None; refs.len()];
        for (holder, hid) in ids.into_iter().enumerate() {
            let facts = facts.remove(&hid)?;
            let file = self.checked(&facts, v)?;
            for &k in &stretches[holder] {
                let off = refs[k].1;
                let mut found = None;
                btrfs_tree::file_extents(file.as_fd(), off..off + 1, |s| found = found.or(Some(s))).ok()?;
                let s = found.filter(|s| s.logical == off && s.disk == disk && s.logical + s.length <= facts.size)?;
                held[k] = Some(clones::Held { holder, file: s.logical, at: s.logical - s.span.0, len: s.length });
            }
            holders.push(Holder { id: hid, facts, file: (holder < KEPT_OPEN).then_some(file) });
        }
        Some((holders, held.into_iter().collect::<Option<Vec<_>>>()?))
    }

    /// The file of `facts` opened below the starting paths, if it is the
    /// one scanned, unchanged, and not a NOCOW file the run leaves alone.
    fn checked(&self, facts: &FileFacts, v: &mut Visit) -> Option<File> {
        let file = self.tree.open_file(&facts.path).ok()?;
        let left = crate::dedupe::nocow_left(self.leave_nocow, &file) != Ok(false);
        (facts.is_open_as_recorded(&file, v.keys) && !left).then_some(file)
    }

    /// Holder `h`'s file for a step: kept open, or opened and checked again.
    fn holder_file<'h>(&self, h: &'h Holder, v: &mut Visit) -> Option<Opened<'h>> {
        match &h.file {
            Some(f) => Some(Opened::Kept(f)),
            None => self.checked(&h.facts, v).map(Opened::Again),
        }
    }

    /// Do the `work`'s steps in order; the first that does not go through
    /// stops the rest. A dry run copies nothing and shares nothing (the
    /// holders hold the same bytes: they share them), and reads back what
    /// it would punch.
    fn steps(
        &self,
        work: &clones::ClonesWork,
        holders: &[Holder],
        b: &crate::dedupe::Bookends,
        v: &mut Visit,
    ) -> Result<(), Stop> {
        let changed =
            |i: usize| Stop::Left(format!("{} changed since it was scanned", display_path(&holders[i].facts.path)));
        for step in &work.steps {
            match step {
                clones::Step::Copy { holder, parts } => {
                    let h = &holders[*holder];
                    let file = self.holder_file(h, v).ok_or_else(|| changed(*holder))?;
                    let same = || h.facts.is_open_as_recorded(&file, v.keys);
                    let tmp = || self.tree.tmpfile();
                    match zeros::rewrite(&b.room, tmp, &file, h.facts.size, parts, self.dry_run, same) {
                        Ok(true) => v.out.rewritten += parts.iter().map(|p| p.1).sum::<u64>(),
                        Ok(false) => return Err(changed(*holder)),
                        Err(e) if kept_free(&e) => return Err(Stop::NoRoom(e)),
                        Err(e) => {
                            let why = format!("data not rewritten: {e}");
                            return Err(Stop::Failed(*holder, error_kind(e.raw_os_error()), why, e.raw_os_error()));
                        }
                    }
                }
                clones::Step::Share { from, from_at, to, to_at, len } => {
                    let (s, d) = (&holders[*from], &holders[*to]);
                    let dest = self.holder_file(d, v).ok_or_else(|| changed(*to))?;
                    if !d.facts.is_open_as_recorded(&dest, v.keys) {
                        return Err(changed(*to));
                    }
                    if !self.dry_run {
                        let src = self.holder_file(s, v).ok_or_else(|| changed(*from))?;
                        share(&src, *from_at, &dest, *to_at, *len).map_err(|e| match e {
                            Some(e) => {
                                Stop::Failed(*to, ErrorKind::Zeros, format!("data not shared: {e}"), Some(e as i32))
                            }
                            None => changed(*to),
                        })?;
                    }
                }
                clones::Step::Punch { holder, parts } => {
                    let h = &holders[*holder];
                    let file = self.holder_file(h, v).ok_or_else(|| changed(*holder))?;
                    let hole = v.holes.for_file(&file, self.tree);
                    let same = || h.facts.is_open_as_recorded(&file, v.keys);
                    match zeros::punch(hole, &file, parts, same) {
                        Ok(p) if p.bytes == parts.iter().map(|p| p.1).sum::<u64>() => {}
                        Ok(_) => return Err(changed(*holder)),
                        Err(e) => {
                            let why = format!("written zero blocks not turned into holes: {e}");
                            return Err(Stop::Failed(*holder, error_kind(Some(e as i32)), why, Some(e as i32)));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Share `len` bytes at `from_at` of `src` into `to_at` of `dest`, a
/// request at a time. `Err(None)`: the kernel found them different (the
/// file changed).
fn share(src: &File, from_at: u64, dest: &File, to_at: u64, len: u64) -> Result<(), Option<nix::errno::Errno>> {
    let mut done = 0;
    while done < len {
        let n = (len - done).min(MAX_REQUEST_LEN);
        crate::dedupe::prefetch_request(src, from_at + done, from_at + len);
        crate::dedupe::prefetch_request(dest, to_at + done, to_at + len);
        let r = dedupe_range(src.as_fd(), from_at + done, n, &[(dest.as_fd(), to_at + done)]).map_err(Some)?[0];
        match r.status {
            DedupeStatus::Same if r.bytes_deduped == n => done += n,
            DedupeStatus::Error(e) => return Err(Some(e)),
            _ => return Err(None),
        }
    }
    Ok(())
}
