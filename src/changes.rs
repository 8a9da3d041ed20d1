//! Change detection: which crawled files must be read again.
//!
//! In: each file as the crawl finds it (its `dev` already the volume key),
//! and the index of files the database knows, by `(volume key, inode)`.
//! Out: a [`Sorted`] verdict per file, the counts of the scan, and at the
//! end the known files the crawl did not see ([`Classifier::removed`]).
//!
//! Pure: the two questions only the filesystem can answer (does a recorded
//! name still lead to this inode? may a moved file still be shared?) are
//! asked through a [`Probe`], which the pipeline answers with opens below
//! the starting paths and the tests with a table.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::file::{FileFacts, FileId, FileKey, IdSet, Known};
use crate::policy::SkipReason;

/// Whether a known file can be trusted without reading it.
///
/// Size, mtime and ctime equal: unchanged. A rename changes the ctime too
/// (on XFS and btrfs), so a file found under a *new* path with its size and
/// mtime intact counts as moved, not rewritten. At the same path any ctime
/// change means a rehash: that is how a rewrite with its mtime set back is
/// caught. A wrong belief can only cost a missed match, never data: the
/// kernel compares every byte before sharing.
pub fn unchanged(k: &Known, c: &FileFacts) -> bool {
    k.file.size == c.size && k.file.mtime == c.mtime && (k.file.ctime == c.ctime || k.file.path != c.path)
}

/// What change detection asks of the filesystem.
pub trait Probe {
    /// Whether the recorded name `recorded` still leads to the inode of
    /// `found` (then `found` is another name of a hard-linked inode).
    fn same_inode(&self, recorded: &Path, found: &FileFacts) -> bool;
    /// Whether a file found under a new name may still be shared: `Err`
    /// when it is now marked `user.nodedup` or is gone.
    fn may_move(&self, found: &FileFacts) -> Result<(), SkipReason>;
}

/// The verdict on one crawled file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sorted {
    /// Known, and unchanged at its recorded name: nothing to do.
    Unchanged,
    /// Known and unchanged under a new name: the database takes the new
    /// name (and the ctime the rename moved).
    Moved {
        /// The file's row.
        id: FileId,
        /// The file as found.
        file: FileFacts,
    },
    /// Moved and now protected or gone: left out, and forgotten (the
    /// database prunes it as unseen).
    Left(SkipReason),
    /// New or changed: to be read.
    ToHash {
        /// The file as found (under its recorded name if it is another name
        /// of a known hard-linked inode).
        file: FileFacts,
        /// Its row, when it is known.
        id: Option<FileId>,
    },
}

/// The counts of the files sorted so far.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ChangeCounts {
    /// Files considered (every verdict but [`Sorted::Left`]).
    pub files: u64,
    /// Sum of their sizes.
    pub logical_bytes: u64,
    /// Known files unchanged at their recorded name.
    pub unchanged: u64,
    /// Known files unchanged under a new name.
    pub renamed: u64,
    /// Moved files found marked `user.nodedup`.
    pub nodedup: u64,
    /// Files to read (the scan's total, once the crawl has ended).
    pub queued_files: u64,
    /// Sum of their sizes.
    pub queued_bytes: u64,
}

/// An error of the [`Index`] (the database's, boxed: `changes` sits below
/// `db`).
pub type IndexError = Box<dyn std::error::Error + Send + Sync>;

/// The files the database knows, asked one at a time: the crawl never
/// holds a whole-volume index in memory (issue 14: memory flat in the
/// number of files). The database answers with an indexed query per file,
/// the tests with a map.
pub trait Index {
    /// The known file with this `(volume key, inode)`, if any.
    fn get(&self, key: FileKey) -> Result<Option<Known>, IndexError>;
    /// Every file known before this run (rows written by the run itself are
    /// left out) that is `wanted` by its id, streamed: `f` gets its id and
    /// recorded path. The path is made only for those wanted: after a
    /// crawl that saw every file, none.
    fn each_known(&self, wanted: &dyn Fn(FileId) -> bool, f: &mut dyn FnMut(FileId, &Path)) -> Result<(), IndexError>;
    /// The caller may now wait (for the hashing or the writer): let go of
    /// whatever the lookups hold between them (the database's read
    /// transaction, which would keep the writer's checkpoints from the WAL
    /// while it waits).
    fn release(&self) {}
}

impl Index for HashMap<FileKey, Known> {
    fn get(&self, key: FileKey) -> Result<Option<Known>, IndexError> {
        Ok(HashMap::get(self, &key).cloned())
    }
    fn each_known(&self, wanted: &dyn Fn(FileId) -> bool, f: &mut dyn FnMut(FileId, &Path)) -> Result<(), IndexError> {
        self.values().filter(|k| wanted(k.id)).for_each(|k| f(k.id, &k.file.path));
        Ok(())
    }
}

impl<T: Index + ?Sized> Index for &T {
    fn get(&self, key: FileKey) -> Result<Option<Known>, IndexError> {
        (**self).get(key)
    }
    fn each_known(&self, wanted: &dyn Fn(FileId) -> bool, f: &mut dyn FnMut(FileId, &Path)) -> Result<(), IndexError> {
        (**self).each_known(wanted, f)
    }
    fn release(&self) {
        (**self).release()
    }
}

/// Change detection, one file at a time as the crawl finds it. Owns its
/// index (the crawl thread takes it along; the removal pass after the crawl
/// uses it too).
pub struct Classifier<I: Index> {
    index: I,
    /// `false` (`--rehash`): every file is read again.
    incremental: bool,
    /// Known files seen by this crawl, by row id (a bitset).
    seen: IdSet,
    counts: ChangeCounts,
    /// The first error the index met; the files it hit were taken as new.
    error: Option<IndexError>,
}

impl<I: Index> Classifier<I> {
    /// Sort files against `index` (the database's known files). With
    /// `incremental` false every file is to be read.
    pub fn new(index: I, incremental: bool) -> Self {
        Classifier { index, incremental, seen: IdSet::new(), counts: ChangeCounts::default(), error: None }
    }

    /// The caller may now wait: see [`Index::release`].
    pub fn release(&self) {
        self.index.release();
    }

    /// Sort one crawled file `c` (its `dev` is the volume key).
    pub fn sort(&mut self, mut c: FileFacts, probe: &dyn Probe) -> Sorted {
        let known = match self.index.get(c.key) {
            Ok(k) => k,
            Err(e) => {
                self.error.get_or_insert(e);
                None
            }
        };
        if let Some(k) = &known {
            self.seen.insert(k.id);
            if k.file.path != c.path && probe.same_inode(&k.file.path, &c) {
                // A hard link: the crawl met the inode under another of its
                // names first (the parallel crawl's order varies). Nothing
                // moved; keep the recorded name.
                c.path = k.file.path.clone();
            }
        }
        let sorted = match &known {
            Some(k) if self.incremental && unchanged(k, &c) => {
                if k.file.path == c.path {
                    Sorted::Unchanged
                } else if let Err(r) = probe.may_move(&c) {
                    // Moved and marked nodedup (or gone): forgotten
                    // (pruned as unseen).
                    self.seen.remove(k.id);
                    self.counts.nodedup += u64::from(r == SkipReason::Nodedup);
                    return Sorted::Left(r);
                } else {
                    Sorted::Moved { id: k.id, file: c.clone() }
                }
            }
            _ => Sorted::ToHash { file: c.clone(), id: known.map(|k| k.id) },
        };
        let n = &mut self.counts;
        n.files += 1;
        n.logical_bytes += c.size;
        match sorted {
            Sorted::Unchanged => n.unchanged += 1,
            Sorted::Moved { .. } => n.renamed += 1,
            _ => {
                n.queued_files += 1;
                n.queued_bytes += c.size;
            }
        }
        sorted
    }

    /// The counts so far.
    pub fn counts(&self) -> &ChangeCounts {
        &self.counts
    }

    /// Known files under `roots` that the crawl did not see: gone, or no
    /// longer eligible. Only meaningful after a complete crawl; streamed
    /// from the index to `f`. Fails if the index failed during the crawl
    /// (then nothing may be pruned).
    pub fn removed(&mut self, roots: &[PathBuf], f: &mut dyn FnMut(FileId)) -> Result<(), IndexError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let seen = &self.seen;
        self.index.each_known(&|id| !seen.contains(id), &mut |id, path| {
            if roots.iter().any(|root| path.starts_with(root)) {
                f(id)
            }
        })
    }

    /// The known files seen by the crawl and the counts; an error if the
    /// index failed.
    pub fn finish(self) -> Result<(IdSet, ChangeCounts), IndexError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok((self.seen, self.counts)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOL: u64 = 5;

    fn known(id: i64, path: &str, size: u64, mtime: i32, ctime: i32) -> Known {
        let key = FileKey { volume: VOL, ino: 0 }; // set by `index`
        Known { id: FileId(id), file: FileFacts { path: PathBuf::from(path), key, size, mtime, ctime }, hashed_run: 1 }
    }

    fn found(ino: u64, path: &str, size: u64, mtime: i32, ctime: i32) -> FileFacts {
        FileFacts { path: PathBuf::from(path), key: FileKey { volume: VOL, ino }, size, mtime, ctime }
    }

    /// The filesystem as the tests see it: which recorded names still lead
    /// to which inode, and which files are now marked nodedup.
    #[derive(Default)]
    struct Table {
        links: Vec<(&'static str, u64)>,
        nodedup: Vec<&'static str>,
    }

    impl Probe for Table {
        fn same_inode(&self, recorded: &Path, c: &FileFacts) -> bool {
            self.links.iter().any(|&(p, ino)| Path::new(p) == recorded && ino == c.key.ino)
        }
        fn may_move(&self, c: &FileFacts) -> Result<(), SkipReason> {
            match self.nodedup.iter().any(|p| Path::new(p) == c.path) {
                true => Err(SkipReason::Nodedup),
                false => Ok(()),
            }
        }
    }

    fn index(files: &[Known], inos: &[u64]) -> HashMap<FileKey, Known> {
        let key = |ino| FileKey { volume: VOL, ino };
        files
            .iter()
            .zip(inos)
            .map(|(k, &ino)| (key(ino), Known { file: FileFacts { key: key(ino), ..k.file.clone() }, ..k.clone() }))
            .collect()
    }

    fn removed(cls: &mut Classifier<&HashMap<FileKey, Known>>, root: &str) -> Vec<FileId> {
        let mut out = Vec::new();
        cls.removed(&[PathBuf::from(root)], &mut |id| out.push(id)).unwrap();
        out
    }

    #[derive(Debug, PartialEq)]
    enum Want {
        Unchanged,
        Moved,
        Left,
        Hash(Option<i64>, &'static str),
    }

    fn want(s: &Sorted) -> Want {
        match s {
            Sorted::Unchanged => Want::Unchanged,
            Sorted::Moved { .. } => Want::Moved,
            Sorted::Left(_) => Want::Left,
            Sorted::ToHash { file, id } => {
                Want::Hash(id.map(|i| i.0), if file.path == Path::new("/v/a") { "/v/a" } else { "other" })
            }
        }
    }

    #[test]
    fn one_known_file_against_what_the_crawl_finds() {
        let k = known(1, "/v/a", 100, 7, 8);
        // (case, found, incremental, verdict, (unchanged, renamed, queued))
        let cases = [
            ("unchanged", found(10, "/v/a", 100, 7, 8), true, Want::Unchanged, (1, 0, 0)),
            ("mtime changed", found(10, "/v/a", 100, 9, 8), true, Want::Hash(Some(1), "/v/a"), (0, 0, 1)),
            ("ctime changed", found(10, "/v/a", 100, 7, 9), true, Want::Hash(Some(1), "/v/a"), (0, 0, 1)),
            ("size changed", found(10, "/v/a", 101, 7, 8), true, Want::Hash(Some(1), "/v/a"), (0, 0, 1)),
            ("moved", found(10, "/v/b", 100, 7, 9), true, Want::Moved, (0, 1, 0)),
            ("moved and rewritten", found(10, "/v/b", 100, 6, 9), true, Want::Hash(Some(1), "other"), (0, 0, 1)),
            ("new inode", found(11, "/v/a", 100, 7, 8), true, Want::Hash(None, "/v/a"), (0, 0, 1)),
            ("--rehash", found(10, "/v/a", 100, 7, 8), false, Want::Hash(Some(1), "/v/a"), (0, 0, 1)),
        ];
        for (case, c, incremental, verdict, (unchanged, renamed, queued)) in cases {
            let idx = index(std::slice::from_ref(&k), &[10]);
            let mut cls = Classifier::new(&idx, incremental);
            assert_eq!(want(&cls.sort(c, &Table::default())), verdict, "{case}");
            let n = cls.counts();
            assert_eq!((n.files, n.unchanged, n.renamed, n.queued_files), (1, unchanged, renamed, queued), "{case}");
            let gone = removed(&mut cls, "/v");
            let new_inode = case == "new inode";
            assert_eq!(gone, if new_inode { vec![FileId(1)] } else { vec![] }, "{case}");
        }
    }

    #[test]
    fn a_hard_link_is_not_renamed_new_or_vanished() {
        // One inode, two names; the database knows it as /v/a. The crawl
        // meets it as /v/link (its ctime moved when the link was made).
        let idx = index(&[known(1, "/v/a", 100, 7, 8)], &[10]);
        let probe = Table { links: vec![("/v/a", 10)], ..Default::default() };
        let mut cls = Classifier::new(&idx, true);
        assert_eq!(cls.sort(found(10, "/v/link", 100, 7, 8), &probe), Sorted::Unchanged);
        let n = cls.counts().clone();
        assert_eq!((n.files, n.unchanged, n.renamed, n.queued_files), (1, 1, 0, 0));
        assert!(removed(&mut cls, "/v").is_empty());
        // Changed, it is read under its recorded name, as the known row.
        let mut cls = Classifier::new(&idx, true);
        assert_eq!(want(&cls.sort(found(10, "/v/link", 200, 7, 9), &probe)), Want::Hash(Some(1), "/v/a"));
        assert!(removed(&mut cls, "/v").is_empty());
    }

    #[test]
    fn a_moved_file_marked_nodedup_is_left_out_and_forgotten() {
        let idx = index(&[known(1, "/v/a", 100, 7, 8), known(2, "/w/c", 5, 1, 1)], &[10, 20]);
        let probe = Table { nodedup: vec!["/v/b"], ..Default::default() };
        let mut cls = Classifier::new(&idx, true);
        assert_eq!(cls.sort(found(10, "/v/b", 100, 7, 9), &probe), Sorted::Left(SkipReason::Nodedup));
        let n = cls.counts();
        assert_eq!((n.files, n.nodedup, n.renamed), (0, 1, 0));
        // Pruned as unseen; a known file outside the scanned roots is not.
        assert_eq!(removed(&mut cls, "/v"), vec![FileId(1)]);
        let (seen, _) = cls.finish().unwrap();
        assert!(seen.is_empty());
    }
}
