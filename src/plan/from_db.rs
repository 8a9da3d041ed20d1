//! The plan over what the database knows, in batches: stream the block
//! maps out of [`Db`], group them ([`super::group`], pure), plan
//! ([`super::plan`]) one batch of independent files at a time.
//!
//! Memory stays flat in the number of files (issue 14): whole files are
//! grouped in partitions of bounded size, and the plan is handed out in
//! batches of whole *components* (files linked by a group), each planned
//! alone. Nor does it follow the volume's duplicate data: the first
//! grouping of blocks keeps only which files it links, and each batch
//! groups its own files' blocks again when it is planned.
//!
//! A component's plan does not depend on what else is planned with it:
//! every block of its files, every copy a source could be chosen from and
//! every extent its destinations could pin lie inside it. So a plan in
//! batches is, range for range, the plan in one piece, but for a component
//! past [`Limits::component_blocks`], planned in parts around its hub
//! ([`Component::split`]) so that memory does not follow it.

use std::collections::HashSet;

use super::claims::{Claims, Region, RunCounts, RUN_BUDGET};
use super::copies;
use super::group::{self, MapPass, Member, SliceGrouper, WholeGroup};
use super::limits::{Limits, REGROUP_SLICES};
use super::links::{self, Component, Links};
use super::spill::{self, SliceFiles};
use super::{plan_exact_with, Plan, PlanFile, PlanOptions};
use crate::blockmap::Fp;
use crate::db::Db;
use crate::file::{FileId, IdSet};
use crate::hash::SharedRun;
use rustc_hash::FxHashSet;

/// What a plan over the database came to, besides its ranges.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PlanStats {
    /// Ranges in all batches.
    pub ranges: u64,
    /// Bytes they share.
    pub bytes: u64,
    /// Batches handed out.
    pub batches: u64,
    /// Whole-file duplicate groups planned.
    pub whole_groups: u64,
    /// Copies in them beyond the first of each group.
    pub whole_copies: u64,
    /// Bytes of those copies.
    pub whole_copy_bytes: u64,
    /// Bytes of blocks left out of the plan because another file holds
    /// them in the same place on disk already (see [`super::claims`]):
    /// already shared, as the share phase counts what it finds shared.
    pub already_shared_bytes: u64,
    /// Passes over the block maps the first grouping took (see
    /// [`super::spill`]): one per [`spill::OPEN_SLICES`] slices, one per
    /// slice where no temporary file could be written.
    pub map_passes: u64,
    /// Components past [`Limits::component_blocks`], planned in parts
    /// around their hub ([`Component::split`]).
    pub split_components: u64,
}

/// [`from_db_with`] with the default [`Limits`].
pub fn from_db<E: From<rusqlite::Error>>(
    db: &Db,
    allowed: &IdSet,
    fresh: Option<&HashSet<FileId>>,
    opts: PlanOptions,
    sink: impl FnMut(Plan) -> Result<(), E>,
) -> Result<PlanStats, E> {
    from_db_with(db, allowed, fresh, opts, Limits::default(), sink)
}

/// Plan the `allowed` files and hand the plan to `sink` in batches (each
/// ordered as [`plan`] orders it; none empty). With `fresh`, only groups
/// holding a fresh file are planned (incremental runs), and only the fresh
/// files' fingerprints are grouped. A whole-file group without a fresh
/// copy comes too when a block group of fresh data names its first copy
/// (a new image holding the file): its copies are planned with it, so
/// reflinked clones of it are shared into together. Left out, the first
/// copy alone was found held by its clones and left pending until the
/// weekly full plan.
///
/// How: whole-file groups first, partition by partition; then groups of
/// equal blocks among the files that are not a second copy (see
/// [`super::group`] for how, and its memory bound). A whole-file group
/// whose first copy is in no block group is a component of its own; those
/// fill batches as they come. The rest, with the block groups, split into
/// components by a union-find over their files, fill the
/// other batches, component by component (a component's size is that of
/// the duplicate blocks between distinct files, not a number of files).
///
/// Nothing here depends on the order of rows or on file ids: the planner
/// orders everything by content (see [`plan`]), and a batch is planned as
/// it would be in one piece.
pub fn from_db_with<E: From<rusqlite::Error>>(
    db: &Db,
    allowed: &IdSet,
    fresh: Option<&HashSet<FileId>>,
    opts: PlanOptions,
    limits: Limits,
    mut sink: impl FnMut(Plan) -> Result<(), E>,
) -> Result<PlanStats, E> {
    // One read transaction for every query below.
    let _snapshot = db.snapshot()?;
    let keep = |id: FileId| allowed.contains(id);
    let parts = group::partitions(db.count_maps()?, limits.whole_keys);
    let mut pass = MapPass::new(limits.fresh_keys);
    let mut covered = IdSet::new();
    // With one partition, its groups are kept rather than read again.
    let mut kept: Vec<WholeGroup> = Vec::new();
    for part in 0..parts {
        let groups = whole_partition(db, &keep, part, parts, |id, map| {
            if part == 0 {
                pass.add(map, fresh.is_some_and(|f| f.contains(&id)));
            }
        })?;
        for (_, g) in &groups {
            // Copies beyond the first bring nothing the first does not.
            g[1..].iter().for_each(|&id| covered.insert(id));
        }
        if parts == 1 {
            kept = groups;
        }
    }
    let in_groups = |id| keep(id) && !covered.contains(id);
    let claims = shared_claims(db, (in_groups, keep), fresh)?;
    let keys = fresh.and_then(|_| pass.keys());
    let blocks = pass.data_blocks.saturating_sub(claims.blocks());
    let slices = group::slices_within(blocks, limits.group_blocks);
    let (links, skipped, passes) = link_blocks(db, in_groups, keys, fresh, &claims, slices)?;
    drop(covered);

    let stats =
        PlanStats { already_shared_bytes: skipped * opts.block_size, map_passes: passes, ..PlanStats::default() };
    let mut out = Batcher { db, opts, limits, claims, keys, fresh, stats };
    let mut batch = Batch::default();
    let mut joined: Vec<WholeGroup> = Vec::new();
    let mut take = |(size, g): WholeGroup, batch: &mut Batch, joined: &mut Vec<WholeGroup>, out: &mut Batcher| {
        // Without a fresh copy, kept when fresh data names its first copy.
        if !group::keeps(fresh, g.iter().copied()) && !links.has(g[0]) {
            return Ok(());
        }
        out.stats.whole_groups += 1;
        out.stats.whole_copies += g.len() as u64 - 1;
        out.stats.whole_copy_bytes += (g.len() as u64 - 1) * size;
        if links.has(g[0]) {
            joined.push((size, g));
            return Ok(());
        }
        batch.add_whole(size, g);
        out.flush_if_full(batch, &mut sink)
    };
    if parts == 1 {
        for g in kept {
            take(g, &mut batch, &mut joined, &mut out)?;
        }
    } else {
        for part in 0..parts {
            for g in whole_partition(db, &keep, part, parts, |_, _| {})? {
                take(g, &mut batch, &mut joined, &mut out)?;
            }
        }
    }
    // The components the block groups join, into the same batches.
    for c in links.components(joined) {
        out.component(c, &mut batch, &mut sink)?;
    }
    out.plan(batch, &mut sink)?;
    Ok(out.stats)
}

/// Link the files whose blocks are equal to another file's into
/// components, among the files `keep` accepts (not a whole file's second
/// copy), with the blocks another of them holds in the same place on disk
/// left out ([`Claims`]); also how many were, and how many passes over the
/// maps it took. The blocks are grouped in `slices` slices of the
/// fingerprint space (see [`group`]), written out by one pass for up to
/// [`spill::OPEN_SLICES`] of them (see [`spill`]; one pass each where that
/// fails), and each slice's groups are dropped once their files are
/// linked: every batch groups its own files' blocks again
/// ([`Batcher::regroup`]). Kept for the whole plan, the groups cost 12
/// bytes a duplicate block of the volume (and 8 an index per group in its
/// batch's list), so the plan's memory followed the volume's duplicate
/// data, not its largest component: 44 MB for four near-copies of a 3 GiB
/// image, ~12 GB for a volume holding 1 billion duplicate blocks.
fn link_blocks(
    db: &Db,
    keep: impl Fn(FileId) -> bool + Copy,
    keys: Option<&FxHashSet<Fp>>,
    fresh: Option<&HashSet<FileId>>,
    claims: &Claims,
    slices: u32,
) -> rusqlite::Result<(Links, u64, u64)> {
    let mut links = Links::default();
    let (mut skipped, mut passes) = (0, 0);
    let mut link = |g: SliceGrouper| {
        skipped += g.finish_each(|g| {
            if group::keeps(fresh, g.iter().map(|o| o.file())) {
                links.add(g);
            }
        })
    };
    let by_pass = |slice| {
        let mut g = SliceGrouper::new(slice, slices, keys);
        db.for_each_map(keep, |id, _, map| {
            let mark = links::mark(map);
            g.add_as(id, map, claims.skips(id), |_| mark)
        })
        .map(|()| g)
    };
    let mut next = 0;
    while next < slices {
        let range = next..slices.min(next.saturating_add(spill::OPEN_SLICES));
        next = range.end;
        // A slice alone is grouped straight from its pass.
        let written = match range.len() > 1 {
            true => write_slices(db, keep, keys, claims, range.clone(), slices)?,
            false => None,
        };
        passes += u64::from(written.is_some());
        let Some(written) = written else {
            for slice in range {
                link(by_pass(slice)?);
                passes += 1;
            }
            continue;
        };
        for (slice, (file, left_out)) in range.zip(written) {
            let mut g = SliceGrouper::new(slice, slices, keys);
            g.add_skipped(left_out);
            match spill::read_slice(file, &mut g) {
                Ok(()) => link(g),
                Err(_) => {
                    link(by_pass(slice)?);
                    passes += 1;
                }
            }
        }
    }
    Ok((links, skipped, passes))
}

/// One pass over the maps writing out the blocks of slices `range` (see
/// [`spill`]); `None` where a temporary file could not be made or written.
fn write_slices(
    db: &Db,
    keep: impl Fn(FileId) -> bool + Copy,
    keys: Option<&FxHashSet<Fp>>,
    claims: &Claims,
    range: std::ops::Range<u32>,
    slices: u32,
) -> rusqlite::Result<Option<Vec<(std::fs::File, u64)>>> {
    let Ok(mut files) = SliceFiles::create(range, slices, keys, crate::sys::spill::spill_file) else {
        return Ok(None);
    };
    db.for_each_map(keep, |id, _, map| files.add(id, map, claims.skips(id)))?;
    Ok(files.finish().ok())
}

/// The [`Claims`] of the shared runs of the files `keep` accepts; in an
/// incremental plan (`fresh`), only where the fresh files lie on disk.
/// With the files earlier runs shared ranges from, wherever they lie,
/// among all the files `allowed`.
fn shared_claims(
    db: &Db,
    (keep, allowed): (impl Fn(FileId) -> bool + Copy, impl Fn(FileId) -> bool),
    fresh: Option<&HashSet<FileId>>,
) -> rusqlite::Result<Claims> {
    let region = match fresh {
        None => None,
        Some(f) => {
            let mut r = Region::default();
            db.for_each_shared_runs(|id| keep(id) && f.contains(&id), |_, _, salt, runs| r.add(salt, runs))?;
            Some(r)
        }
    };
    let runs_of = |salt, runs: &[SharedRun]| region.as_ref().map_or_else(|| runs.to_vec(), |r| r.clip(salt, runs));
    // Counted first, so that nothing is held before the budget is known
    // (one more pass over the runs: a small table, not the maps).
    let mut counts = RunCounts::default();
    db.for_each_shared_runs(keep, |_, _, salt, runs| counts.add(&runs_of(salt, runs)))?;
    let min = counts.shortest(RUN_BUDGET);
    let mut files = Vec::new();
    db.for_each_shared_runs(keep, |id, key, salt, runs| {
        let mut runs = runs_of(salt, runs);
        runs.retain(|r| r.2 >= min);
        if !runs.is_empty() {
            files.push((id, key, salt, runs));
        }
    })?;
    // Every copy of a whole-file group, not only the first (`keep` leaves
    // the others out of the claims): which copy comes first is a matter of
    // row ids, which the hashing threads' order gives, and the held one
    // must be the source whatever its id (two fresh copies of one volume
    // planned 4,025 and 3,983 ranges on the same night).
    Ok(Claims::build(files).with_sources(db.sources(allowed)?))
}

/// The whole-file groups of partition `part` of `parts` of the map-hash
/// space, with `each` called on every allowed file's map on the way.
fn whole_partition(
    db: &Db,
    keep: &impl Fn(FileId) -> bool,
    part: u64,
    parts: u64,
    mut each: impl FnMut(FileId, &[u8]),
) -> rusqlite::Result<Vec<WholeGroup>> {
    let mut keys = Vec::new();
    db.for_each_map(keep, |id, size, map| {
        each(id, map);
        let (size, h) = group::whole_key(size, map);
        if h % parts == part {
            keys.push((size, h, id));
        }
    })?;
    Ok(group::group_whole_files(keys))
}

/// Groups gathered for one batch: whole components only.
#[derive(Default)]
struct Batch {
    whole: Vec<Vec<FileId>>,
    /// The files of its block groups (grouped again when it is planned),
    /// each with the number of its component in the batch.
    block_files: Vec<(FileId, u32)>,
    /// Components.
    components: u32,
    /// Files.
    files: u64,
    /// Data blocks of the planner, estimated: a whole-file copy by its
    /// size (holes cost nothing there), a block group by its members (the
    /// rest of a file in a block group is not counted).
    weight: u64,
    /// In a split component's later parts, its hub and bridge: planned in a
    /// part before, the sources of all they hold, never destinations (see
    /// [`Component::split`]).
    planned: Vec<FileId>,
}

impl Batch {
    /// A batch of one component.
    fn of(c: Component) -> Batch {
        let mut b = Batch { components: 1, ..Batch::default() };
        for (id, members) in c.files {
            b.files += 1;
            b.weight += members;
            b.block_files.push((id, 0));
        }
        for (size, g) in c.whole {
            b.add_whole(size, g);
        }
        b
    }

    fn add_whole(&mut self, size: u64, g: Vec<FileId>) {
        // The planner sees at most `copies::PLANNED` copies of a group
        // (at the default limits).
        let planned = g.len().min(copies::PLANNED) as u64;
        self.files += planned;
        self.weight += planned * size.div_ceil(4096);
        self.whole.push(g);
    }

    fn append(&mut self, mut other: Batch) {
        self.whole.append(&mut other.whole);
        let first = self.components;
        self.block_files.extend(other.block_files.iter().map(|&(id, c)| (id, first + c)));
        self.components += other.components;
        self.files += other.files;
        self.weight += other.weight;
    }

    fn full(&self, limits: &Limits) -> bool {
        self.files >= limits.batch_files || self.weight >= limits.batch_blocks
    }
}

/// Plans batches and counts what it handed out.
struct Batcher<'d> {
    db: &'d Db,
    opts: PlanOptions,
    limits: Limits,
    /// The blocks left out of grouping, and the files holding extents
    /// another file's run also covers: those stay on disk whatever the
    /// plan does (see [`super::claims`]).
    claims: Claims,
    /// An incremental plan's fingerprints and fresh files (see
    /// [`from_db_with`]).
    keys: Option<&'d FxHashSet<Fp>>,
    fresh: Option<&'d HashSet<FileId>>,
    stats: PlanStats,
}

impl Batcher<'_> {
    /// Plan `batch` and hand it on once it is full.
    fn flush_if_full<E: From<rusqlite::Error>>(
        &mut self,
        batch: &mut Batch,
        sink: &mut impl FnMut(Plan) -> Result<(), E>,
    ) -> Result<(), E> {
        if batch.full(&self.limits) {
            self.plan(std::mem::take(batch), sink)?;
        }
        Ok(())
    }

    /// Add component `c` to `batch`; one too large for memory in parts,
    /// each a batch of its own (the hub is in all of them).
    fn component<E: From<rusqlite::Error>>(
        &mut self,
        c: Component,
        batch: &mut Batch,
        sink: &mut impl FnMut(Plan) -> Result<(), E>,
    ) -> Result<(), E> {
        if c.weight() <= self.limits.component_blocks {
            batch.append(Batch::of(c));
            return self.flush_if_full(batch, sink);
        }
        let ids: Vec<FileId> = c.files.iter().map(|f| f.0).collect();
        let inos: rustc_hash::FxHashMap<FileId, u64> = self.db.copy_keys(&ids)?.iter().map(|k| (k.id, k.ino)).collect();
        let parts = c.split(self.limits.component_blocks, |id| inos.get(&id).copied().unwrap_or(u64::MAX));
        self.stats.split_components += u64::from(parts.len() > 1);
        self.plan(std::mem::take(batch), sink)?;
        for p in parts {
            self.plan(Batch { planned: p.planned, ..Batch::of(p.component) }, sink)?;
        }
        Ok(())
    }

    /// Plan one batch and hand it on.
    /// Whole-file groups of many copies are planned with two of them; the
    /// others follow in plans of their own ([`copies`]).
    fn plan<E: From<rusqlite::Error>>(
        &mut self,
        mut batch: Batch,
        sink: &mut impl FnMut(Plan) -> Result<(), E>,
    ) -> Result<(), E> {
        if batch.whole.is_empty() && batch.block_files.is_empty() {
            return Ok(());
        }
        let mut followers = Vec::new();
        let held = |id| self.claims.is_held(id) || batch.planned.contains(&id);
        for g in &mut batch.whole {
            followers.extend(copies::reduce(self.db, g, self.limits.whole_copies, held)?);
        }
        batch.block_files.sort_unstable();
        let block_ids: Vec<FileId> = batch.block_files.iter().map(|f| f.0).collect();
        let ids = group::involved(&batch.whole, &block_ids);
        drop(block_ids);
        let files: Vec<PlanFile> = (self.db.map_rows(ids)?.into_iter())
            .map(|r| PlanFile { id: r.id, ino: r.ino, size: r.size, blocks: r.map, held: held(r.id) })
            .collect();
        let mut p = plan_exact_with(&files, &batch.whole, self.opts, |join| {
            self.regroup(&files, &batch.block_files, join);
        });
        drop(files);
        let planned = std::mem::take(&mut batch.planned);
        drop(batch);
        let mut moved: rustc_hash::FxHashSet<FileId> = followers.iter().flat_map(|f| f.planned()).copied().collect();
        let groups = copies::with_templates(&p, followers, |id| planned.contains(&id));
        moved.extend(groups.iter().filter_map(|g| g.moved_first()));
        p.ranges.retain(|r| !moved.contains(&r.dest) && !planned.contains(&r.dest));
        self.emit(p, sink)?;
        let bounds = (copies::FOLLOW_RANGES.min(self.limits.batch_blocks as usize), self.limits.batch_files as usize);
        copies::follow(&groups, bounds, |p| self.emit(p, sink))
    }

    /// Hand `join` the block groups among `block_files` (sorted, each with
    /// its component), as [`link_blocks`] found them: a component's groups
    /// lie among its own files, so grouping their blocks alone finds them
    /// all, and nothing else but the lone pairs of blocks that did not link
    /// two components ([`super::links`]), dropped here. Slice by slice of
    /// [`REGROUP_BUDGET`] blocks, each slice's groups dropped once joined.
    fn regroup(&self, files: &[PlanFile], block_files: &[(FileId, u32)], join: &mut dyn FnMut(&[Member])) {
        let component = |id: FileId| block_files.binary_search_by_key(&id, |f| f.0).ok().map(|i| block_files[i].1);
        let mine = || files.iter().filter(|f| component(f.id).is_some());
        let data_blocks = mine().map(|f| f.blocks.data_len()).sum();
        // Sliced in an incremental plan too: the fresh files' fingerprints
        // bound the blocks grouped, but in a component of near-copies every
        // copy holds them (see `group::slices_within`).
        let slices = group::slices_within(data_blocks, self.limits.regroup_blocks).min(REGROUP_SLICES);
        for slice in 0..slices {
            let mut g = SliceGrouper::new(slice, slices, self.keys);
            mine().for_each(|f| g.add(f.id, f.blocks.as_bytes(), self.claims.skips(f.id)));
            g.finish_each(|g| {
                let apart = matches!(g, [a, b] if component(a.file()) != component(b.file()));
                if !apart && group::keeps(self.fresh, g.iter().map(|o| o.file())) {
                    join(g);
                }
            });
        }
    }

    /// Hand one plan on, counted; an empty one is dropped.
    fn emit<E>(&mut self, p: Plan, sink: &mut impl FnMut(Plan) -> Result<(), E>) -> Result<(), E> {
        if p.ranges.is_empty() {
            return Ok(());
        }
        self.stats.ranges += p.ranges.len() as u64;
        self.stats.bytes += p.bytes();
        self.stats.batches += 1;
        sink(p)
    }
}
