//! Planning: which ranges to share, from which source, into which destinations.
//!
//! Pure logic, no I/O. In: per-file block fingerprint maps, groups of
//! whole-file duplicates, and groups of *anchor* occurrences (blocks whose
//! fingerprint is sampled into the database's index). Out: a [`Plan`], a list
//! of `(source range, destination range)` pairs with equal fingerprints.
//!
//! Every distinct duplicate content ends with exactly one copy, its
//! *source*. A match found on one anchor is extended forward and backward
//! along both files' block maps (the *diagonal*), tolerating short runs of
//! differing blocks, so a 4 KiB-granular match costs one index lookup, and
//! two VM images that differ in scattered blocks are matched in one pass.
//! Equal blocks are joined in a union-find, so whole-file groups, runs
//! inside images and repeats within one file that hold the same content end
//! in one class with one source, and no extent is kept alive by a chain of
//! copies. The plan depends on the data alone (see [`plan`]), and the source
//! is chosen by layout: the copy whose extent stays referenced anyway.

use rustc_hash::FxHashMap;

use crate::blockmap::{BlockMap, Fp};
use crate::file::FileId;

mod claims;
mod copies;
mod from_db;
pub mod group;
mod limits;
mod links;
pub mod map;
mod planner;
mod repeats;
mod sampling;
mod spill;
#[cfg(test)]
mod tests;
mod unionfind;

pub use from_db::{from_db, from_db_with, PlanStats};
pub use limits::Limits;
pub use planner::content_digest;
use planner::{Loc, Planner};
pub use sampling::{anchors, is_sampled, min_anchor, min_anchor_sparse, sampled_anchors, ANCHOR_SHIFT};

/// One file as the planner sees it.
#[derive(Debug, Clone)]
pub struct PlanFile {
    /// Its row id (never used to order anything).
    pub id: FileId,
    /// Inode number: the last tie-break between copies with identical
    /// contents. Never the row id or the path: row ids follow the order in
    /// which hashing threads finished, and paths change with a rename; fresh
    /// copies of one volume image keep their inode numbers.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Fingerprint per block ([`crate::blockmap::short_fp`]), holes and
    /// zero blocks run-length encoded.
    pub blocks: BlockMap,
    /// Other files hold some of its extents and were left out of the plan
    /// for it (see `claims`): those extents stay on disk whatever the plan
    /// does, so the planner prefers it as a source (sharing it into a
    /// copy would free nothing).
    pub held: bool,
}

impl PlanFile {
    /// A file from one fingerprint per block (tests, benchmarks).
    pub fn dense(id: FileId, ino: u64, size: u64, blocks: &[Fp]) -> PlanFile {
        PlanFile { id, ino, size, blocks: BlockMap::from_short(blocks), held: false }
    }
}

/// Tunables of the planner.
#[derive(Debug, Clone, Copy)]
pub struct PlanOptions {
    /// Block size of the fingerprints, in bytes.
    pub block_size: u64,
    /// How many consecutive differing blocks an extension walks over before
    /// it gives up on a diagonal.
    pub gap_blocks: u64,
    /// Shortest range worth sharing, in blocks (a range that is a whole
    /// destination file is always kept).
    pub min_blocks: u64,
    /// The anchor groups hold every block with a given fingerprint (as
    /// [`from_db`] builds them), not a sample: their members are joined
    /// directly, without walking diagonals (which could find nothing more).
    pub exact_groups: bool,
    /// The executor's `--rewrite-ratio`: a destination extent is freed by
    /// rewriting its uncovered rest when that rest is at most this many
    /// times the part shared into it. The planner uses it to tell which
    /// copies stay on disk anyway when choosing sources (see
    /// `planner::Planner::sources`); it never changes which blocks are
    /// shared.
    pub rewrite_ratio: f64,
}

/// The default `--rewrite-ratio`: at most 4 bytes copied for each byte a
/// rewrite frees. At 1 (the default until session 29) btrfs freed nothing
/// where a shared range was less than half of its extent: small files with
/// a common first or last block, a resource shared in the middle of larger
/// files (0–33% of the ideal there, against 100% at 4); on the benchmark
/// corpora 4 frees 2.5 points more of the ideal for about 3.5 times the
/// copying (docs/BENCHMARKS.md, session 29).
pub const DEFAULT_REWRITE_RATIO: f64 = 4.0;

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            block_size: 4096,
            gap_blocks: 32,
            min_blocks: 1,
            exact_groups: false,
            rewrite_ratio: DEFAULT_REWRITE_RATIO,
        }
    }
}

/// One range to share: the destination's bytes become the source's extents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Range {
    /// The file whose extents are kept.
    pub src: FileId,
    /// Byte offset in the source.
    pub src_off: u64,
    /// Length in bytes (unaligned only at both files' EOF).
    pub len: u64,
    /// The file whose bytes are shared into the source's extents.
    pub dest: FileId,
    /// Byte offset in the destination.
    pub dest_off: u64,
}

/// The planner's output, ordered by source so the executor reads sources
/// sequentially.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The ranges, ordered by source, offset, length, destination.
    pub ranges: Vec<Range>,
}

impl Plan {
    /// Bytes the plan would share.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.len).sum()
    }

    /// The files the plan names (sources and destinations), once each.
    pub fn files(&self) -> std::collections::HashSet<FileId> {
        self.ranges.iter().flat_map(|r| [r.src, r.dest]).collect()
    }
}

/// Build the plan. `whole_groups` are sets of files with equal size and
/// block map; `anchor_groups` are the occurrences of one anchor fingerprint
/// each. The result is a function of the files' contents, sizes and inode
/// numbers alone: the order of files and groups and the file ids do not
/// change which blocks are shared or which copy is the source.
///
/// Every block that equals another one found through a whole-file group or
/// an anchor ends in one class (union-find), whatever mix of whole files,
/// runs inside images and repeats within a file led to it; each class has
/// one source and every other member is a destination of it.
pub fn plan(
    files: &[PlanFile],
    whole_groups: &[Vec<FileId>],
    anchor_groups: &[Vec<(FileId, u64)>],
    opts: PlanOptions,
) -> Plan {
    if opts.exact_groups {
        let groups = group::BlockGroups::from(anchor_groups.to_vec());
        return plan_exact(files, whole_groups, groups.iter(), opts);
    }
    let (mut p, ord) = with_whole_files(files, whole_groups, opts);
    // Sampled anchors are walked in a canonical order (what a walk finds
    // depends on the stretches walked before): by fingerprint, then
    // occurrences.
    let mut groups: Vec<(Fp, Vec<Loc>)> = anchor_groups.iter().filter_map(|g| occurrences(&p, &ord, g)).collect();
    groups.sort_unstable();
    for (_, occ) in &groups {
        p.anchor_group(occ);
    }
    p.finish()
}

/// [`plan`] over exact groups (`PlanOptions::exact_groups` implied), given
/// as slices of the caller's [`group::BlockGroups`], never copied into a
/// `Vec` each. The index of files by id is freed before the sources and
/// ranges are chosen, where a plan peaks.
pub fn plan_exact<'g>(
    files: &[PlanFile],
    whole_groups: &[Vec<FileId>],
    groups: impl IntoIterator<Item = &'g [group::Member]>,
    opts: PlanOptions,
) -> Plan {
    plan_exact_with(files, whole_groups, opts, |join| groups.into_iter().for_each(join))
}

/// [`plan_exact`] with the groups handed over by `groups`, one call of
/// `join` each, in any order: they need not all exist at once
/// (`from_db` groups a batch's blocks slice by slice and drops each
/// slice's groups once joined).
pub(crate) fn plan_exact_with(
    files: &[PlanFile],
    whole_groups: &[Vec<FileId>],
    opts: PlanOptions,
    groups: impl FnOnce(&mut dyn FnMut(&[group::Member])),
) -> Plan {
    let (mut p, ord) = with_whole_files(files, whole_groups, PlanOptions { exact_groups: true, ..opts });
    // Joined one at a time, each read in place: the classes a union-find
    // ends with do not depend on the order of the unions, and a second,
    // sorted copy of every group was a third of the plan's memory
    // (heaptrack: 16.8 of 58 MB for sixteen near-copies of a 256 MiB
    // image), a sorted copy of the largest group another 16 MB of 42 for
    // a 4 GiB file of one repeated block.
    groups(&mut |g| p.exact_group(&ord, g));
    drop(ord);
    p.finish()
}

/// The planner over `files` with every whole-file group joined, and the
/// index of files by id the groups are read with.
fn with_whole_files<'a>(
    files: &'a [PlanFile],
    whole_groups: &[Vec<FileId>],
    opts: PlanOptions,
) -> (Planner<'a>, FxHashMap<FileId, u32>) {
    let mut p = Planner::new(files, opts);
    let ord: FxHashMap<FileId, u32> = p.files.iter().enumerate().map(|(i, f)| (f.id, i as u32)).collect();
    // Whole-file groups in content order (a group's first member is its
    // smallest in canonical order).
    let mut whole: Vec<Vec<u32>> = whole_groups
        .iter()
        .map(|g| {
            let mut m: Vec<u32> = g.iter().filter_map(|id| ord.get(id).copied()).collect();
            m.sort_unstable();
            m
        })
        .collect();
    whole.sort_unstable();
    for g in &whole {
        let ids: Vec<FileId> = g.iter().map(|&i| p.files[i as usize].id).collect();
        p.whole_file_group(&ord, &ids);
    }
    (p, ord)
}

/// The data blocks of group `g` in canonical order, once each, those with
/// the first one's fingerprint; `None` for fewer than two.
fn occurrences(p: &Planner<'_>, ord: &FxHashMap<FileId, u32>, g: &[(FileId, u64)]) -> Option<(Fp, Vec<Loc>)> {
    let mut occ: Vec<Loc> = g
        .iter()
        .filter_map(|(id, b)| {
            let f = *ord.get(id)?;
            (p.fp((f, *b)) != 0).then_some((f, *b))
        })
        .collect();
    occ.sort_unstable();
    occ.dedup();
    let fp = p.fp(*occ.first()?);
    occ.retain(|&l| p.fp(l) == fp);
    (occ.len() > 1).then_some((fp, occ))
}
