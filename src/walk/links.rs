//! The crawl's one rule about hard links ([`HardLinks`]), applied on the
//! consumer thread, which sees every name the crawl threads find.

use rustc_hash::FxHashMap;

use crate::policy::SkipReason;

/// What the crawl saw of one inode with more than one name, packed in 32
/// bits: a backup target made with `rsync --link-dest` or rsnapshot has
/// every file multiply linked, so there is one per file there.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Names(u32);

impl Names {
    /// Bits of each count.
    const COUNT: u32 = 15;
    const MAX: u64 = (1 << Self::COUNT) - 1;
    /// One of its names was left out by the policy (`--exclude`, our
    /// database...), or it has more names than [`Self::MAX`] (not counted,
    /// so not vouched for).
    const LEFT_OUT: u32 = 1 << 30;
    /// One name was handed on (to be hashed and recorded).
    const HANDED: u32 = 1 << 31;

    /// Its names met below the starting paths (saturating: more than
    /// [`Self::MAX`] are only met in a file that is left out anyway).
    fn seen(self) -> u64 {
        u64::from(self.0) & Self::MAX
    }

    /// The largest `st_nlink` any of them showed (a link made during the
    /// crawl raises it: then some name was not seen).
    fn nlink(self) -> u64 {
        (u64::from(self.0) >> Self::COUNT) & Self::MAX
    }

    fn has(self, flag: u32) -> bool {
        self.0 & flag != 0
    }

    /// One more name, showing `nlink`, left out or not.
    fn met(self, nlink: u64, left_out: bool) -> Names {
        let seen = (self.seen() + 1).min(Self::MAX);
        let too_many = nlink > Self::MAX;
        let nlink = self.nlink().max(nlink.min(Self::MAX));
        let flags = self.0 & (Self::LEFT_OUT | Self::HANDED) | if left_out || too_many { Self::LEFT_OUT } else { 0 };
        // Both counts fit their 15 bits.
        Names((seen | nlink << Self::COUNT) as u32 | flags)
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
/// only once it is over is every name counted. One [`Inodes`] table per
/// device (a btrfs subvolume has a device of its own) and high half of
/// the inode number (XFS numbers pass 2³² on large volumes): a few.
pub(super) struct HardLinks {
    tables: FxHashMap<(u64, u32), Inodes>,
    /// Inodes in the tables' `recent` maps, all tables together.
    recent: usize,
    /// When they are sorted in: [`RECENT`] (less in tests).
    recent_max: usize,
}

impl Default for HardLinks {
    fn default() -> Self {
        HardLinks { tables: FxHashMap::default(), recent: 0, recent_max: RECENT }
    }
}

impl HardLinks {
    /// Count one name of the file `(st_dev, ino)`, which has `nlink` names,
    /// left out for `skip` or not; whether it is the name to hand on (the
    /// first one let in).
    pub(super) fn name(&mut self, (dev, ino): (u64, u64), nlink: u64, skip: Option<SkipReason>) -> bool {
        let table = self.tables.entry((dev, (ino >> 32) as u32)).or_default();
        let before = table.recent.len();
        let n = table.entry(ino as u32);
        let first = skip.is_none() && !n.has(Names::HANDED);
        *n = n.met(nlink, skip.is_some());
        if first {
            n.0 |= Names::HANDED;
        }
        self.recent += table.recent.len() - before;
        if self.recent >= self.recent_max {
            self.tables.values_mut().for_each(Inodes::merge);
            self.recent = 0;
        }
        first
    }

    /// The files handed on that the rule keeps out of the plan.
    pub(super) fn outside(self) -> Outside {
        let keep_out = |n: Names| n.has(Names::HANDED) && (n.has(Names::LEFT_OUT) || n.seen() < n.nlink());
        let mut tables: Vec<_> = self.tables.into_iter().collect();
        tables.sort_unstable_by_key(|(key, _)| *key);
        let mut out = Outside::default();
        for ((dev, high), mut inodes) in tables {
            inodes.merge();
            let low: Vec<u32> = inodes.sorted.into_iter().filter(|(_, n)| keep_out(*n)).map(|(low, _)| low).collect();
            if !low.is_empty() {
                out.0.push((dev, high, low));
            }
        }
        out
    }
}

/// The files a hard link keeps out of the plan ([`HardLinks::outside`]),
/// 4 bytes each: where the crawl saw one name of each file (one snapshot
/// of an rsnapshot tree), that is every file.
#[derive(Debug, Default)]
pub struct Outside(Vec<(u64, u32, Vec<u32>)>);

impl Outside {
    /// How many.
    pub fn len(&self) -> usize {
        self.0.iter().map(|(_, _, low)| low.len()).sum()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `(st_dev, ino)` of each, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.0
            .iter()
            .flat_map(|(dev, high, low)| low.iter().map(move |low| (*dev, u64::from(*high) << 32 | u64::from(*low))))
    }

    /// The same files with each `st_dev` replaced by `key(st_dev)` (a
    /// volume key).
    pub fn map_devices(mut self, mut key: impl FnMut(u64) -> u64) -> Outside {
        for (dev, _, _) in &mut self.0 {
            *dev = key(*dev);
        }
        self
    }
}

/// The inodes met since the last merge, at most this many in all tables,
/// are kept in hash maps (9 bytes each, 18 at their growth): about 20 MB.
const RECENT: usize = 1 << 20;

/// The inodes of one device whose numbers share their high 32 bits: the
/// low halves sorted, each with its [`Names`] (8 bytes an inode;
/// a hash map of 10 M inodes took 272 MB, and 408 MB while it grew), and
/// the inodes met since those were last sorted in.
#[derive(Default)]
struct Inodes {
    sorted: Vec<(u32, Names)>,
    /// Every [`FENCE`]th low half of `sorted`: a search looks here first
    /// (1/16 of the size, mostly cached), then in one block of `sorted`,
    /// two cache lines. A plain binary search of 10 M inodes met in no
    /// order missed the cache on nearly every step: 30 M names took 14.9 s
    /// (6.4 s now, with each count beside its key; a hash map, 2.4 s).
    fence: Vec<u32>,
    recent: FxHashMap<u32, Names>,
}

/// See [`Inodes::fence`].
const FENCE: usize = 16;

impl Inodes {
    /// The names met of the inode whose number's low half is `low`.
    /// A new one goes to `recent`.
    fn entry(&mut self, low: u32) -> &mut Names {
        match self.find(low) {
            Some(i) => &mut self.sorted[i].1,
            None => self.recent.entry(low).or_default(),
        }
    }

    /// Where `low` is in `sorted`.
    fn find(&self, low: u32) -> Option<usize> {
        let block = self.fence.partition_point(|&first| first <= low).checked_sub(1)?;
        let start = block * FENCE;
        let end = (start + FENCE).min(self.sorted.len());
        self.sorted[start..end].binary_search_by_key(&low, |(low, _)| *low).ok().map(|i| start + i)
    }

    /// Sort the recent inodes in, in place (their map is freed): `sorted`
    /// grows by their number (a large block grows without a copy) and is
    /// merged from the back.
    fn merge(&mut self) {
        let mut add: Vec<(u32, Names)> = std::mem::take(&mut self.recent).into_iter().collect();
        add.sort_unstable_by_key(|(low, _)| *low);
        let old = self.sorted.len();
        self.sorted.reserve_exact(add.len());
        self.sorted.resize(old + add.len(), (0, Names::default()));
        let (mut i, mut k) = (old, old + add.len());
        // A recent inode is never in `sorted`: no ties.
        for new in add.into_iter().rev() {
            while i > 0 && self.sorted[i - 1].0 > new.0 {
                i -= 1;
                k -= 1;
                self.sorted[k] = self.sorted[i];
            }
            k -= 1;
            self.sorted[k] = new;
        }
        self.fence = self.sorted.iter().step_by(FENCE).map(|(low, _)| *low).collect();
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
            assert_eq!(links.outside().iter().collect::<Vec<_>>() == vec![(7, i as u64)], *out, "{what}");
        }
    }

    /// Counts saturate instead of wrapping into the flags; a file with more
    /// names than can be counted is kept out.
    #[test]
    fn counts_saturate() {
        let mut n = Names::default();
        for _ in 0..3 {
            n = n.met(Names::MAX, false);
        }
        assert_eq!((n.seen(), n.nlink()), (3, Names::MAX));
        assert!(!n.has(Names::LEFT_OUT) && !n.has(Names::HANDED));
        let n = Names((Names::MAX | Names::MAX << Names::COUNT) as u32).met(5, true);
        assert_eq!((n.seen(), n.nlink()), (Names::MAX, Names::MAX));
        assert!(n.has(Names::LEFT_OUT) && !n.has(Names::HANDED));
        let n = Names::default().met(Names::MAX + 1, false);
        assert_eq!((n.seen(), n.nlink()), (1, Names::MAX));
        assert!(n.has(Names::LEFT_OUT), "too many names to vouch for");
    }

    /// The sorted tables give what one map of every inode gives, whatever
    /// the order of the names, the devices and high halves, and how often
    /// the recent inodes are sorted in.
    #[test]
    fn sorted_tables_match_one_map() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for recent_max in [1, 3, 64, RECENT] {
            let mut links = HardLinks { recent_max, ..HardLinks::default() };
            // (dev, ino) -> (names met, largest nlink, left out, handed)
            let mut model: FxHashMap<(u64, u64), (u64, u64, bool, bool)> = FxHashMap::default();
            for _ in 0..5_000 {
                let dev = next(2);
                let ino = next(3) << 32 | next(300);
                let nlink = 2 + next(3);
                let skip = (next(5) == 0).then_some(SkipReason::Excluded);
                let m = model.entry((dev, ino)).or_default();
                let first = skip.is_none() && !m.3;
                *m = (m.0 + 1, m.1.max(nlink), m.2 || skip.is_some(), m.3 || first);
                assert_eq!(links.name((dev, ino), nlink, skip), first, "{dev} {ino:#x}, recent_max {recent_max}");
            }
            let mut want: Vec<_> =
                model.iter().filter(|(_, m)| m.3 && (m.2 || m.0 < m.1)).map(|(key, _)| *key).collect();
            want.sort_unstable();
            assert!(
                want.len() > model.len() / 10 && want.len() < model.len() * 9 / 10,
                "{} of {}",
                want.len(),
                model.len()
            );
            let outside = links.outside();
            assert_eq!(outside.iter().collect::<Vec<_>>(), want, "recent_max {recent_max}");
            assert_eq!(outside.len(), want.len());
        }
    }

    /// A link made while the crawl runs raises `st_nlink`: the names seen
    /// no longer cover it.
    #[test]
    fn a_link_made_during_the_crawl_keeps_the_file_out() {
        let mut links = HardLinks::default();
        assert!(links.name((7, 1), 2, None));
        assert!(!links.name((7, 1), 3, None));
        assert_eq!(links.outside().iter().collect::<Vec<_>>(), vec![(7, 1)]);
    }
}
