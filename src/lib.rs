//! dedupscan: find data stored twice on btrfs and XFS and let the kernel
//! share it with `FIDEDUPERANGE`.
//!
//! The pipeline, one module per stage (see `docs/ARCHITECTURE.md`):
//! [`walk`] (with [`policy`]) → [`hash`] → [`db`] → [`plan`] → [`dedupe`] →
//! [`report`], driven by [`run`]. All ioctls and `unsafe` live in [`sys`].

/// `eprintln!` for every module below (textual scope): a line to stderr
/// that never panics. std's panics on a write error, so a reader that went
/// away (`dedupscan /srv 2>&1 | head -1`) would end the run with a panic
/// (exit 101) at its next progress line; this drops the line instead and
/// the run goes on to its own exit status.
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod bookend;
pub mod cli;
pub mod config;
pub mod corpus;
pub mod db;
pub mod dedupe;
pub mod exit;
pub mod hash;
pub mod history;
pub mod html;
pub mod metrics;
pub mod plan;
pub mod policy;
pub mod progress;
pub mod report;
pub mod run;
pub mod sys;
pub mod types;
pub mod walk;
