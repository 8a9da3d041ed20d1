//! Files an earlier run refused as too large (error kind `too_large`),
//! so that this run refuses them again without reading them.
//!
//! A block map is bounded ([`crate::blockmap::MAX_MAP_BYTES`]: about
//! 610 GiB of data in one file with 4 KiB blocks), and whether a file is
//! past the bound shows only once that much of it was read. A thick VM
//! image of a terabyte was read that far and refused by every run, each
//! night, for nothing. The database remembers each refusal (schema v13,
//! `too_large`); the pool asks [`Refused::earlier`] before it opens a file.
//!
//! In: the rows of earlier refusals, and whether to trust them (not under
//! `--rehash`). Out: the verdict per file, and at the end the rows this run
//! did not confirm ([`Refused::stale`]), for the database to drop. Pure: no
//! I/O.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::file::{FileFacts, FileKey, TimeTag};

/// One recorded refusal: the file as it was when refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge {
    /// Volume key and inode.
    pub key: FileKey,
    /// Size in bytes.
    pub size: u64,
    /// Time tag of the modification time.
    pub mtime: TimeTag,
    /// Time tag of the inode change time.
    pub ctime: TimeTag,
    /// Where it was found.
    pub path: PathBuf,
    /// The run that read it and refused it.
    pub run: i64,
}

/// The refusals an earlier run recorded, and which of them this run met.
#[derive(Debug, Default)]
pub struct Refused {
    known: HashMap<FileKey, TooLarge>,
    /// Keys refused again by this run (from a row, or read and refused).
    confirmed: Mutex<HashSet<FileKey>>,
}

impl Refused {
    /// The recorded refusals; none are trusted when `trust` is false
    /// (`--rehash`: every file is read again).
    pub fn new(rows: Vec<TooLarge>, trust: bool) -> Refused {
        let known = if trust { rows.into_iter().map(|r| (r.key, r)).collect() } else { HashMap::new() };
        Refused { known, confirmed: Mutex::default() }
    }

    /// The refusal of `c` if it is the file refused, unchanged since: same
    /// inode, size and both time tags (a rename moves the ctime, so a moved
    /// file is read once more; a file rewritten with its mtime set back is
    /// caught by the ctime). Counts as confirmed.
    pub fn earlier(&self, c: &FileFacts) -> Option<&TooLarge> {
        let r = self.known.get(&c.key)?;
        if (r.size, r.mtime, r.ctime) != (c.size, c.mtime, c.ctime) {
            return None;
        }
        self.confirm(c.key);
        Some(r)
    }

    /// `key` was read and refused by this run (the database records it).
    pub fn confirm(&self, key: FileKey) {
        self.confirmed.lock().unwrap().insert(key);
    }

    /// The recorded refusals below `paths` that this run did not confirm:
    /// the file changed (and was read whole, or refused and recorded
    /// anew), or is gone. Only a complete run may drop them.
    pub fn stale(&self, paths: &[PathBuf]) -> Vec<FileKey> {
        let confirmed = self.confirmed.lock().unwrap();
        let below = |p: &Path| paths.iter().any(|root| p.starts_with(root));
        let mut out: Vec<FileKey> =
            self.known.values().filter(|r| !confirmed.contains(&r.key) && below(&r.path)).map(|r| r.key).collect();
        out.sort_by_key(|k| (k.volume, k.ino));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ino: u64, path: &str) -> TooLarge {
        TooLarge { key: FileKey { volume: 5, ino }, size: 100, mtime: 1, ctime: 2, path: path.into(), run: 3 }
    }

    fn facts(r: &TooLarge) -> FileFacts {
        FileFacts { path: r.path.clone(), key: r.key, size: r.size, mtime: r.mtime, ctime: r.ctime }
    }

    #[test]
    fn only_the_file_as_refused_is_refused_again() {
        let a = row(1, "/v/a");
        let refused = Refused::new(vec![a.clone()], true);
        assert_eq!(refused.earlier(&facts(&a)).map(|r| r.run), Some(3));
        for changed in [
            FileFacts { size: 101, ..facts(&a) },
            FileFacts { mtime: 9, ..facts(&a) },
            FileFacts { ctime: 9, ..facts(&a) },
            FileFacts { key: FileKey { volume: 6, ino: 1 }, ..facts(&a) },
        ] {
            assert!(refused.earlier(&changed).is_none(), "{changed:?}");
        }
        assert!(Refused::new(vec![a.clone()], false).earlier(&facts(&a)).is_none(), "--rehash reads it");
    }

    #[test]
    fn rows_below_the_paths_not_met_again_are_stale() {
        let (a, b, c, d) = (row(1, "/v/a"), row(2, "/v/b"), row(3, "/w/c"), row(4, "/v/d"));
        let refused = Refused::new(vec![a.clone(), b.clone(), c.clone(), d.clone()], true);
        assert!(refused.earlier(&facts(&a)).is_some());
        refused.confirm(d.key);
        // b was not met (gone or changed); c lies outside the paths scanned.
        assert_eq!(refused.stale(&["/v".into()]), vec![b.key]);
        assert_eq!(refused.stale(&["/v".into(), "/w".into()]), vec![b.key, c.key]);
    }
}
