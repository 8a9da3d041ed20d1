//! How large the pieces of a plan may grow ([`Limits`]): the budgets that
//! keep [`super::from_db`]'s memory flat in the number of files and in the
//! size of the volume, each with what it was measured to cost.

use super::copies;
use super::group;

/// Most files planned in one batch (a batch holds the maps of its files,
/// the union-find of their blocks, their ranges and recorded facts: a few
/// hundred bytes a file).
pub const BATCH_FILES: u64 = 16_000;

/// Most data blocks planned in one batch. Measured with heaptrack on the
/// FULL benchmark corpus (1.06 million data blocks, 126,815 files): about
/// 100 bytes of heap a block while a batch is planned (maps, union-find,
/// groups, the choice of sources, ranges), so a batch of 8 Mi blocks as
/// before could take 800 MB, and FULL in one batch made the run's peak
/// RSS 140 MB. With 256 Ki blocks (and 16,000 files) a batch takes at most
/// about 25 MB beyond its largest component (never split within
/// [`COMPONENT_BLOCKS`]):
/// peak RSS 76 MB on FULL, the same plan (space freed identical), planning
/// no slower (323 against 527 ms). Smaller still (64 Ki blocks, 4,000
/// files) saved only 10 MB more: the largest component dominates.
pub const BATCH_BLOCKS: u64 = 256 << 10;

/// Most blocks of a batch grouped at once when it is planned (16 bytes
/// each while grouped: 4 MiB; [`Limits::regroup_blocks`]), unless that
/// takes more than [`REGROUP_SLICES`] slices. The batch's maps and the
/// planner's arrays (about 10 bytes a block) are in memory then, and a
/// slice costs one pass over those maps, not over the database. Four
/// near-copies of a 1 GiB image, one component of a million blocks: heap
/// 43 MB with slices of 1 Mi blocks, run peak RSS 27 MB with these.
pub const REGROUP_BUDGET: u64 = 1 << 18;

/// Most slices a batch is grouped in when planned: each is a pass over all
/// of its maps (five near-copies of a 4 GiB image: plan 1.5 s with the
/// groups kept, 2.1 s in 20 slices). With at most 8, a larger component
/// groups in slices of an eighth of its blocks, 2 bytes a block beside the
/// 10 of its maps and the planner's arrays.
pub const REGROUP_SLICES: u32 = 8;

/// Most blocks in groups of one component planned in one piece; a larger
/// component is planned in parts around its hub ([`super::links::Component::split`]).
/// A component costs about 16 bytes a block of its files while planned
/// (maps, union-find, the choice of sources): six 3 GiB near-copies of a
/// VM image, 4.7 M blocks, took 75 MB to plan, and a golden image with
/// twenty 40 GiB clones would take GBs. 8 Mi blocks (32 GiB of duplicate
/// data) keep a part near 150 MB, and leave every component of the corpora
/// measured (FULL's largest is a few hundred thousand blocks) in one piece.
pub const COMPONENT_BLOCKS: u64 = 8 << 20;

/// How large the pieces of a plan may grow; see [`super::from_db_with`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Whole-file keys grouped at once ([`group::WHOLE_BUDGET`]).
    pub whole_keys: u64,
    /// Files in one batch ([`BATCH_FILES`]).
    pub batch_files: u64,
    /// Data blocks in one batch ([`BATCH_BLOCKS`]).
    pub batch_blocks: u64,
    /// Copies of a whole-file group planned together; the others follow
    /// ([`copies::PLANNED`], at least that).
    pub whole_copies: usize,
    /// Blocks of a batch grouped at once when it is planned
    /// ([`REGROUP_BUDGET`]).
    pub regroup_blocks: u64,
    /// Fingerprints of fresh files an incremental plan groups by
    /// ([`group::FRESH_KEYS`]).
    pub fresh_keys: u64,
    /// Blocks the first grouping takes at once ([`group::GROUP_BUDGET`]).
    pub group_blocks: u64,
    /// Blocks in groups of a component planned in one piece
    /// ([`COMPONENT_BLOCKS`]).
    pub component_blocks: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            whole_keys: group::WHOLE_BUDGET,
            batch_files: BATCH_FILES,
            batch_blocks: BATCH_BLOCKS,
            whole_copies: copies::PLANNED,
            regroup_blocks: REGROUP_BUDGET,
            fresh_keys: group::FRESH_KEYS,
            group_blocks: group::GROUP_BUDGET,
            component_blocks: COMPONENT_BLOCKS,
        }
    }
}

impl Limits {
    /// Tiny limits, so that a test on a few files goes through every path
    /// of batching: several whole-key partitions, many batches, followers.
    pub const TINY: Limits = Limits {
        whole_keys: 3,
        batch_files: 4,
        batch_blocks: 64,
        whole_copies: copies::PLANNED,
        regroup_blocks: 8,
        fresh_keys: 4,
        group_blocks: 16,
        // Splitting changes the plan (see `links::Component::split`): tiny
        // limits must plan what the plan in one piece does.
        component_blocks: u64::MAX,
    };

    /// No limits: the plan in one piece, every copy planned (tests: what
    /// the batched plan must equal range for range).
    pub const ONE_PIECE: Limits = Limits {
        whole_keys: u64::MAX,
        batch_files: u64::MAX,
        batch_blocks: u64::MAX,
        whole_copies: usize::MAX,
        regroup_blocks: u64::MAX,
        fresh_keys: u64::MAX,
        group_blocks: u64::MAX,
        component_blocks: u64::MAX,
    };

    /// Smaller than the default: a test's limits, under which whatever can
    /// wait in a temporary file (the plan, a `--list`) goes there early, so
    /// that the tests go through that path too.
    pub fn is_tiny(&self) -> bool {
        self.batch_files < Limits::default().batch_files
    }

    /// The limits of a run or report: the default, or [`Limits::TINY`]
    /// when `DEDUPSCAN_TEST_SMALL_BATCHES` is set (tests only; the plan is
    /// the same either way, only memory and time differ).
    /// `DEDUPSCAN_TEST_COMPONENT_BLOCKS` (tests only, can only lower it)
    /// sets the component budget.
    pub fn for_run() -> Limits {
        let mut limits = match std::env::var_os("DEDUPSCAN_TEST_SMALL_BATCHES") {
            Some(_) => Limits::TINY,
            None => Limits::default(),
        };
        let lowered = std::env::var("DEDUPSCAN_TEST_COMPONENT_BLOCKS").ok().and_then(|v| v.parse().ok());
        limits.component_blocks = limits.component_blocks.min(lowered.unwrap_or(COMPONENT_BLOCKS));
        limits
    }
}
