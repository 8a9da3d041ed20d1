//! The unnamed files, all hole, that the zero pass shares from.

use std::fs::File;

use crate::sys::beneath::Tree;

/// The unnamed files, all hole, that requests share from: the one made
/// first, with the data checksums the volume's mount options give (or
/// not), and, when a file first needs it, one the other way: btrfs refuses
/// to share between a file with checksums and one without
/// (`sys::btrfs_tree`). A dry run makes none (`made` is `None`), once it
/// knows the run could.
pub(super) struct Holes {
    made: Option<File>,
    /// Whether `made` keeps no checksums, asked once.
    made_kind: Option<Result<bool, nix::errno::Errno>>,
    other: Option<Option<File>>,
}

impl Holes {
    /// The holes of a pass whose first is `made` (a dry run: none).
    pub(super) fn new(made: Option<File>) -> Holes {
        Holes { made, made_kind: None, other: None }
    }

    /// The hole to share into `f` from: `made`, unless it keeps checksums
    /// and `f` not, or the other way (where either is unknown: `made`).
    pub(super) fn for_file(&mut self, f: &File, tree: &Tree) -> Option<&File> {
        use crate::sys::btrfs_tree::nodatasum;
        use std::os::fd::AsFd;
        let made = self.made.as_ref()?;
        let has = *self.made_kind.get_or_insert_with(|| nodatasum(made.as_fd()));
        match (nodatasum(f.as_fd()), has) {
            (Ok(want), Ok(has)) if want != has => {
                let other = self.other.get_or_insert_with(|| {
                    let t = tree.tmpfile().ok()?;
                    crate::sys::btrfs_tree::match_checksums(t.as_fd(), f.as_fd()).ok()?;
                    t.set_len(crate::sys::dedupe::MAX_REQUEST_LEN).ok()?;
                    Some(t)
                });
                other.as_ref().or(Some(made))
            }
            _ => Some(made),
        }
    }
}
