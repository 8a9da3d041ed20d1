//! Opening a file of the plan again to share it: whether it is still what
//! the scan recorded, still one this run may share, and what to count when
//! not. A file found changed, gone, leased or left alone is said once, by
//! the first worker that finds it, and never used again by any.
//!
//! Every open is below the run's starting paths ([`crate::sys::beneath::Tree`]: no
//! symlink in any component, no `..`, no mount crossed), and its identity
//! (device, inode, size, mtime, ctime) is checked on that descriptor:
//! setting an attribute or a flag changes the ctime, so a file the plan
//! trusts unchanged has gained no `user.nodedup`, immutable or append-only
//! flag since it was hashed. Only a change of options between runs is not
//! seen that way (NOCOW, see `nocow_now`).

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;

use nix::errno::Errno;

use super::executor::Executor;
use super::workers::locked;
use crate::display::display_path;
use crate::errors::ErrorKind;
use crate::file::FileId;
use crate::policy::SkipReason;
use crate::sys;

impl Executor<'_> {
    /// Open a file read-only and check that it is still what was scanned.
    /// A file found changed or unopenable is counted and warned about by
    /// the first worker that finds it, and never used again by any.
    pub(super) fn open(&mut self, id: FileId) -> Option<File> {
        if locked(&self.ctx.bad).contains(&id) {
            return None;
        }
        let c = self.files.get(&id)?;
        match self.ctx.tree.open_file(&c.path) {
            Ok(f) => (self.unchanged(id, &f) && self.nocow_now(id, &f)).then_some(f),
            Err(e) => {
                // Known leased before it is known bad: see `leased`.
                if SkipReason::of_reopen(&e) == Some(SkipReason::Leased) {
                    locked(&self.ctx.leased).insert(id);
                }
                if locked(&self.ctx.bad).insert(id) {
                    self.not_opened(&c.path, &e);
                }
                None
            }
        }
    }

    /// Count the file at `path`, which could not be opened again: gone or
    /// leased is a skip, said with `-v` (users delete files; a file server
    /// leases them), anything else an error, warned about.
    fn not_opened(&mut self, path: &Path, e: &std::io::Error) {
        let Some(why) = SkipReason::of_reopen(e) else {
            *self.out.errors.entry(ErrorKind::Open).or_default() += 1;
            if !self.volume_stopped(Errno::from_raw(e.raw_os_error().unwrap_or(0))) {
                self.progress.warn(&format!("{}: cannot open: {e}", display_path(path)));
            }
            return;
        };
        *self.out.skipped.entry(why).or_default() += 1;
        self.progress.info(&format!("{}: not shared: {}", display_path(path), why.not_reopened()));
    }

    /// Whether file `id`, which could not be opened, is leased: the ranges
    /// planned into it, or from it into its copies, wait for a later run.
    pub(super) fn leased(&self, id: FileId) -> bool {
        locked(&self.ctx.leased).contains(&id)
    }

    /// Whether the open file `f` (row `id`) is still what the scan
    /// recorded (device, inode, size, mtime, ctime); if not, it is left
    /// alone from here on, counted changed, and said once. Checked at the
    /// open and on every destination before each request (one `fstat`): a
    /// name added since the open (a hard link, perhaps behind a `.nodedup`
    /// marker) changes the ctime, and a file with many ranges, or a large
    /// one, takes many requests. Sharing itself changes neither time
    /// (`FIDEDUPERANGE` leaves both).
    pub(super) fn unchanged(&mut self, id: FileId, f: &File) -> bool {
        let files = self.files;
        let Some(c) = files.get(&id) else { return false };
        let same = c.is_open_as_recorded(f, &mut self.keys);
        // A file that cannot even be `fstat`ed may be on a filesystem shut down.
        if !same && !self.volume_stopped(Errno::EIO) && locked(&self.ctx.bad).insert(id) {
            self.progress.warn(&format!(
                "{}: changed since it was scanned; left alone, it is rehashed next run",
                display_path(&c.path)
            ));
            self.out.changed_files += 1;
        }
        same
    }

    /// Whether the open file `f` (row `id`) may be shared as far as NOCOW
    /// goes. The plan trusts a file unchanged since an earlier run hashed
    /// it, and its flags are read when it is hashed: a NOCOW file hashed
    /// under `--include-nocow` would otherwise be shared by a later run
    /// without it. One `FS_IOC_GETFLAGS` per file opened, on btrfs without
    /// the option only; flags that cannot be read leave the file alone. A
    /// NOCOW file is marked stale: its pairs were planned by this run, and
    /// an incremental plan only pairs files read again.
    fn nocow_now(&mut self, id: FileId, f: &File) -> bool {
        let flags = nocow_left(self.ctx.leave_nocow, f);
        if flags == Ok(false) {
            return true;
        }
        if locked(&self.ctx.bad).insert(id) {
            let path = self.path_of(id);
            match flags {
                Ok(_) => {
                    // Read again by the next run: skipped there as NOCOW,
                    // or, with the option, hashed and planned again.
                    self.out.stale.insert(id);
                    *self.out.skipped.entry(SkipReason::Nocow).or_default() += 1;
                    self.progress.info(&format!("{path}: not shared: NOCOW (--include-nocow shares it)"));
                }
                Err(e) => {
                    *self.out.errors.entry(ErrorKind::Flags).or_default() += 1;
                    self.progress.warn(&format!("{path}: cannot read its inode flags: {e}; left alone"));
                }
            }
        }
        false
    }

    /// A destination owned by another user than its source: left alone and
    /// counted as changed. The plan pairs files of one owner only (their
    /// fingerprints are salted apart), so an owner that differs now changed
    /// since the scan; sharing them would show the owner of one, in FIEMAP,
    /// that it holds the other's content.
    pub(super) fn other_owner(&mut self, dest: FileId, src: FileId) {
        if locked(&self.ctx.bad).insert(dest) {
            self.progress.warn(&format!(
                "{}: owned by another user than its source {}; left alone, it is rehashed next run",
                self.path_of(dest),
                self.path_of(src)
            ));
            self.out.changed_files += 1;
        }
    }
}

/// Whether a file opened to be shared is NOCOW and must be left alone
/// (`leave_nocow`: btrfs without `--include-nocow`): one `FS_IOC_GETFLAGS`,
/// asked only then. The share workers and the zero pass ask it.
pub fn nocow_left(leave_nocow: bool, f: &File) -> Result<bool, Errno> {
    if !leave_nocow {
        return Ok(false);
    }
    sys::inode_flags(f.as_fd(), sys::FsKind::Btrfs).map(|fl| fl.nocow)
}
