//! What the zero pass says: a file's failure, a full volume (once a run),
//! and, with `-v`, who outside the run keeps a file's zeros, and which
//! files keep shared zeros past the bound on punches of one block.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::sync::atomic::AtomicBool;

use crate::display::display_path;
use crate::errors::ErrorKind;
use crate::file::FileFacts;
use crate::progress::Progress;

use super::{Outside, ZeroPass, ZerosOutcome};

impl ZeroPass<'_> {
    /// The volume (or a quota) was full for a rewrite or a punch of the
    /// file at `path`: as for the bookend pass, said and counted once a
    /// run; the file waits for the next run (`zeros_keep_free`), which a
    /// full disk's error used to leave to the weekly full plan.
    pub(super) fn full(&self, path: &std::path::Path, why: &str, out: &mut ZerosOutcome, progress: &dyn Progress) {
        if out.errors.contains_key(&ErrorKind::NoSpace) {
            return;
        }
        out.errors.insert(ErrorKind::NoSpace, 1);
        progress.warn(&format!(
            "{}: {why}; this file and any others like it wait for the next run (pending in the report)",
            display_path(path)
        ));
    }

    /// Count a failure of file `c` (said, unless the filesystem stopped:
    /// that stops the run, said once, not once for every file left).
    pub(super) fn failed(
        &self,
        out: &mut ZerosOutcome,
        c: &FileFacts,
        (kind, why, errno): (ErrorKind, &str, Option<i32>),
        (progress, stop): (&dyn Progress, &AtomicBool),
    ) {
        *out.errors.entry(kind).or_default() += 1;
        let fs_wide = matches!(errno, Some(libc::EIO | libc::EROFS));
        if !(fs_wide && self.tree.stop_if_stopped(stop, |w| progress.warn_run(w))) {
            progress.warn(&format!("{}: {why}", display_path(&c.path)));
        }
    }
}

/// Say (with `-v`) that the file at `path` keeps shared zeros for the
/// next run (`zeros_many_clones`): as many files of the run as a block may
/// be punched by already let go of them (`SharedZeros::may_compare`).
pub(super) fn say_compared(path: &std::path::Path, progress: &dyn Progress) {
    let n = crate::dedupe::zeros::MAX_COMPARED_PER_ZERO;
    progress.info(&format!("{}: shared zeros left for the next run: {n} files let go first", display_path(path)));
}

/// Say (with `-v`) that the zeros of the open file `f` at `path` stay for
/// the holder outside the run `by`, named from the volume's top level
/// where it can be (not looked up without `-v`).
pub(super) fn say_held(
    path: &std::path::Path,
    f: &File,
    (bytes, all): (u64, &BTreeMap<Outside, Option<crate::sys::btrfs_names::Stamp>>),
    progress: &dyn Progress,
) {
    let Some((&(root, ino), _)) = all.last_key_value().filter(|_| progress.shows_info()) else { return };
    let name = crate::sys::btrfs_names::path_of(f.as_fd(), root, ino);
    let mut by = match name {
        Some(p) => format!("{} (subvolume {root})", String::from_utf8_lossy(&p)),
        None => format!("inode {ino} of subvolume {root}"),
    };
    let (verb, it) = match all.len() - 1 {
        0 => ("holds", "it is"),
        n => {
            by += &format!(" and {n} other file{}", if n == 1 { "" } else { "s" });
            ("hold", "one is")
        }
    };
    progress.info(&format!(
        "{}: {} of written zeros left: {by}, outside the run, also {verb} them; tried again once {it} gone",
        display_path(path),
        crate::display::human(bytes)
    ));
}
