//! The crawl's one rule about hard links ([`HardLinks`]), applied on the
//! consumer thread, which sees every name the crawl threads find.

use std::collections::HashMap;

use crate::policy::SkipReason;

/// What the crawl saw of one inode with more than one name.
#[derive(Debug, Default)]
struct Names {
    /// Its names met below the starting paths.
    seen: u64,
    /// The largest `st_nlink` any of them showed (a link made during the
    /// crawl raises it: then some name was not seen).
    nlink: u64,
    /// One of those names was left out by the policy (`--exclude`, our
    /// database...).
    left_out: bool,
    /// One name was handed on (to be hashed and recorded).
    handed: bool,
}

/// The inodes with more than one name met by the crawl (memory follows
/// those alone), and the rule they obey: a multiply-linked file may be
/// shared only if the crawl saw all `st_nlink` of its names and left none
/// out. Sharing writes the inode, whichever name it goes by: a name behind
/// a `.nodedup` marker or an `--exclude`, or outside the starting paths
/// altogether, would be shared through the name that was let in. A name
/// in a skipped directory (marked, excluded, a read-only snapshot, another
/// mount) is never listed, so the count covers it. The crawl is parallel:
/// only once it is over is every name counted.
#[derive(Default)]
pub(super) struct HardLinks(HashMap<(u64, u64), Names>);

impl HardLinks {
    /// Count one name of the file `(st_dev, ino)`, which has `nlink` names,
    /// left out for `skip` or not; whether it is the name to hand on (the
    /// first one let in).
    pub(super) fn name(&mut self, file: (u64, u64), nlink: u64, skip: Option<SkipReason>) -> bool {
        let n = self.0.entry(file).or_default();
        n.seen += 1;
        n.nlink = n.nlink.max(nlink);
        n.left_out |= skip.is_some();
        let first = skip.is_none() && !n.handed;
        n.handed |= first;
        first
    }

    /// The files handed on that the rule keeps out of the plan.
    pub(super) fn outside(self) -> Vec<(u64, u64)> {
        let keep_out = |n: &Names| n.handed && (n.left_out || n.seen < n.nlink);
        self.0.into_iter().filter(|(_, n)| keep_out(n)).map(|(k, _)| k).collect()
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
