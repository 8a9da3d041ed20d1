//! The "pinned" part of `dedupscan report` (btrfs, issue 13): which files
//! hold shared bytes that freed nothing, and why.
//!
//! In: the database's pinned rows (written by each sharing run, see
//! `schema/0008_pinned.sql`), only those still true of an unchanged file.
//! Out: the total, the total by reason, and every such file, largest first
//! (the text shows the first [`SHOWN`]).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::db::Db;
use crate::display::{display_path, human};
use crate::report::Table;

/// Files listed in the text report; `--json` has them all.
const SHOWN: usize = 10;

/// A file whose shared bytes pin an extent, for one reason.
#[derive(Debug, Serialize)]
pub struct PinnedFile {
    /// The file's path, escaped.
    pub path: String,
    /// Why: the names of [`crate::dedupe::PinReason`].
    pub reason: String,
    /// Shared bytes that freed nothing.
    pub bytes: u64,
}

/// What sharing left pinned, as the runs recorded it.
#[derive(Debug, Default, Serialize)]
pub struct Pinned {
    /// Shared bytes that freed nothing: their extent stays on disk for an
    /// unshared rest of the same file.
    pub bytes: u64,
    /// `bytes` by reason.
    pub by_reason: BTreeMap<String, u64>,
    /// Every file holding such bytes (a file pinned for two reasons is
    /// listed twice), largest first.
    pub files: Vec<PinnedFile>,
}

/// Read what is pinned now from the database.
pub(super) fn pinned(db: &Db) -> rusqlite::Result<Pinned> {
    let rows = db.pinned_files()?;
    let facts = db.file_facts(rows.iter().map(|r| r.file))?;
    let mut out = Pinned::default();
    for r in rows {
        let Some(f) = facts.get(&r.file) else { continue };
        out.bytes += r.bytes;
        *out.by_reason.entry(r.reason.clone()).or_default() += r.bytes;
        out.files.push(PinnedFile { path: display_path(&f.path), reason: r.reason, bytes: r.bytes });
    }
    Ok(out)
}

impl Pinned {
    /// The reasons, for the space table: `below_rewrite_ratio: 3 MiB, ...`.
    pub(super) fn reasons(&self) -> String {
        let list: Vec<String> = self.by_reason.iter().map(|(k, n)| format!("{k}: {}", human(*n))).collect();
        list.join(", ")
    }

    /// The files holding the most pinned bytes, as a text table (`None`
    /// when nothing is pinned).
    pub(super) fn files_text(&self) -> Option<String> {
        if self.files.is_empty() {
            return None;
        }
        let mut t = Table::new(&["pinned", "reason", "file"]).left(2);
        for f in self.files.iter().take(SHOWN) {
            t.row([human(f.bytes), f.reason.clone(), f.path.clone()]);
        }
        let mut s = t.render();
        if self.files.len() > SHOWN {
            s.push_str(&format!("  {} more: see --json\n", self.files.len() - SHOWN));
        }
        Some(s)
    }
}
