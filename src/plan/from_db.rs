//! The plan over what the database knows: stream the block maps out of
//! [`Db`], group them ([`super::group`], pure), plan ([`super::plan`]).

use std::collections::HashSet;

use super::group::{self, MapPass, SliceGrouper};
use super::{plan, Plan, PlanFile, PlanOptions};
use crate::db::Db;
use crate::file::{FileId, IdSet};

/// A plan built from the database.
#[derive(Debug, Default)]
pub struct Planned {
    /// The ranges to share.
    pub plan: Plan,
    /// The whole-file duplicate groups it was built from (each sorted by
    /// id, at least two files).
    pub whole_groups: Vec<Vec<FileId>>,
}

/// Build the plan over the `allowed` files: whole-file groups, then groups
/// of equal blocks (see [`super::group`] for how, and its memory bound).
/// With `fresh`, only groups holding a fresh file are planned (incremental
/// runs), and only the fresh files' fingerprints are grouped.
///
/// Nothing here depends on the order of rows or on file ids: the planner
/// orders everything by content (see [`plan`]).
pub fn from_db(
    db: &Db,
    allowed: &IdSet,
    fresh: Option<&HashSet<FileId>>,
    opts: PlanOptions,
) -> rusqlite::Result<Planned> {
    // One read transaction for every query below.
    let _snapshot = db.snapshot()?;
    let mut pass = MapPass::default();
    db.for_each_map(
        |id| allowed.contains(id),
        |id, size, map| pass.add(id, size, map, fresh.is_some_and(|f| f.contains(&id))),
    )?;
    let mut whole = group::group_whole_files(std::mem::take(&mut pass.whole_keys));
    let covered = group::covered(&whole);
    let keys = fresh.map(|_| &pass.fresh_fps);
    let slices = group::slices(pass.data_blocks, keys.is_some());
    let mut blocks = Vec::new();
    for slice in 0..slices {
        let mut g = SliceGrouper::new(slice, slices, keys);
        db.for_each_map(|id| allowed.contains(id) && !covered.contains(&id), |id, _, map| g.add(id, map))?;
        g.finish(&mut blocks);
    }
    if let Some(fresh) = fresh {
        group::keep_fresh(&mut whole, &mut blocks, fresh);
    }
    let files: Vec<PlanFile> = db
        .map_rows(group::involved(&whole, &blocks))?
        .into_iter()
        .map(|r| PlanFile { id: r.id, ino: r.ino, size: r.size, blocks: r.map })
        .collect();
    let opts = PlanOptions { exact_groups: true, ..opts };
    Ok(Planned { plan: plan(&files, &whole, &blocks, opts), whole_groups: whole })
}
