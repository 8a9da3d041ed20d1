//! Exit codes, in one place. Documented in the man page and README.

/// How a run ended, as the process exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    /// Everything done, no errors.
    Success = 0,
    /// Finished, but some paths or ranges had errors (counted in the report).
    PartialErrors = 1,
    /// Bad command line (clap's own code).
    Usage = 2,
    /// Could not run at all (database unusable, path missing, …).
    Fatal = 3,
    /// Another run holds the database's lock.
    Locked = 4,
}

impl ExitCode {
    pub fn code(self) -> i32 {
        self as i32
    }
}

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
    }
}
