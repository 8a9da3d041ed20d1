//! Whole-file groups of many copies: planned with two of them, the others
//! take the second one's ranges.
//!
//! The planner ranks copies of one content held ones first
//! (`PlanFile::held`: they keep extents for other files), then by inode
//! number (then id), and the first of them wins every class they are in,
//! so every other copy is a destination of exactly the same sources at the
//! same offsets: copies beyond the second change nothing the planner
//! decides (not the classes, not which blocks are unique, not what stays
//! pinned). Planning them all
//! cost about 16 bytes of memory per block per copy: 400 `cp --reflink`
//! clones of a 1 GiB file, which cost their owner no disk space, made a
//! full run or `report` take 1.65 GB (ten thousand would take 40 GB). Here
//! the planner sees the first two copies (and the one the block groups
//! name), and every copy but the first follows in plans of their own, a
//! bounded number of copies each: the same ranges as before, in other
//! batches. The first copy follows too where it is a destination
//! ([`Follow::first`]): its clones share its extent, freed only when the
//! share phase sees every holder in one plan.

use rustc_hash::FxHashMap;

use super::{Plan, Range};
use crate::db::maps::CopyKey;
use crate::db::Db;
use crate::file::FileId;

/// Groups of at most this many copies are planned whole (the least a
/// group is cut down to: its first two copies and the one the block groups
/// name).
pub(super) const PLANNED: usize = 3;

/// Most ranges in one plan of followers (one copy's ranges are never split).
pub(super) const FOLLOW_RANGES: usize = 1 << 16;

/// Most copies in one plan of followers (the share phase holds the facts of
/// one plan's files at a time): a batch's files, [`super::limits::BATCH_FILES`].
#[cfg(test)]
const FOLLOW_FILES: usize = super::limits::BATCH_FILES as usize;

/// The copies of a whole-file group that follow its first: all of them
/// but the first, whether the planner saw them or not.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Followers {
    /// The first copy in the planner's order (its ranges, where it has
    /// any, go with the followers: see [`with_templates`]).
    first: FileId,
    /// The copy whose ranges they take (the second in the planner's order).
    template: FileId,
    /// The copies, each with the same map as the first: the template
    /// first, then the one the block groups name if it is another copy,
    /// then those the planner never saw.
    copies: Vec<FileId>,
    /// How many of `copies` the planner saw (one or two, at the front).
    planned: usize,
}

/// Cut whole-file group `g` (ids sorted, so `g[0]` is the copy the block
/// groups name) down to what the planner needs: its first two copies in
/// the planner's order and `g[0]`. Every copy but the first becomes one of
/// the [`Followers`] (dropped if its map differs from the first copy's: a
/// collision of map hashes, which the planner would not join either; `g[0]`
/// then stays as it was planned). `None` leaves `g` as it is: at most
/// `limit` copies (never fewer than [`PLANNED`]), or its second copy's map
/// differs.
///
/// The copies the planner saw follow too (their ranges move out of their
/// batch): so the first plan of followers holds the whole group from the
/// first copy, as a batch of all copies did, and the share phase may still
/// hand the source's role to a copy a read-only snapshot keeps (see
/// `dedupe::swap`), which it does only for a source not yet shared.
///
/// `held` says which copies the planner holds: it takes them first, so
/// they come first here too. Ranked by inode alone, a copy an earlier run
/// shared from (a backup's file, unchanged for days) was the planner's
/// source but the followers' template: it has no ranges, and the copies
/// that followed it were never shared.
pub(super) fn reduce(
    db: &Db,
    g: &mut Vec<FileId>,
    limit: usize,
    held: impl Fn(FileId) -> bool,
) -> rusqlite::Result<Option<Followers>> {
    if g.len() <= limit.max(PLANNED) {
        return Ok(None);
    }
    let mut keys = db.copy_keys(g)?;
    if keys.len() < 2 {
        return Ok(None);
    }
    keys.sort_unstable_by_key(|k| (!held(k.id), k.ino, k.id));
    let mut same = SameMap::new(db, keys[0]);
    if !same.check(&keys[1])? {
        return Ok(None);
    }
    let (first, template, named) = (keys[0].id, keys[1].id, g[0]);
    let mut copies = Vec::with_capacity(keys.len() - 1);
    copies.push(template);
    let mut rest = Vec::with_capacity(keys.len() - 2);
    for k in &keys[2..] {
        if !same.check(k)? {
            continue;
        }
        if k.id == named {
            copies.push(named);
        } else {
            rest.push(k.id);
        }
    }
    let planned = copies.len();
    copies.append(&mut rest);
    g.retain(|id| [first, template, named].contains(id));
    Ok(Some(Followers { first, template, copies, planned }))
}

/// Whether a copy's map is the first copy's: by the row holding it, else
/// byte for byte (once per holder).
struct SameMap<'d> {
    db: &'d Db,
    first: CopyKey,
    map: Option<Vec<u8>>,
    known: FxHashMap<i64, bool>,
}

impl<'d> SameMap<'d> {
    fn new(db: &'d Db, first: CopyKey) -> SameMap<'d> {
        SameMap { db, first, map: None, known: FxHashMap::default() }
    }

    fn check(&mut self, k: &CopyKey) -> rusqlite::Result<bool> {
        if k.holder == self.first.holder {
            return Ok(true);
        }
        if let Some(&same) = self.known.get(&k.holder) {
            return Ok(same);
        }
        if self.map.is_none() {
            self.map = Some(self.db.encoded_map(self.first.id)?.unwrap_or_default());
        }
        let same = self.db.encoded_map(k.id)? == self.map;
        self.known.insert(k.holder, same);
        Ok(same)
    }
}

impl Followers {
    /// The copies the planner saw besides the first: their ranges leave
    /// the batch's plan (they come back as followers).
    pub(super) fn planned(&self) -> &[FileId] {
        &self.copies[..self.planned]
    }
}

/// A group of [`Followers`] with the ranges [`follow`] plans for it.
#[derive(Debug)]
pub(super) struct Follow {
    followers: Followers,
    /// The template's ranges: each copy takes them as its own.
    template: Vec<Range>,
    /// The first copy's own ranges, where it is a destination (the
    /// content's source lies outside the group: a disk image holding the
    /// file). They leave the batch's plan and go with the copies, so that
    /// the share phase sees every copy in one plan: reflinked clones of
    /// one file share one extent, and shared into in different plans,
    /// each plan found the others holding that extent outside it and left
    /// them all pending (btrfs: a file, three `cp --reflink` clones and a
    /// disk image holding it freed nothing).
    first: Vec<Range>,
}

impl Follow {
    /// The first copies whose ranges move into the plans of followers.
    pub(super) fn moved_first(&self) -> Option<FileId> {
        (!self.first.is_empty()).then_some(self.followers.first)
    }
}

/// Each group of `followers` with its template's ranges and its first
/// copy's, taken from `plan` (the plan of their batch) in one pass: what
/// [`follow`] needs. The first copy's are left where `keep_first` says
/// (a split component's hub, planned in an earlier part).
pub(super) fn with_templates(
    plan: &Plan,
    followers: Vec<Followers>,
    keep_first: impl Fn(FileId) -> bool,
) -> Vec<Follow> {
    let mut by_dest: FxHashMap<FileId, Vec<Range>> = FxHashMap::default();
    for f in &followers {
        by_dest.insert(f.template, Vec::new());
        if !keep_first(f.first) {
            by_dest.insert(f.first, Vec::new());
        }
    }
    for r in &plan.ranges {
        if let Some(t) = by_dest.get_mut(&r.dest) {
            t.push(*r);
        }
    }
    followers
        .into_iter()
        .map(|f| {
            let template = by_dest.remove(&f.template).unwrap_or_default();
            let first = by_dest.remove(&f.first).unwrap_or_default();
            Follow { followers: f, template, first }
        })
        .collect()
}

/// The plans of a batch's followers, each group with its template's ranges
/// ([`with_templates`]): each copy takes them as its own. Groups
/// are packed together into plans of at most `max_ranges` ranges and
/// `max_files` copies ([`FOLLOW_RANGES`] and a batch's files by default; a
/// batch of 3,000 groups of five small copies as 3,000 plans took the share
/// phase three times as long); a group goes whole into
/// one plan when it fits in one (so the share phase sees it whole from its
/// first copy), a copy is never split. Each plan is ordered as the planner
/// orders a plan and handed to `emit` as soon as it is full.
pub(super) fn follow<E>(
    groups: &[Follow],
    (max_ranges, max_files): (usize, usize),
    mut emit: impl FnMut(Plan) -> Result<(), E>,
) -> Result<(), E> {
    let mut cur: Vec<Range> = Vec::new();
    let mut copies = 0usize;
    let mut flush = |cur: &mut Vec<Range>, copies: &mut usize| -> Result<(), E> {
        *copies = 0;
        if cur.is_empty() {
            return Ok(());
        }
        let mut ranges = std::mem::take(cur);
        ranges.sort_unstable_by_key(|r| (r.src, r.src_off, r.len, r.dest, r.dest_off));
        emit(Plan { ranges })
    };
    let full = |cur: &[Range], copies: usize, ranges: usize, files: usize| {
        copies > 0 && (cur.len() + ranges > max_ranges || copies + files > max_files)
    };
    for g in groups.iter().filter(|g| !g.template.is_empty() || !g.first.is_empty()) {
        let (f, template) = (&g.followers, &g.template);
        let group_ranges = g.first.len() + f.copies.len() * template.len();
        if full(&cur, copies, group_ranges, f.copies.len() + usize::from(!g.first.is_empty())) {
            flush(&mut cur, &mut copies)?;
        }
        if !g.first.is_empty() {
            cur.extend(&g.first);
            copies += 1;
        }
        if template.is_empty() {
            continue;
        }
        for &c in &f.copies {
            if full(&cur, copies, template.len(), 1) {
                flush(&mut cur, &mut copies)?;
            }
            cur.extend(template.iter().map(|r| Range { dest: c, ..*r }));
            copies += 1;
        }
    }
    flush(&mut cur, &mut copies)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(src: i64, src_off: u64, len: u64, dest: i64, dest_off: u64) -> Range {
        Range { src: FileId(src), src_off, len, dest: FileId(dest), dest_off }
    }

    fn plans(groups: &[Follow]) -> Vec<Plan> {
        let mut out = Vec::new();
        follow(groups, (FOLLOW_RANGES, FOLLOW_FILES), |p| {
            out.push(p);
            Ok::<(), ()>(())
        })
        .unwrap();
        out
    }

    fn fl(followers: Followers, template: Vec<Range>) -> Follow {
        Follow { followers, template, first: Vec::new() }
    }

    fn group(template: i64, copies: std::ops::Range<i64>) -> Followers {
        Followers { first: FileId(1), template: FileId(template), copies: copies.map(FileId).collect(), planned: 1 }
    }

    #[test]
    fn a_first_copy_shared_into_goes_with_its_followers() {
        // Image 9 is the source of the group's content: the first copy 1
        // is a destination like the template 2 and the copies 3 and 4.
        let plan = Plan { ranges: vec![r(9, 4096, 8192, 1, 0), r(9, 4096, 8192, 2, 0), r(5, 0, 4096, 6, 0)] };
        let g = || Followers {
            first: FileId(1),
            template: FileId(2),
            copies: vec![FileId(2), FileId(3), FileId(4)],
            planned: 1,
        };
        let groups = with_templates(&plan, vec![g()], |_| false);
        assert_eq!(groups[0].moved_first(), Some(FileId(1)));
        let got = plans(&groups);
        assert_eq!(got.len(), 1, "one plan holds every copy: {got:?}");
        let dests: Vec<i64> = got[0].ranges.iter().map(|x| x.dest.0).collect();
        assert_eq!(dests, vec![1, 2, 3, 4]);
        assert!(got[0].ranges.iter().all(|x| (x.src, x.src_off, x.len) == (FileId(9), 4096, 8192)));
        // A first copy planned in an earlier part stays where it was.
        let kept = with_templates(&plan, vec![g()], |id| id == FileId(1));
        assert_eq!(kept[0].moved_first(), None);
        assert_eq!(plans(&kept)[0].ranges.len(), 3);
        // The first copy as the source: nothing of it moves.
        let own = Plan { ranges: vec![r(1, 0, 8192, 2, 0)] };
        assert_eq!(with_templates(&own, vec![g()], |_| false)[0].moved_first(), None);
    }

    #[test]
    fn followers_take_the_template_ranges_in_bounded_plans() {
        // Source 1 into template 2 (two ranges) and into an image 9.
        let plan = Plan { ranges: vec![r(1, 0, 8192, 2, 0), r(1, 0, 4096, 9, 40960), r(7, 0, 4096, 2, 8192)] };
        let groups =
            with_templates(&plan, vec![group(2, 10..10 + 2 * FOLLOW_FILES as i64), group(3, 20..24)], |_| false);
        assert_eq!(groups[0].template, vec![plan.ranges[0], plan.ranges[2]]);
        assert!(groups[1].template.is_empty());
        let got = plans(&groups);
        // Two ranges a copy: bounded by files (FOLLOW_FILES copies a plan).
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|p| p.ranges.len() == 2 * FOLLOW_FILES));
        let first = &got[0].ranges;
        assert!(first
            .windows(2)
            .all(|w| (w[0].src, w[0].src_off, w[0].len, w[0].dest) <= (w[1].src, w[1].src_off, w[1].len, w[1].dest)));
        assert!(first.contains(&r(1, 0, 8192, 10, 0)) && first.contains(&r(7, 0, 4096, 10, 8192)));
        assert!(!got.iter().flat_map(|p| &p.ranges).any(|x| x.dest == FileId(9) || x.dest == FileId(2)));
        // Many ranges a copy: bounded by ranges, never less than one copy.
        let many: Vec<Range> = (0..5000).map(|k| r(1, k * 4096, 4096, 2, k * 4096)).collect();
        let counts: Vec<usize> = plans(&[fl(group(2, 10..110), many)]).iter().map(|p| p.ranges.len()).collect();
        assert!(counts.iter().all(|&c| c <= FOLLOW_RANGES && c % 5000 == 0), "{counts:?}");
        assert_eq!(counts.iter().sum::<usize>(), 5000 * 100);
        let huge: Vec<Range> = (0..FOLLOW_RANGES as u64 + 1).map(|k| r(1, k * 4096, 4096, 2, k * 4096)).collect();
        assert_eq!(plans(&[fl(group(2, 10..11), huge)])[0].ranges.len(), FOLLOW_RANGES + 1);
        // Small groups share plans; one that does not fit starts the next
        // plan whole; a template with nothing planned makes nothing.
        let one = vec![r(1, 0, 4096, 2, 0)];
        let small: Vec<Follow> = (0..100).map(|k| fl(group(2, k * 10..k * 10 + 4), one.clone())).collect();
        assert_eq!(plans(&small).len(), 1);
        let big = fl(group(2, 50_000..50_000 + FOLLOW_FILES as i64 - 2), one.clone());
        let got = plans(&[small.into_iter().next().unwrap(), fl(group(3, 20..24), Vec::new()), big]);
        assert_eq!(got.iter().map(|p| p.ranges.len()).collect::<Vec<_>>(), vec![4, FOLLOW_FILES - 2]);
    }
}
