//! Which copy a whole-file group is shared from. The planner ranks sources
//! by content alone; the share phase, which sees the disk, may hand the
//! source's role to one of its copies (counted in
//! [`super::Outcome::swapped_sources`]):
//! - a copy whose extents a file outside the plan keeps (a read-only
//!   snapshot, [`Executor::pinned_copy`]): sharing into it frees nothing,
//!   so it would be left pending; sharing the source into it frees the
//!   source's extents now;
//! - a copy far less fragmented than the source
//!   ([`Executor::less_fragmented_copy`]): every copy then ends contiguous.
//!
//! Only where it is safe whatever the other workers do: a whole-file group
//! (one source range covering the whole source, every destination whole
//! and still to share) whose source and chosen copy appear in no other
//! range of the plan (`WorkerContext::used_once`). No other worker then
//! shares from or into either meanwhile, and the source, shared whole into
//! the copy, keeps no reference to its old extents.

use std::fs::File;
use std::os::fd::AsFd;

use super::executor::{Dest, Executor, Target};
use crate::plan::Range;
use crate::sys;

impl Executor<'_> {
    /// Share one batch of a group's destinations (`whole`: the whole range
    /// still to share; `partial`: some parts of it; `pinned`: all of it in
    /// extents a file outside the plan keeps, left pending), from the
    /// planned source or from a copy that takes its role.
    pub(super) fn share_batch(
        &mut self,
        src: &File,
        r: &Range,
        group: &[Range],
        (whole, partial, pinned): (&[Dest], &[Dest], &[Dest]),
    ) {
        let copy = match self.pinned_copy(src, r, group, whole, partial, pinned) {
            Some(k) => Some(&pinned[k]),
            None => self.less_fragmented_copy(src, r, group, whole, partial).map(|k| &whole[k]),
        };
        if let Some(copy) = copy {
            // The copy becomes the source and the source one more
            // destination.
            let mut targets = vec![Target { id: r.src, file: src, off: r.src_off }];
            targets.extend(whole.iter().filter(|d| d.id != copy.id).map(|d| d.target(0)));
            self.out.swapped_sources += 1;
            self.submit(&copy.target(0), r.len, &targets);
        } else if !whole.is_empty() {
            let targets: Vec<Target<'_>> = whole.iter().map(|d| d.target(0)).collect();
            self.submit(&Target { id: r.src, file: src, off: r.src_off }, r.len, &targets);
        }
        for d in partial {
            for &(o, l) in &d.parts {
                self.submit(&Target { id: r.src, file: src, off: r.src_off + o }, l, &[d.target(o)]);
            }
        }
    }

    /// Whether `r` covers its whole source and is that source's only range
    /// in the plan.
    fn whole_file_group(&self, r: &Range) -> bool {
        r.src_off == 0 && self.files.get(&r.src).is_some_and(|c| c.size == r.len) && self.ctx.used_once.contains(&r.src)
    }

    /// The copy (an index into `pinned`) to share from instead of the
    /// planned source when a file outside the plan (a read-only snapshot)
    /// keeps all of that copy's extents. Sharing the source's blocks into
    /// it would free nothing, so it is left pending (`drop_pinned`); the
    /// other way round, the source and the other copies share its extent
    /// and theirs are freed now: on copies of which a snapshot held the
    /// one the planner ranked a destination, 68% of the waste was freed
    /// before this. Only where the source shares no extent with any other
    /// file: one a snapshot keeps too frees nothing either way (it stays
    /// as it was), and one it shares with another file of the plan stays
    /// for that file. Among several such copies the least fragmented is
    /// taken; the others stay pending (sharing into them frees nothing
    /// whichever the source). The one taken is no longer pending.
    fn pinned_copy(
        &mut self,
        src: &File,
        r: &Range,
        group: &[Range],
        whole: &[Dest],
        partial: &[Dest],
        pinned: &[Dest],
    ) -> Option<usize> {
        if pinned.is_empty() || !partial.is_empty() || whole.len() + pinned.len() != group.len() {
            return None;
        }
        if !self.whole_file_group(r) {
            return None;
        }
        let whole_copy = |d: &Dest| {
            d.off == 0 && self.ctx.used_once.contains(&d.id) && self.files.get(&d.id).is_some_and(|c| c.size == r.len)
        };
        let (k, best) = pinned
            .iter()
            .enumerate()
            .filter(|(_, d)| whole_copy(d))
            .min_by_key(|(_, d)| d.extents.unwrap_or(usize::MAX))?;
        // One FIEMAP of the source, and only for a group with such a copy.
        let own = sys::fiemap(src.as_fd(), 0, r.len).ok()?;
        if own.is_empty() || own.iter().any(|e| e.is_shared() || e.is_inline()) {
            return None;
        }
        if let Some(p) = self.out.pending.get_mut(&best.id) {
            p.1 = p.1.saturating_sub(r.len);
            if p.1 == 0 {
                self.out.pending.remove(&best.id);
            }
        }
        Some(k)
    }

    /// The copy (an index into `whole`) to share from instead of the
    /// planned source, if the source is far more fragmented than one of
    /// its copies: sharing a contiguous copy from a 20,000-extent file
    /// leaves the copy with 20,000 extents; the other way round, every copy
    /// ends contiguous. "Far more": at least 4 times the extents and 32
    /// more; files under 1 MiB are never considered (one FIEMAP more per
    /// source, on btrfs a back-reference walk per extent), nor a source
    /// that already shares an extent.
    fn less_fragmented_copy(
        &mut self,
        src: &File,
        r: &Range,
        group: &[Range],
        whole: &[Dest],
        partial: &[Dest],
    ) -> Option<usize> {
        const MIN_LEN: u64 = 1 << 20;
        if r.len < MIN_LEN || !partial.is_empty() || whole.len() != group.len() || !self.whole_file_group(r) {
            return None;
        }
        if whole.iter().any(|d| d.off != 0) {
            return None;
        }
        let count = |f: &File| {
            let mut n = 0usize;
            sys::fiemap::fiemap_each(f.as_fd(), 0, r.len, |_| {
                n += 1;
                true
            })
            .map_or(usize::MAX, |()| n)
        };
        let (k, best) = whole
            .iter()
            .enumerate()
            .filter(|(_, d)| self.ctx.used_once.contains(&d.id))
            .map(|(k, d)| (k, d.extents.unwrap_or_else(|| count(&d.file))))
            .min_by_key(|&(_, n)| n)?;
        let src_extents = sys::fiemap(src.as_fd(), 0, r.len).ok()?;
        // A source that already shares an extent (with a file an earlier
        // batch shared it with, e.g. an image holding it while its copies
        // follow in a batch of their own, `plan::copies`) keeps it: handing
        // its role to a copy would leave that sharing stored twice.
        if src_extents.iter().any(|e| e.is_shared()) {
            return None;
        }
        (best != usize::MAX && src_extents.len() >= 4 * best && src_extents.len() >= best + 32).then_some(k)
    }
}
