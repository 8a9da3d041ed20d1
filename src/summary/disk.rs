//! Space on disk of the known files, measured with FIEMAP (metadata only).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;

use crate::file::{FileFacts, FileId};
use crate::progress::Progress;

/// Space of `files` on disk: the union of the physical byte intervals their
/// extents cover, so a block shared by many files counts once. Inline data
/// lives in metadata and counts by its length. Also returns the sum of
/// `st_blocks` (what `du` would add up).
pub(super) fn disk_usage(files: &HashMap<FileId, FileFacts>, progress: &dyn Progress) -> (u64, u64) {
    use rayon::prelude::*;
    use std::os::fd::AsFd;
    progress.phase("report: measuring files", Some(files.len() as u64), false);
    // Opened below the top of their mount, never through a symlink (see
    // dedupe::range_states).
    let tree = crate::sys::beneath::Tree::over_mounts(files.values().map(|c| c.path.as_path()));
    // One open, fstat and FIEMAP per file, on every CPU (metadata only).
    #[derive(Default)]
    struct Acc {
        allocated: u64,
        inline: u64,
        spans: Vec<(u64, u64)>,
    }
    let acc = files
        .par_iter()
        .fold(Acc::default, |mut acc, (_, c)| {
            progress.inc(1);
            let Ok(f) = tree.open_file(&c.path) else { return acc };
            let Ok(m) = f.metadata() else { return acc };
            // `c.key.volume` is the volume key (btrfs subvolume id), not `st_dev`.
            if m.ino() != c.key.ino || crate::sys::volume_key(f.as_fd()).ok() != Some(c.key.volume) {
                return acc;
            }
            acc.allocated += m.blocks() * 512;
            let Ok(extents) = crate::sys::fiemap(f.as_fd(), 0, m.size().max(1)) else { return acc };
            for e in extents {
                if e.is_inline() {
                    acc.inline += e.length;
                } else if e.has_address() && e.length > 0 {
                    acc.spans.push((e.physical, e.physical + e.length));
                }
            }
            acc
        })
        .reduce(Acc::default, |mut a, mut b| {
            a.allocated += b.allocated;
            a.inline += b.inline;
            a.spans.append(&mut b.spans);
            a
        });
    let (allocated, inline, mut spans) = (acc.allocated, acc.inline, acc.spans);
    spans.sort_unstable();
    let (mut total, mut cur): (u64, Option<(u64, u64)>) = (0, None);
    for (s, e) in spans {
        match &mut cur {
            Some((_, ce)) if s <= *ce => *ce = (*ce).max(e),
            _ => {
                if let Some((cs, ce)) = cur {
                    total += ce - cs;
                }
                cur = Some((s, e));
            }
        }
    }
    if let Some((cs, ce)) = cur {
        total += ce - cs;
    }
    progress.finish_phase("");
    (total + inline, allocated)
}
