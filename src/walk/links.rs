//! The crawl's one rule about hard links ([`HardLinks`]), applied on the
//! consumer thread, which sees every name the crawl threads find.

use rustc_hash::FxHashMap;

use crate::policy::SkipReason;

/// What the crawl saw of one inode with more than one name, packed in one
/// word: a backup target made with `rsync --link-dest` or rsnapshot has
/// every file multiply linked, so this map holds an entry per file there.
/// As a struct keyed by `(dev, ino)` it took 129 MB for 1,000,000 such
/// files; inode numbers per device and one word each take about half.
#[derive(Debug, Default, Clone, Copy)]
struct Names(u64);

impl Names {
    /// Bits of each count (saturating: 2³¹ names of one inode are not met).
    const COUNT: u32 = 31;
    const MAX: u64 = (1 << Self::COUNT) - 1;
    /// One of its names was left out by the policy (`--exclude`, our
    /// database...).
    const LEFT_OUT: u64 = 1 << 62;
    /// One name was handed on (to be hashed and recorded).
    const HANDED: u64 = 1 << 63;

    /// Its names met below the starting paths.
    fn seen(self) -> u64 {
        self.0 & Self::MAX
    }

    /// The largest `st_nlink` any of them showed (a link made during the
    /// crawl raises it: then some name was not seen).
    fn nlink(self) -> u64 {
        (self.0 >> Self::COUNT) & Self::MAX
    }

    fn has(self, flag: u64) -> bool {
        self.0 & flag != 0
    }

    /// One more name, showing `nlink`, left out or not.
    fn met(self, nlink: u64, left_out: bool) -> Names {
        let seen = (self.seen() + 1).min(Self::MAX);
        let nlink = self.nlink().max(nlink.min(Self::MAX));
        let flags = self.0 & (Self::LEFT_OUT | Self::HANDED) | if left_out { Self::LEFT_OUT } else { 0 };
        Names(seen | nlink << Self::COUNT | flags)
    }
}

/// The inodes with more than one name met by the crawl (memory follows
/// those alone), and the rule they obey: a multiply-linked file may be
/// shared only if the crawl saw all `st_nlink` of its names and left none
/// out. Sharing writes the inode, whichever name it goes by: a name behind
/// a `.nodedup` marker or an `--exclude`, or outside the starting paths
/// altogether, would be shared through the name that was let in. A name
/// in a skipped directory (marked, excluded, a read-only snapshot, another
/// mount) is never listed, so the count covers it. The crawl is parallel:
/// only once it is over is every name counted. Keyed by device, then inode
/// number (a btrfs subvolume has a device of its own: a few maps).
#[derive(Default)]
pub(super) struct HardLinks(FxHashMap<u64, FxHashMap<u64, Names>>);

impl HardLinks {
    /// Count one name of the file `(st_dev, ino)`, which has `nlink` names,
    /// left out for `skip` or not; whether it is the name to hand on (the
    /// first one let in).
    pub(super) fn name(&mut self, (dev, ino): (u64, u64), nlink: u64, skip: Option<SkipReason>) -> bool {
        let n = self.0.entry(dev).or_default().entry(ino).or_default();
        let first = skip.is_none() && !n.has(Names::HANDED);
        *n = n.met(nlink, skip.is_some());
        if first {
            n.0 |= Names::HANDED;
        }
        first
    }

    /// The files handed on that the rule keeps out of the plan.
    pub(super) fn outside(self) -> Vec<(u64, u64)> {
        let keep_out = |n: Names| n.has(Names::HANDED) && (n.has(Names::LEFT_OUT) || n.seen() < n.nlink());
        let mut out: Vec<(u64, u64)> = self
            .0
            .into_iter()
            .flat_map(|(dev, inodes)| inodes.into_iter().filter(|(_, n)| keep_out(*n)).map(move |(ino, _)| (dev, ino)))
            .collect();
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What, st_nlink, the names met in order (left out or not), whether the
    /// first one is handed on, whether the file is kept out.
    type Case<'a> = (&'a str, u64, &'a [Option<SkipReason>], bool, bool);

    /// Which inodes stay out, for each way their names can be met.
    #[test]
    fn only_inodes_with_every_name_seen_and_let_in_may_be_shared() {
        let ex = Some(SkipReason::Excluded);
        let cases: &[Case] = &[
            ("both names seen", 2, &[None, None], true, false),
            ("one name outside", 2, &[None], true, true),
            ("the other name excluded", 2, &[None, ex], true, true),
            ("excluded name met first", 2, &[ex, None], false, true),
            ("three of three", 3, &[None, None, None], true, false),
            ("every name excluded", 2, &[ex, ex], false, false),
        ];
        for (i, (what, nlink, names, first_handed, out)) in cases.iter().enumerate() {
            let mut links = HardLinks::default();
            let handed: Vec<bool> = names.iter().map(|skip| links.name((7, i as u64), *nlink, *skip)).collect();
            assert_eq!(handed.iter().filter(|h| **h).count(), usize::from(names.contains(&None)), "{what}");
            assert_eq!(handed[0], *first_handed, "{what}");
            // Never handed: nothing to keep out of the plan.
            assert_eq!(links.outside() == vec![(7, i as u64)], *out, "{what}");
        }
    }

    /// Counts saturate instead of wrapping into the flags.
    #[test]
    fn counts_saturate() {
        let mut n = Names::default();
        for _ in 0..3 {
            n = n.met(u64::MAX, false);
        }
        assert_eq!((n.seen(), n.nlink()), (3, Names::MAX));
        assert!(!n.has(Names::LEFT_OUT) && !n.has(Names::HANDED));
        let n = Names(Names::MAX | Names::MAX << Names::COUNT).met(5, true);
        assert_eq!((n.seen(), n.nlink()), (Names::MAX, Names::MAX));
        assert!(n.has(Names::LEFT_OUT) && !n.has(Names::HANDED));
    }

    /// A link made while the crawl runs raises `st_nlink`: the names seen
    /// no longer cover it.
    #[test]
    fn a_link_made_during_the_crawl_keeps_the_file_out() {
        let mut links = HardLinks::default();
        assert!(links.name((7, 1), 2, None));
        assert!(!links.name((7, 1), 3, None));
        assert_eq!(links.outside(), vec![(7, 1)]);
    }
}
