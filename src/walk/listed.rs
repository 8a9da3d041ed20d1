//! The directories the crawl listed ([`Listed`]): each is listed once.

use std::sync::Mutex;

/// Every directory the crawl listed, by `(st_dev, st_ino)`, over all
/// starting paths: a directory is listed once. One met again was moved
/// (renamed into a part of the tree not listed yet) while the crawl ran.
/// Listing it again would find each of its files a second time: a file
/// with one name recorded twice and planned against itself, and — the
/// reason this exists — every name of a hard-linked file counted twice, so
/// a file with one name in the tree and one behind `.nodedup` or outside
/// the starting paths would pass the hard-link rule ([`super::HardLinks`]) and be
/// shared (a user moving a directory of theirs back and forth could do it
/// on purpose). The second meeting is counted `moved_during_crawl`; the
/// files keep the names of the first, which may be gone by the share phase
/// (counted vanished then; the next run records the new names). Inode
/// numbers are kept per device (a btrfs subvolume has its own, so a few
/// sets): 8 bytes a directory and a control byte, up to twice that while a
/// set grows (1,000,000 directories: 53 MB at the peak as `(dev, ino)`
/// pairs, about half now).
#[derive(Default)]
pub(super) struct Listed(Mutex<rustc_hash::FxHashMap<u64, rustc_hash::FxHashSet<u64>>>);

impl Listed {
    /// Whether the directory `id` is met for the first time (and now listed).
    pub(super) fn first(&self, (dev, ino): (u64, u64)) -> bool {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).entry(dev).or_default().insert(ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_listed_once_whatever_its_name() {
        let listed = Listed::default();
        assert!(listed.first((1, 256)));
        assert!(listed.first((2, 256)), "another subvolume's root");
        assert!(!listed.first((1, 256)), "met again, moved");
    }
}
