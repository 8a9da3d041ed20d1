//! What went wrong with one path or range: the one vocabulary of error
//! kinds, counted by kind in the report's `error_kinds` (and in the
//! metrics' `errors_by_kind`). A problem with one file never ends the run:
//! it is warned about once, counted here, and the run exits 1.
//!
//! Each kind is serialised as its snake_case name (as
//! [`crate::policy::SkipReason`] is), and those names are what the JSON
//! report, the run history in the database and `report --json` hold, so
//! they do not change. The kernel's refusals of single destinations while
//! sharing are an open set (one per errno) and are counted apart, as
//! `dedupe_<errno>` (see [`crate::report::Report::share_error`]).

use serde::Serialize;

/// Why one path or range could not be handled. Serialised in snake_case as
/// the keys of the report's `error_kinds` object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// A directory could not be opened or listed, a starting path could not
    /// be examined, or a file could not be opened for lack of permission
    /// (`EACCES`, `EPERM`) when it was to be hashed.
    Unreadable,
    /// A starting path is gone. (A file or directory below it that is gone
    /// when the crawl, the hashing or the share phase comes to it is a
    /// skip, `SkipReason::Vanished`: users delete files.)
    Vanished,
    /// A file could not be opened: when it was to be hashed, for a reason
    /// other than permission (that is `unreadable`); in the share phase,
    /// for any reason but its absence or a lease (skips, see
    /// `SkipReason::of_reopen`).
    Open,
    /// `fstat` of an open file failed.
    Stat,
    /// Its inode flags could not be read (so the policy could not be
    /// applied: the file is left alone).
    Flags,
    /// Reading it to hash failed.
    Read,
    /// Its block map could not be held in memory (the allocator refused).
    OutOfMemory,
    /// Its block map is larger than SQLite can store in one value.
    TooLarge,
    /// The volume was full (`ENOSPC`, `EDQUOT`) while rewriting partly
    /// shared extents: counted once a run; the files wait for a later
    /// round of the run, else for the next run.
    NoSpace,
    /// Rewriting partly shared extents failed for another reason.
    Rewrite,
    /// The kernel refused to turn a file's written zero blocks into holes
    /// (`dedupe::zeros`) for a reason other than a full volume.
    Zeros,
}

impl ErrorKind {
    /// Every kind, in order.
    pub const ALL: [ErrorKind; 11] = [
        ErrorKind::Unreadable,
        ErrorKind::Vanished,
        ErrorKind::Open,
        ErrorKind::Stat,
        ErrorKind::Flags,
        ErrorKind::Read,
        ErrorKind::OutOfMemory,
        ErrorKind::TooLarge,
        ErrorKind::NoSpace,
        ErrorKind::Rewrite,
        ErrorKind::Zeros,
    ];

    /// Name as shown in the report (the serialised form).
    pub const fn name(self) -> &'static str {
        match self {
            ErrorKind::Unreadable => "unreadable",
            ErrorKind::Vanished => "vanished",
            ErrorKind::Open => "open",
            ErrorKind::Stat => "stat",
            ErrorKind::Flags => "flags",
            ErrorKind::Read => "read",
            ErrorKind::OutOfMemory => "out_of_memory",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::NoSpace => "no_space",
            ErrorKind::Rewrite => "rewrite",
            ErrorKind::Zeros => "zeros",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The name shown in text and the serialised JSON key are one string.
    #[test]
    fn names_are_the_serialised_form() {
        for k in ErrorKind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), serde_json::Value::String(k.name().to_owned()));
        }
    }
}
