//! Unnamed temporary files for what is too long to hold in memory: a plan
//! past a million ranges (`pipeline/batches.rs`), a `--list` past a few
//! thousand entries (`report/listed.rs`).

use std::fs::File;
use std::path::{Path, PathBuf};

/// Where they go: `$TMPDIR`, else `/var/tmp` (on disk by convention, where
/// `/tmp` may be a tmpfs, i.e. memory; the systemd unit gives the run
/// private ones, `PrivateTmp=yes`), else the system's.
pub fn spill_dir() -> PathBuf {
    match std::env::var_os("TMPDIR") {
        Some(d) if !d.is_empty() => d.into(),
        _ if Path::new("/var/tmp").is_dir() => "/var/tmp".into(),
        _ => std::env::temp_dir(),
    }
}

/// A new unnamed file in [`spill_dir`] (`O_TMPFILE`: never visible, gone
/// when the process ends however it ends).
pub fn spill_file() -> std::io::Result<File> {
    tempfile::tempfile_in(spill_dir())
}
