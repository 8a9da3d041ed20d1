//! Where the database lives, checked before anything is opened there.
//!
//! The database lists every path and fingerprint of the volume, and a root
//! run creates and writes it. In a directory another user can write, that
//! user decides what the database's names lead to: a symlink at the
//! database's name makes root write its database into the user's file
//! (which they then read), a dangling one at the database or at its
//! `.lock` makes root create a file wherever it points, and a `-wal`,
//! `-shm` or `-journal` they put there first is taken by SQLite as the
//! database's own. A sticky bit does not help: it keeps others from
//! removing our files, not from creating theirs under the names we are
//! about to use. So, before anything is opened ([`Place::prepare`] for a
//! run, [`Place::existing`] for `report`, which reads it too):
//!
//! - the database's directory must be owned by root or by the user running
//!   dedupscan, and writable by nobody else (no group or other write bit,
//!   sticky or not);
//! - every directory above it must be owned by root or that user, and be
//!   writable by nobody else unless it is sticky: otherwise its owner could
//!   rename the checked directory away and put one of their own at its path
//!   between this check and SQLite's opens, which go by path;
//! - the path is made canonical here, once (so `SQLITE_OPEN_NOFOLLOW`, which
//!   refuses a symlink in any component, can be passed to SQLite), following
//!   only symlinks root or that user owns, in directories that pass the
//!   check above ([`crate::sys::resolve`]): the checks of the canonical directory would
//!   not see a symlink a user planted on the way (in `/tmp`, or in their own
//!   directory) to a root-owned directory of their choosing; and the
//!   directories still missing are created 0700 only below a directory that
//!   passed the check;
//! - the database file and its lock are opened relative to the checked
//!   directory with `O_NOFOLLOW`, and each of the database's files that
//!   already exists must be a regular file owned by that user.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};

use crate::display::display_path;
use crate::policy::DbFiles;
use crate::sys::resolve::{check_chain, euid, resolve, Resolve};

use super::DbError;

/// The names a database `<name>` uses besides its own, as suffixes: SQLite's
/// write-ahead log, shared-memory index and rollback journal, and the run
/// lock. SQLite creates and removes the first three during a run.
pub const SUFFIXES: [&str; 5] = ["", "-wal", "-shm", "-journal", ".lock"];

/// A database path whose directory passed the checks, held open.
pub struct Place {
    /// The directory, held: the database file and its lock are opened
    /// relative to it.
    dir: OwnedFd,
    /// Its `(st_dev, st_ino)`: the crawl knows the database's files by it.
    dir_id: (u64, u64),
    /// The database's file name.
    name: OsString,
    /// The canonical directory joined with `name`: no symlink anywhere.
    pub path: PathBuf,
}

/// The refusal of `path`, for `reason`.
fn refuse(path: &Path, reason: impl Into<String>) -> DbError {
    DbError::Unsafe { path: path.to_owned(), reason: reason.into() }
}

impl Place {
    /// The place of the database `path` for a run: the directories still
    /// missing are created (0700), then everything is checked.
    pub fn prepare(path: &Path) -> Result<Place, DbError> {
        Place::locate(path, true)
    }

    /// The place of the existing database `path` (for `report`): nothing is
    /// created.
    pub fn existing(path: &Path) -> Result<Place, DbError> {
        Place::locate(path, false)
    }

    fn locate(path: &Path, create: bool) -> Result<Place, DbError> {
        let name = match path.file_name() {
            Some(n) => n.to_owned(),
            None => return Err(refuse(path, "it does not end in a file name")),
        };
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let io_err = |source: io::Error| DbError::Create { path: path.to_owned(), source };
        let fail = |e: Resolve| match e {
            Resolve::Io(source) => io_err(source),
            Resolve::Unsafe(why) => refuse(path, why),
        };
        let (found, missing) = resolve(parent, false).map_err(fail)?;
        if !missing.is_empty() {
            if !create {
                return Err(io_err(io::Error::from(io::ErrorKind::NotFound)));
            }
            // Nothing is created below a directory someone else could
            // write (the new ones are checked again below, as created).
            check_chain(&found, false).map_err(|why| refuse(path, why))?;
            let mut d = found.clone();
            for m in missing.iter().rev() {
                d.push(m);
                match std::fs::DirBuilder::new().mode(0o700).create(&d) {
                    Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(io_err(e)),
                    _ => {}
                }
            }
        }
        // Resolved again: a name just created in a sticky directory may
        // have been taken by another user first.
        let (dir_path, still_missing) =
            resolve(&found.join(missing.iter().rev().collect::<PathBuf>()), false).map_err(fail)?;
        if !still_missing.is_empty() {
            return Err(io_err(io::Error::from(io::ErrorKind::NotFound)));
        }
        let checked = check_chain(&dir_path, true).map_err(|why| refuse(path, why))?;
        let dir = rustix::fs::open(
            &dir_path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_err(e.into()))?;
        let st = rustix::fs::fstat(&dir).map_err(|e| io_err(e.into()))?;
        // The chain cannot have changed (nobody else may write in it), but
        // the descriptor is what the files are opened from: make sure.
        if (st.st_dev, st.st_ino) != (checked.st_dev, checked.st_ino) {
            return Err(refuse(path, format!("{} changed while it was checked", display_path(&dir_path))));
        }
        let path = dir_path.join(&name);
        Ok(Place { dir, dir_id: (st.st_dev, st.st_ino), name, path })
    }

    /// `<name><suffix>`, relative to the directory.
    fn file_name(&self, suffix: &str) -> OsString {
        let mut n = self.name.clone();
        n.push(suffix);
        n
    }

    /// The database's own files, as the crawl recognises them.
    pub fn own_files(&self) -> DbFiles {
        let inodes = SUFFIXES
            .iter()
            .filter_map(|s| {
                rustix::fs::statat(&self.dir, self.file_name(s).as_os_str(), AtFlags::SYMLINK_NOFOLLOW).ok()
            })
            .map(|st| (st.st_dev, st.st_ino))
            .collect();
        DbFiles { dir: self.dir_id, names: SUFFIXES.iter().map(|s| self.file_name(s)).collect(), inodes }
    }

    /// Every one of the database's files that exists is a regular file of
    /// ours: a database, journal or lock left by another user (or a symlink,
    /// a FIFO) is refused rather than opened.
    pub fn check_files(&self) -> Result<(), DbError> {
        for suffix in SUFFIXES {
            let name = self.file_name(suffix);
            match rustix::fs::statat(&self.dir, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => self.check_file(&name, &st)?,
                Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(DbError::Create { path: self.path.with_file_name(&name), source: e.into() }),
            }
        }
        Ok(())
    }

    /// `st` (of the file `name`) is a regular file owned by us.
    fn check_file(&self, name: &OsStr, st: &Stat) -> Result<(), DbError> {
        let path = self.path.with_file_name(name);
        let kind = FileType::from_raw_mode(st.st_mode);
        if kind != FileType::RegularFile {
            let what = if kind == FileType::Symlink { "a symbolic link" } else { "not a regular file" };
            return Err(refuse(&path, format!("it is {what}")));
        }
        if st.st_uid != euid() {
            return Err(refuse(
                &path,
                format!("it is owned by uid {}, not by uid {}, which runs dedupscan", st.st_uid, euid()),
            ));
        }
        Ok(())
    }

    /// Open `<name><suffix>` in the directory without following a symlink,
    /// creating it (0600) with `create`, and check it is a regular file of
    /// ours.
    fn open_at(&self, suffix: &str, create: bool) -> Result<File, DbError> {
        let name = self.file_name(suffix);
        let path = self.path.with_file_name(&name);
        // Non-blocking: a FIFO at the name must not hang the run (it is
        // refused below).
        let mut flags = OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
        flags |= if create { OFlags::RDWR | OFlags::CREATE } else { OFlags::RDONLY };
        let fd: OwnedFd = match rustix::fs::openat(&self.dir, name.as_os_str(), flags, Mode::from_raw_mode(0o600)) {
            Ok(fd) => fd,
            // O_NOFOLLOW on a symlink: say so.
            Err(rustix::io::Errno::LOOP) => return Err(refuse(&path, "it is a symbolic link")),
            Err(e) => return Err(DbError::Create { path, source: e.into() }),
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| DbError::Create { path: path.clone(), source: e.into() })?;
        self.check_file(&name, &st)?;
        Ok(File::from(fd))
    }

    /// Open (creating if needed, 0600 from the first byte: it lists every
    /// path and fingerprint of the volume) the database file itself.
    pub fn create_database(&self) -> Result<(), DbError> {
        self.open_at("", true).map(drop)
    }

    /// Open (creating if needed) the run lock, `<name>.lock`.
    pub fn open_lock(&self) -> Result<File, DbError> {
        self.open_at(".lock", true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_private_directory_is_accepted_and_missing_ones_are_created_private() {
        let d = tempfile::tempdir().unwrap();
        let p = Place::prepare(&d.path().join("a/b/db.sqlite")).unwrap();
        assert_eq!(p.path, std::fs::canonicalize(d.path()).unwrap().join("a/b/db.sqlite"));
        let mode = std::fs::metadata(d.path().join("a/b")).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        p.create_database().unwrap();
        p.open_lock().unwrap();
        p.check_files().unwrap();
        assert!(rustix::fs::statat(&p.dir, "db.sqlite.lock", AtFlags::empty()).is_ok());
        assert_eq!(Place::existing(&d.path().join("a/b/db.sqlite")).unwrap().path, p.path);
    }

    #[test]
    fn a_directory_others_can_write_is_refused_sticky_or_not() {
        let d = tempfile::tempdir().unwrap();
        for mode in [0o777, 0o1777, 0o770, 0o720] {
            chmod(d.path(), mode);
            let e = Place::prepare(&d.path().join("db")).err().expect("refused");
            assert!(
                matches!(e, DbError::Unsafe { .. }) && e.to_string().contains("writable by others"),
                "{mode:o}: {e}"
            );
            if mode & 0o1000 == 0 {
                // Nothing is created below it either (below a sticky one,
                // as in /tmp, a new private directory is fine: see below).
                let e = Place::prepare(&d.path().join("new/db")).err().expect("refused");
                assert!(matches!(e, DbError::Unsafe { .. }), "{e}");
                assert!(!d.path().join("new").exists());
            }
        }
        // Sticky and writable by others above the database's directory is
        // fine (that is /tmp and /var/tmp): nobody else may rename it.
        chmod(d.path(), 0o1777);
        std::fs::DirBuilder::new().mode(0o700).create(d.path().join("mine")).unwrap();
        Place::prepare(&d.path().join("mine/db")).unwrap();
        chmod(d.path(), 0o777);
        assert!(Place::prepare(&d.path().join("mine/db")).is_err(), "a writable directory above, not sticky");
    }

    #[test]
    fn symlinks_and_other_files_at_the_names_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let db = d.path().join("db");
        std::os::unix::fs::symlink(d.path().join("elsewhere"), &db).unwrap();
        let p = Place::prepare(&db).unwrap();
        assert!(p.check_files().unwrap_err().to_string().contains("symbolic link"));
        assert!(p.create_database().unwrap_err().to_string().contains("symbolic link"));
        assert!(!d.path().join("elsewhere").exists(), "followed the symlink");
        std::fs::remove_file(&db).unwrap();
        std::os::unix::fs::symlink(d.path().join("elsewhere"), d.path().join("db.lock")).unwrap();
        assert!(p.open_lock().unwrap_err().to_string().contains("symbolic link"));
        assert!(!d.path().join("elsewhere").exists(), "followed the symlink");
        std::fs::remove_file(d.path().join("db.lock")).unwrap();
        std::fs::create_dir(d.path().join("db-wal")).unwrap();
        assert!(p.check_files().unwrap_err().to_string().contains("not a regular file"));
    }

    #[test]
    fn a_symlink_on_the_way_is_followed_only_if_ours_in_a_checked_directory() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("real")).unwrap();
        std::os::unix::fs::symlink("real", d.path().join("link")).unwrap();
        // Ours, but in a directory others could write: they could replace it.
        chmod(d.path(), 0o777);
        let e = Place::prepare(&d.path().join("link/db")).err().expect("refused");
        assert!(e.to_string().contains("writable by others"), "{e}");
        chmod(d.path(), 0o700);
        if euid() == 0 {
            rustix::fs::chownat(
                rustix::fs::CWD,
                d.path().join("link"),
                Some(rustix::fs::Uid::from_raw(65534)),
                None,
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .unwrap();
            let e = Place::prepare(&d.path().join("link/new/db")).err().expect("refused");
            assert!(e.to_string().contains("symbolic link owned by uid 65534"), "{e}");
            assert!(!d.path().join("real/new").exists());
        }
    }

    #[test]
    fn the_directory_is_made_canonical() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("real")).unwrap();
        std::os::unix::fs::symlink("real", d.path().join("link")).unwrap();
        let p = Place::prepare(&d.path().join("link/db")).unwrap();
        assert_eq!(p.path, std::fs::canonicalize(d.path()).unwrap().join("real/db"));
        let e = Place::existing(&d.path().join("missing/db")).err().expect("no such directory");
        assert!(matches!(e, DbError::Create { .. }), "{e}");
        assert!(!d.path().join("missing").exists());
    }
}
