//! What may be shared, and why something is left alone.
//!
//! One place decides: exclude globs, the `user.nodedup` extended attribute
//! on a file or any directory above it, a `.nodedup` marker file in a
//! directory, inode flags that make sharing impossible or unwise, swap files,
//! and the tool's own database. Every refusal has a [`SkipReason`] that is
//! counted in the report.

use std::collections::HashSet;
use std::ffi::OsString;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use globset::{Glob, GlobSet, GlobSetBuilder};

use crate::sys::{self, beneath, stat, InodeFlags};

/// Extended attribute that keeps a file, or everything below a directory,
/// out of deduplication.
pub const NODEDUP_XATTR: &str = "user.nodedup";
/// Marker file that keeps everything below its directory out.
pub const NODEDUP_MARKER: &str = ".nodedup";
/// [`NODEDUP_MARKER`] for `fstatat`.
const MARKER_C: &std::ffi::CStr = c".nodedup";

/// Why a path was not considered. Serialised in snake_case as the keys of
/// the report's `skipped` object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// Named pipe: never opened (opening could block or consume data).
    Fifo,
    /// Unix socket: never opened.
    Socket,
    /// Block or character device node.
    Device,
    /// Symbolic links are never followed.
    Symlink,
    /// Zero-length file: nothing to share.
    Empty,
    /// Another mount below the starting path: not crossed.
    MountPoint,
    /// A second name of an inode already seen: counted once.
    Hardlink,
    /// A file with more than one name, not all of them seen by this run's
    /// crawl (one outside the starting paths, or in a directory left out)
    /// or one left out (`--exclude`): hashed and counted as scanned, but
    /// kept out of the plan, as source and as destination. Sharing writes
    /// the inode under every name.
    HardlinkOutside,
    /// Matched an `--exclude` glob.
    Excluded,
    /// `user.nodedup` xattr or `.nodedup` marker.
    Nodedup,
    /// `chattr +i`: the kernel refuses to share it.
    Immutable,
    /// `chattr +a`: the kernel refuses to share it.
    AppendOnly,
    /// btrfs `chattr +C` (NOCOW): left alone as unwise, not impossible
    /// (btrfs shares between two such files): a shared extent is copied on
    /// its next write, the very rewriting NOCOW was set to avoid (VM
    /// images, databases), and the file would fragment as it is written.
    /// `--include-nocow` shares them (images no longer written).
    Nocow,
    /// An active swap file.
    Swapfile,
    /// XFS realtime file.
    Realtime,
    /// DAX file.
    Dax,
    /// Inside a read-only btrfs snapshot (see `--include-readonly-snapshots`).
    ReadonlySnapshot,
    /// btrfs keeps small files inline in metadata: nothing to share.
    Inline,
    /// The tool's own database, WAL or lock file.
    OwnDatabase,
    /// Changed while it was read; retried next run.
    ChangedDuringScan,
    /// Gone between the listing and an open (to hash it, or in the share
    /// phase or the zero pass, to share it), or a directory on its path
    /// was replaced by a symlink or a mount meanwhile.
    Vanished,
    /// Another process holds a lease on it (a file server's exclusive
    /// oplock or write delegation): opened with `O_NONBLOCK`, it answered
    /// `EAGAIN` instead of holding the run up to `lease-break-time` (45 s
    /// by default) per file. Not read (when hashing) or not shared (in the
    /// share phase: the ranges planned into it are left pending,
    /// `leased`); tried again next run.
    Leased,
    /// A directory met a second time, under another name: it was moved
    /// while the crawl ran, and its files were already found once (see
    /// `walk::listed::Listed`).
    MovedDuringCrawl,
    /// A directory whose path is longer than `walk::MAX_PATH_BYTES` (64
    /// KiB): left out with everything below it.
    TooDeep,
}

impl SkipReason {
    /// Why a file the crawl listed, or the scan recorded, could not be
    /// opened again, when that is no failure but the life of a busy tree:
    /// gone, or a directory on its path replaced by a symlink or a mount
    /// (`vanished`), or held by another process's lease (`leased`).
    /// `None`: a failure, for the caller to count.
    pub fn of_reopen(e: &std::io::Error) -> Option<SkipReason> {
        match e.raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::EXDEV) => Some(SkipReason::Vanished),
            Some(libc::EAGAIN) => Some(SkipReason::Leased),
            _ => None,
        }
    }

    /// Whether the reason is a protection (a marker, flag or rule that keeps
    /// the file out for good), rather than a passing state of the file.
    pub fn is_policy(self) -> bool {
        matches!(
            self,
            SkipReason::Nodedup
                | SkipReason::Excluded
                | SkipReason::Immutable
                | SkipReason::AppendOnly
                | SkipReason::Nocow
                | SkipReason::Swapfile
                | SkipReason::Realtime
                | SkipReason::Dax
                | SkipReason::OwnDatabase
        )
    }

    /// Why a scanned file was not opened again, for a message, when
    /// [`SkipReason::of_reopen`] named it.
    pub fn not_reopened(self) -> &'static str {
        match self {
            SkipReason::Leased => "another process holds a lease on it (a file server's oplock or delegation)",
            _ => "gone since it was scanned",
        }
    }

    /// Name as shown in the report.
    pub fn name(self) -> &'static str {
        match self {
            SkipReason::Fifo => "fifo",
            SkipReason::Socket => "socket",
            SkipReason::Device => "device",
            SkipReason::Symlink => "symlink",
            SkipReason::Empty => "empty",
            SkipReason::MountPoint => "mount_point",
            SkipReason::Hardlink => "hardlink",
            SkipReason::HardlinkOutside => "hardlink_outside",
            SkipReason::Excluded => "excluded",
            SkipReason::Nodedup => "nodedup",
            SkipReason::Immutable => "immutable",
            SkipReason::AppendOnly => "append_only",
            SkipReason::Nocow => "nocow",
            SkipReason::Swapfile => "swapfile",
            SkipReason::Realtime => "realtime",
            SkipReason::Dax => "dax",
            SkipReason::ReadonlySnapshot => "readonly_snapshot",
            SkipReason::Inline => "inline",
            SkipReason::OwnDatabase => "own_database",
            SkipReason::ChangedDuringScan => "changed_during_scan",
            SkipReason::Vanished => "vanished",
            SkipReason::Leased => "leased",
            SkipReason::MovedDuringCrawl => "moved_during_crawl",
            SkipReason::TooDeep => "too_deep",
        }
    }
}

/// The resolved policy of one run.
#[derive(Debug, Default)]
pub struct Policy {
    excludes: GlobSet,
    /// The exclude globs as given, and whether each has matched a path this
    /// run (so that a glob matching nothing can be warned about).
    exclude_globs: Vec<String>,
    exclude_hits: Vec<std::sync::atomic::AtomicBool>,
    /// The database's files, by directory and name; and (dev, inode) of
    /// those that existed when the run opened it (a starting path naming
    /// one, a hard link to one), and of swap files.
    db_files: Option<DbFiles>,
    own_files: HashSet<(u64, u64)>,
    swap_files: HashSet<(u64, u64)>,
    /// Enter read-only btrfs snapshots too.
    pub include_readonly_snapshots: bool,
    /// Hash and share btrfs NOCOW files too (`--include-nocow`).
    pub include_nocow: bool,
}

/// The tool's own database files, as the run found them once it had
/// opened the database (`db::Db::own_files`).
///
/// Known by the identity of their directory and their names, not only by
/// inode: SQLite creates its `-wal`, `-shm` and `-journal` during the run
/// and removes them at the end, so the inodes of the files that existed
/// when the policy was built miss those of a first run and any recreated
/// later (a first run used to hash its own database).
#[derive(Debug, Clone, Default)]
pub struct DbFiles {
    /// `(st_dev, st_ino)` of the directory holding the database.
    pub dir: (u64, u64),
    /// The database's name and every name derived from it (WAL, shared
    /// memory, journal, lock).
    pub names: Vec<OsString>,
    /// `(st_dev, st_ino)` of those that existed then.
    pub inodes: Vec<(u64, u64)>,
}

/// Exclude globs compiled once (by `Config`, before the database is
/// opened), with their text for messages.
#[derive(Debug, Clone, Default)]
pub struct Excludes {
    set: GlobSet,
    globs: Vec<String>,
}

impl Excludes {
    /// Compile `globs` (matched against full paths).
    pub fn new(globs: Vec<String>) -> Result<Excludes, globset::Error> {
        let mut b = GlobSetBuilder::new();
        for g in &globs {
            b.add(Glob::new(g)?);
        }
        Ok(Excludes { set: b.build()?, globs })
    }
}

impl Policy {
    /// Build from exclude globs (matched against the full path) and the
    /// database's files.
    pub fn new(excludes: &[String], db: Option<&DbFiles>) -> Result<Policy, globset::Error> {
        Ok(Policy::with_excludes(Excludes::new(excludes.to_vec())?, db))
    }

    /// Build from compiled exclude globs and the database's files.
    pub fn with_excludes(excludes: Excludes, db: Option<&DbFiles>) -> Policy {
        let Excludes { set, globs } = excludes;
        let own_files = db.iter().flat_map(|d| d.inodes.iter().copied()).collect();
        let swap_files = sys::mounts::swap_files()
            .iter()
            .filter_map(|p| std::fs::symlink_metadata(p).ok())
            .map(|m| (m.dev(), m.ino()))
            .collect();
        Policy {
            excludes: set,
            exclude_hits: globs.iter().map(|_| Default::default()).collect(),
            exclude_globs: globs,
            db_files: db.cloned(),
            own_files,
            swap_files,
            include_readonly_snapshots: false,
            include_nocow: false,
        }
    }

    /// Whether `path` matches an exclude glob (remembering which matched).
    fn excluded(&self, path: &Path) -> bool {
        if self.exclude_globs.is_empty() {
            return false;
        }
        let hits = self.excludes.matches(path);
        for i in &hits {
            self.exclude_hits[*i].store(true, std::sync::atomic::Ordering::Relaxed);
        }
        !hits.is_empty()
    }

    /// Exclude globs that matched no path so far (a typo, or a path outside
    /// the scanned ones).
    pub fn unmatched_excludes(&self) -> Vec<&str> {
        (self.exclude_globs.iter().zip(&self.exclude_hits))
            .filter(|(_, hit)| !hit.load(std::sync::atomic::Ordering::Relaxed))
            .map(|(g, _)| g.as_str())
            .collect()
    }

    /// Whether the walk may descend into directory `dir`.
    pub fn check_dir(&self, dir: &Path) -> Result<(), SkipReason> {
        if self.excluded(dir) {
            return Err(SkipReason::Excluded);
        }
        self.check_dir_marks(dir)
    }

    /// The nodedup markers of directory `dir`.
    fn check_dir_marks(&self, dir: &Path) -> Result<(), SkipReason> {
        if sys::inode::has_xattr(dir, NODEDUP_XATTR) || stat::has_entry(&dir.join(NODEDUP_MARKER)) {
            return Err(SkipReason::Nodedup);
        }
        Ok(())
    }

    /// [`Policy::check_dir`] on the open directory `fd` found at `path`:
    /// the markers are read from the descriptor the crawl then lists, so a
    /// directory swapped after the check cannot escape it.
    pub fn check_dir_fd(&self, fd: BorrowedFd<'_>, path: &Path) -> Result<(), SkipReason> {
        if self.excludes.is_match(path) {
            return Err(SkipReason::Excluded);
        }
        if beneath::has_xattr_fd(fd, NODEDUP_XATTR) || stat::has_entry_at(fd, MARKER_C) {
            return Err(SkipReason::Nodedup);
        }
        Ok(())
    }

    /// Whether any directory above `path` (up to `/`) carries a nodedup
    /// marker: a starting path inside a protected tree is protected too,
    /// also when it is reached through a bind mount of a directory inside
    /// it (or a btrfs subvolume mounted on its own): then the directories
    /// above the bound one are looked at where another mount shows them
    /// ([`sys::mounts::hidden_ancestors`]).
    pub fn check_ancestors(&self, path: &Path) -> Result<(), SkipReason> {
        // Excludes do not apply above the starting path.
        path.ancestors().skip(1).try_for_each(|a| self.check_dir_marks(a))?;
        sys::mounts::hidden_ancestors(path).iter().try_for_each(|a| self.check_dir_marks(a))
    }

    /// Whether the entry `name` of the directory `dir` (`st_dev`, `st_ino`)
    /// is one of the database's files, existing yet or not.
    pub fn is_own_database(&self, dir: (u64, u64), name: &[u8]) -> bool {
        self.db_files.as_ref().is_some_and(|d| d.dir == dir && d.names.iter().any(|n| n.as_bytes() == name))
    }

    /// Checks on a regular file that need nothing but its path and inode.
    pub fn check_file(&self, path: &Path, dev: u64, ino: u64) -> Result<(), SkipReason> {
        if self.own_files.contains(&(dev, ino)) {
            return Err(SkipReason::OwnDatabase);
        }
        if self.swap_files.contains(&(dev, ino)) {
            return Err(SkipReason::Swapfile);
        }
        if self.excluded(path) {
            return Err(SkipReason::Excluded);
        }
        Ok(())
    }

    /// The `user.nodedup` attribute of an opened file, read from the
    /// descriptor that is then hashed or shared.
    ///
    /// Checked only on files that are read (new or changed) or moved:
    /// setting an attribute changes the ctime, so a file unchanged since it
    /// was hashed has not gained one. That saves an open and a lookup per
    /// file in a nightly walk (on btrfs a separate tree lookup each).
    pub fn check_file_xattr_fd(&self, fd: BorrowedFd<'_>) -> Result<(), SkipReason> {
        if beneath::has_xattr_fd(fd, NODEDUP_XATTR) {
            return Err(SkipReason::Nodedup);
        }
        Ok(())
    }

    /// This policy, entering read-only btrfs snapshots
    /// (`--include-readonly-snapshots`) and taking NOCOW files
    /// (`--include-nocow`) as asked.
    pub fn including(mut self, readonly_snapshots: bool, nocow: bool) -> Policy {
        (self.include_readonly_snapshots, self.include_nocow) = (readonly_snapshots, nocow);
        self
    }

    /// Checks on the inode flags of an opened file.
    pub fn check_flags(&self, flags: InodeFlags) -> Result<(), SkipReason> {
        match flags {
            f if f.immutable => Err(SkipReason::Immutable),
            f if f.append_only => Err(SkipReason::AppendOnly),
            f if f.nocow && !self.include_nocow => Err(SkipReason::Nocow),
            f if f.realtime => Err(SkipReason::Realtime),
            f if f.dax => Err(SkipReason::Dax),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reopen_failures_are_named_by_cause() {
        let of = |errno| SkipReason::of_reopen(&std::io::Error::from_raw_os_error(errno));
        assert_eq!(of(libc::ENOENT), Some(SkipReason::Vanished));
        assert_eq!(of(libc::ELOOP), Some(SkipReason::Vanished));
        assert_eq!(of(libc::EXDEV), Some(SkipReason::Vanished));
        assert_eq!(of(libc::EAGAIN), Some(SkipReason::Leased));
        assert_eq!(of(libc::EMFILE), None);
        assert_eq!(of(libc::EACCES), None);
    }

    #[test]
    fn marker_file_protects_its_directory() {
        let d = tempfile::tempdir().unwrap();
        let p = Policy::new(&[], None).unwrap();
        assert_eq!(p.check_dir(d.path()), Ok(()));
        std::fs::write(d.path().join(NODEDUP_MARKER), b"").unwrap();
        assert_eq!(p.check_dir(d.path()), Err(SkipReason::Nodedup));
        std::fs::create_dir(d.path().join("sub")).unwrap();
        assert_eq!(p.check_ancestors(&d.path().join("sub")), Err(SkipReason::Nodedup));
    }

    #[test]
    fn exclude_globs_match_full_paths() {
        let p = Policy::new(&["**/*.iso".into(), "/srv/tmp/**".into()], None).unwrap();
        assert_eq!(p.check_file(Path::new("/a/b/x.iso"), 0, 1), Err(SkipReason::Excluded));
        assert_eq!(p.check_file(Path::new("/srv/tmp/a"), 0, 2), Err(SkipReason::Excluded));
        assert_eq!(p.check_file(Path::new("/srv/data/a"), 0, 3), Ok(()));
    }

    #[test]
    fn database_files_are_known_by_directory_and_name() {
        let names = ["db", "db-wal", "db.lock"].map(OsString::from).to_vec();
        let db = DbFiles { dir: (1, 2), names, inodes: vec![(1, 9)] };
        let p = Policy::new(&[], Some(&db)).unwrap();
        assert!(p.is_own_database((1, 2), b"db-wal"));
        assert!(!p.is_own_database((1, 3), b"db-wal"), "another directory");
        assert!(!p.is_own_database((1, 2), b"db-shm-x"));
        assert_eq!(p.check_file(Path::new("/elsewhere/link"), 1, 9), Err(SkipReason::OwnDatabase));
        assert!(!Policy::new(&[], None).unwrap().is_own_database((1, 2), b"db"));
    }

    #[test]
    fn flags_map_to_reasons() {
        let mut p = Policy::new(&[], None).unwrap();
        let f = InodeFlags { immutable: true, ..Default::default() };
        assert_eq!(p.check_flags(f), Err(SkipReason::Immutable));
        let nocow = InodeFlags { nocow: true, ..Default::default() };
        assert_eq!(p.check_flags(nocow), Err(SkipReason::Nocow));
        assert_eq!(p.check_flags(InodeFlags::default()), Ok(()));
        // --include-nocow lets NOCOW through, nothing else.
        p.include_nocow = true;
        assert_eq!(p.check_flags(nocow), Ok(()));
        assert_eq!(p.check_flags(InodeFlags { nocow: true, ..f }), Err(SkipReason::Immutable));
    }

    #[test]
    fn names_match_serde() {
        for r in [SkipReason::MountPoint, SkipReason::OwnDatabase, SkipReason::AppendOnly, SkipReason::HardlinkOutside]
        {
            assert_eq!(serde_json::to_string(&r).unwrap(), format!("\"{}\"", r.name()));
        }
    }
}
