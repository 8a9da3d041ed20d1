//! The "too large" part of `dedupscan report`: files a run read and
//! refused because their block map is past the bound (~610 GiB of data at
//! 4 KiB blocks), which later runs refuse unread while they are unchanged
//! (`hash::refused`). They are never shared; the admin should know which.
//!
//! In: the database's `too_large` rows. Out: each file, largest first, and
//! its lines in the text report.

use serde::Serialize;

use crate::db::Db;
use crate::display::{display_path, human};
use crate::report::Table;

/// A file refused as too large.
#[derive(Debug, Serialize)]
pub struct TooLargeFile {
    /// Where it was found, escaped.
    pub path: String,
    /// Its size when refused.
    pub size_bytes: u64,
    /// The run that read it and refused it.
    pub run: i64,
}

/// Every refusal recorded, largest first.
pub(super) fn too_large(db: &Db) -> rusqlite::Result<Vec<TooLargeFile>> {
    let mut out: Vec<TooLargeFile> = db
        .too_large()?
        .into_iter()
        .map(|r| TooLargeFile { path: display_path(&r.path), size_bytes: r.size, run: r.run })
        .collect();
    out.sort_by(|a, b| b.size_bytes.cmp(&a.size_bytes).then_with(|| a.path.cmp(&b.path)));
    Ok(out)
}

/// The text report's table of them, if any.
pub(super) fn text(files: &[TooLargeFile]) -> Option<String> {
    if files.is_empty() {
        return None;
    }
    let mut t =
        Table::new(&["too large to hash", "refused by run", "file (never shared; read again once changed)"]).left(2);
    for f in files {
        t.row([human(f.size_bytes), f.run.to_string(), f.path.clone()]);
    }
    Some(t.render())
}
