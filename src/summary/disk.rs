//! Space on disk of the known files, measured with FIEMAP (metadata only).

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use crate::db::Db;
use crate::file::FileFacts;
use crate::progress::Progress;

/// Space of the known files on disk: the union of the physical byte
/// intervals their extents cover, so a block shared by many files counts
/// once. Inline data lives in metadata and counts by its length. Also
/// returns the sum of `st_blocks` (what `du` would add up). The files come
/// from the database [`CHUNK`] at a time and their extents are merged into
/// a coalesced list after each chunk: memory follows the number of separate
/// physical runs, not the number of files. `dirs` are the directories of
/// the known files (for the mounts to open them below).
pub(super) fn disk_usage(db: &Db, dirs: Vec<PathBuf>, progress: &dyn Progress) -> rusqlite::Result<(u64, u64)> {
    progress.phase("report: measuring files", Some(db.file_totals()?.0), false);
    // Opened below the top of their mount, never through a symlink (see
    // dedupe::range_states). `over_mounts` wants files: name one per dir.
    let probes: Vec<PathBuf> = dirs.into_iter().map(|d| d.join("f")).collect();
    let tree = crate::sys::beneath::Tree::over_mounts(probes.iter().map(|p| p.as_path()));
    drop(probes);
    let mut acc = Acc::default();
    db.for_each_facts(CHUNK, |files| {
        let part = measure_files(&tree, &files, progress);
        acc.allocated += part.allocated;
        acc.inline += part.inline;
        acc.spans.extend(part.spans);
        acc.spans = coalesce(std::mem::take(&mut acc.spans));
    })?;
    let (allocated, inline, spans) = (acc.allocated, acc.inline, acc.spans);
    let total: u64 = spans.iter().map(|(s, e)| e - s).sum();
    progress.finish_phase("");
    Ok((total + inline, allocated))
}

/// Files measured per pass of [`disk_usage`].
const CHUNK: usize = 65_536;

/// Extents a thread keeps before it merges them ([`coalesce`]): 16 MB.
/// Copies and clones merge into few intervals; a file of millions of
/// extents no longer takes a list of them whole.
const MAX_SPANS: usize = 1 << 20;

/// What [`disk_usage`] adds up.
#[derive(Default)]
struct Acc {
    allocated: u64,
    inline: u64,
    spans: Vec<(u64, u64)>,
    /// Merge `spans` when they reach this many (or [`MAX_SPANS`]).
    merge_at: usize,
    /// This thread's volume keys by `st_dev`.
    keys: crate::sys::SubvolIds,
}

/// One open, fstat and FIEMAP per file, on every CPU (metadata only).
fn measure_files(tree: &crate::sys::beneath::Tree, files: &[FileFacts], progress: &dyn Progress) -> Acc {
    use rayon::prelude::*;
    use std::os::fd::AsFd;
    files
        .par_iter()
        .fold(Acc::default, |mut acc, c| {
            progress.inc(1);
            let Ok(f) = tree.open_file(&c.path) else { return acc };
            let Ok(m) = f.metadata() else { return acc };
            if !c.is_same_inode(&f, &m, &mut acc.keys) {
                return acc;
            }
            acc.allocated += m.blocks() * 512;
            let _ = crate::sys::fiemap::fiemap_each(f.as_fd(), 0, m.size().max(1), |e| {
                if e.is_inline() {
                    acc.inline += e.length;
                } else if e.has_address() && e.length > 0 {
                    acc.spans.push((e.physical, e.physical + e.length));
                    if acc.spans.len() >= acc.merge_at.max(MAX_SPANS) {
                        // A file of millions of extents: merged as it goes,
                        // again once the list doubled (distinct extents do
                        // not merge: no merging on every one of them).
                        acc.spans = coalesce(std::mem::take(&mut acc.spans));
                        acc.merge_at = 2 * acc.spans.len();
                    }
                }
                true
            });
            acc
        })
        .reduce(Acc::default, |mut a, mut b| {
            a.allocated += b.allocated;
            a.inline += b.inline;
            a.spans.append(&mut b.spans);
            a
        })
}

/// `spans` sorted, overlapping and touching intervals merged.
fn coalesce(mut spans: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    spans.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
    for (s, e) in spans {
        match out.last_mut() {
            Some((_, ce)) if s <= *ce => *ce = (*ce).max(e),
            _ => out.push((s, e)),
        }
    }
    out.shrink_to_fit();
    out
}
