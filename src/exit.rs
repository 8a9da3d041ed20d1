//! Exit codes, in one place. Documented in the man page (generated from
//! [`ExitCode::ALL`] and [`ExitCode::meaning`]), the README and
//! docs/ARCHITECTURE.md.

/// How a run ended, as the process exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    /// Everything done, no errors.
    Success = 0,
    /// Finished, but some paths or ranges had errors (counted in the report).
    PartialErrors = 1,
    /// Bad command line or unusable paths, found before the database is
    /// opened: nothing was done.
    Usage = 2,
    /// Could not run at all (database unusable, or in a place another user
    /// could redirect or read, …).
    Fatal = 3,
    /// Another run holds the database's lock.
    Locked = 4,
    /// Stopped before finishing (SIGINT, SIGTERM, `--max-runtime`, or the
    /// filesystem stopped during the run: remounted read-only, or shut down
    /// after an error): the work done is committed, the run is marked interrupted in the history,
    /// and the next run carries on. Distinct from 0 so that a timer or a
    /// script sees that the volume was not fully processed.
    Interrupted = 5,
    /// The paths are on a filesystem dedupscan cannot share on (ext4,
    /// tmpfs, XFS made with reflink=0, …), or on a read-only mount (a dry
    /// run is allowed there): refused before anything is hashed or a
    /// database created.
    Unsupported = 6,
}

impl ExitCode {
    /// Every code, in order (for the man page and tests).
    pub const ALL: [ExitCode; 7] = [
        ExitCode::Success,
        ExitCode::PartialErrors,
        ExitCode::Usage,
        ExitCode::Fatal,
        ExitCode::Locked,
        ExitCode::Interrupted,
        ExitCode::Unsupported,
    ];

    /// The process exit status.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// One line for `--help` and the docs.
    pub fn meaning(self) -> &'static str {
        match self {
            ExitCode::Success => "success",
            ExitCode::PartialErrors => "finished, but some paths or ranges had errors (counted in the report)",
            ExitCode::Usage => "usage error (bad option or glob, missing path, a path through another user's symlink, paths on different filesystems); nothing done",
            ExitCode::Fatal => {
                "fatal error (database unreadable, from a newer version, or where another user could tamper with it, …)"
            }
            ExitCode::Locked => "the database is locked by another run",
            ExitCode::Interrupted => {
                "stopped before finishing (SIGINT, SIGTERM, --max-runtime, or the filesystem stopped during the run); work done is kept, the next run carries on"
            }
            ExitCode::Unsupported => {
                "not btrfs or XFS with reflink, or mounted read-only (a --dry-run is not refused there): refused before hashing, no database created (`scan` records it anyway)"
            }
        }
    }
}

/// Exit status when a second SIGINT or SIGTERM arrives while the first is
/// still being honoured: the process ends at once (128 + SIGINT, as a shell
/// reports a killed command). The database stays consistent (SQLite), the
/// run is left without an end in the history.
pub const KILLED: i32 = 130;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable() {
        assert_eq!(ExitCode::Success.code(), 0);
        assert_eq!(ExitCode::PartialErrors.code(), 1);
        assert_eq!(ExitCode::Usage.code(), 2);
        assert_eq!(ExitCode::Fatal.code(), 3);
        assert_eq!(ExitCode::Locked.code(), 4);
        assert_eq!(ExitCode::Interrupted.code(), 5);
        assert_eq!(ExitCode::Unsupported.code(), 6);
        for (i, c) in ExitCode::ALL.iter().enumerate() {
            assert_eq!(c.code(), i as i32);
        }
    }
}
