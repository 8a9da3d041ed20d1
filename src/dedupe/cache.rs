//! What a share worker keeps between ranges: the files it opened and
//! checked, and each one's extent map.
//!
//! A file is in many ranges (an image holding hundreds of small runs, a
//! tree file that is the source of several): opening it below the starting
//! paths for each range (`openat2` of every path component, then `close`)
//! and mapping each range with its own FIEMAP (on btrfs a back-reference
//! walk per extent) cost about as much CPU as the share requests
//! themselves on the SMALL corpus. So each worker keeps its open files (at
//! most [`MAX_FILES`]) and re-checks the identity (device, inode, size,
//! mtime, ctime) on the kept descriptor before every use, exactly as after a
//! fresh open. Each kept file is mapped once over a window (up to
//! [`WINDOW`] bytes of the span the plan uses in it) and the ranges are cut
//! from that map.
//!
//! The map is not refreshed after this run shares into the file: it only
//! decides what is submitted. A block the map says is unshared while it
//! now is shared is submitted again and the kernel, which compares every
//! byte under its locks, shares it again (nothing lost, nothing freed
//! twice). One planned destination range is shared by one request, so the
//! blocks of a destination a request changes are never asked about again;
//! a source's blocks are roots of the plan, never a destination, so their
//! addresses do not move (except a source swapped with its copy, which the
//! plan then uses nowhere else). An extent seen unshared stays free of
//! references from outside the plan for the same reason as
//! [`super::workers::WorkerContext::seen_solo`].

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::rc::Rc;

use nix::errno::Errno;

use super::executor::Executor;
use super::extents::Mapped;
use super::workers::locked;
use crate::display::display_path;
use crate::file::FileId;
use crate::plan::Range;
use crate::sys::dedupe::MAX_REQUEST_LEN;
use crate::sys::fiemap::physical_map;
use crate::sys::{self, Extent};

/// Most files a worker keeps open. With up to [`super::workers::MAX_WORKERS`]
/// workers, each also holding up to one request's destinations
/// ([`sys::dedupe::MAX_DESTS`]) that were pushed out meanwhile, this stays
/// well under the usual limit of 1024 descriptors.
pub(super) const MAX_FILES: usize = 64;

/// A file is mapped in windows of this many bytes (aligned), clipped to the
/// span of the file the plan uses: one FIEMAP per window, and at most
/// 16,384 extents of 4 KiB per map held.
const WINDOW: u64 = 64 << 20;

/// Destinations of the next group a worker opens early to read them
/// ahead: a bound on the descriptors this holds.
const AHEAD_DESTS: usize = 16;

/// Most extents a worker keeps mapped in all (8 MiB): beyond this the
/// least recently used maps are dropped.
const MAX_EXTENTS: usize = 1 << 18;

/// A worker's open, checked files and their maps.
#[derive(Default)]
pub(super) struct FileCache {
    entries: HashMap<FileId, Entry>,
    /// Use counter, for least-recently-used eviction.
    tick: u64,
    /// Extents held in all windows.
    extents: usize,
    /// Destinations of the next group, opened early to read ahead (see
    /// [`Executor::read_ahead`]); not checked yet.
    ahead: HashMap<FileId, Rc<File>>,
}

/// One kept file.
struct Entry {
    file: Rc<File>,
    window: Option<Window>,
    used: u64,
}

/// The extents of `[start, end)` of a file, as FIEMAP reported them.
struct Window {
    start: u64,
    end: u64,
    extents: Vec<Extent>,
}

impl FileCache {
    /// Forget file `id` (found changed or unusable).
    fn forget(&mut self, id: FileId) {
        if let Some(e) = self.entries.remove(&id) {
            self.extents -= e.window.map_or(0, |w| w.extents.len());
        }
    }

    /// Keep at most [`MAX_FILES`] files and [`MAX_EXTENTS`] extents,
    /// dropping the least recently used first.
    fn trim(&mut self) {
        while self.entries.len() > MAX_FILES {
            let Some(&id) = self.entries.iter().min_by_key(|(_, e)| e.used).map(|(id, _)| id) else { break };
            self.forget(id);
        }
        while self.extents > MAX_EXTENTS {
            let oldest = self.entries.values_mut().filter(|e| e.window.is_some()).min_by_key(|e| e.used);
            let Some(w) = oldest.and_then(|e| e.window.take()) else { break };
            self.extents -= w.extents.len();
        }
    }
}

/// The window to map for `[off, off+len)` of a file whose planned ranges
/// lie in `span`: [`WINDOW`]-aligned, clipped to the span, always covering
/// the range.
fn window_for(span: Option<(u64, u64)>, off: u64, len: u64) -> (u64, u64) {
    let (lo, hi) = span.unwrap_or((off, off + len));
    let start = lo.max(off - off % WINDOW).min(off);
    let end = hi.min(start + WINDOW).max(off + len);
    (start, end)
}

impl Executor<'_> {
    /// File `id`, open below the starting paths and still as scanned: the
    /// kept descriptor (its identity checked again now) or a new one.
    pub(super) fn file(&mut self, id: FileId) -> Option<Rc<File>> {
        if locked(&self.ctx.bad).contains(&id) {
            self.cache.forget(id);
            return None;
        }
        self.cache.tick += 1;
        let tick = self.cache.tick;
        // Only a file the plan uses more than once is kept.
        if let Some(e) = self.cache.entries.get_mut(&id) {
            e.used = tick;
            let f = Rc::clone(&e.file);
            if self.unchanged(id, &f) {
                return Some(f);
            }
            self.cache.forget(id);
            return None;
        }
        let f = match self.cache.ahead.remove(&id) {
            // Opened below the starting paths for the read-ahead: checked
            // now, on the descriptor that is used.
            Some(f) => self.unchanged(id, &f).then_some(f)?,
            None => Rc::new(self.open(id)?),
        };
        if !self.ctx.spans.contains_key(&id) {
            return Some(f);
        }
        self.cache.entries.insert(id, Entry { file: Rc::clone(&f), window: None, used: tick });
        self.cache.trim();
        Some(f)
    }

    /// Ask the kernel to read the next group (`next`: one source range and
    /// its destinations) while this one's requests run: the compare inside
    /// `FIDEDUPERANGE` reads a missing page synchronously and does no
    /// read-ahead, so on data that is not cached (larger than memory) the
    /// disk then works on the next request during the current one's compare
    /// instead of after it. The first [`AHEAD_DESTS`] destinations not kept
    /// open are opened below the starting paths for this (and checked when
    /// used, like any other).
    pub(super) fn read_ahead(&mut self, src: &File, next: &[Range]) {
        let Some(first) = next.first() else { return };
        super::executor::prefetch(src, first.src_off, first.len.min(MAX_REQUEST_LEN));
        if self.cache.ahead.len() > AHEAD_DESTS {
            // Left over from destinations that were skipped.
            self.cache.ahead.clear();
        }
        for d in next.iter().take(AHEAD_DESTS) {
            if locked(&self.ctx.bad).contains(&d.dest) || locked(&self.ctx.deferred).contains(&d.dest) {
                continue;
            }
            let f = match self.cache.entries.get(&d.dest) {
                Some(e) => Rc::clone(&e.file),
                None => match self.files.get(&d.dest).map(|c| self.ctx.tree.open_file(&c.path)) {
                    Some(Ok(f)) => Rc::clone(self.cache.ahead.entry(d.dest).or_insert(Rc::new(f))),
                    // Reported when the group runs.
                    _ => continue,
                },
            };
            super::executor::prefetch(&f, d.dest_off, d.len.min(MAX_REQUEST_LEN));
        }
    }

    /// Physical address per block of `[off, off+len)` of file `id` (open as
    /// `file`), cut from the file's kept map (see the module comment), or
    /// `None` for a file whose data is inline in metadata: sharing it frees
    /// nothing, and btrfs would report success every run.
    pub(super) fn map(&mut self, file: &File, id: FileId, off: u64, len: u64) -> Option<Mapped> {
        let end = off + len;
        let covers = |w: &Window| w.start <= off && end <= w.end;
        let hit = self.cache.entries.get(&id).and_then(|e| e.window.as_ref()).is_some_and(covers);
        let mut fetched = None;
        if !hit {
            let (ws, we) = window_for(self.ctx.spans.get(&id).copied(), off, len);
            match sys::fiemap(file.as_fd(), ws, we - ws) {
                Ok(ext) => {
                    self.ctx.note_solo(&ext);
                    fetched = self.keep_window(id, ws, we, ext);
                }
                Err(e) => {
                    if e != Errno::EOPNOTSUPP {
                        let path = self.files.get(&id).map(|c| display_path(&c.path)).unwrap_or_default();
                        self.progress.info(&format!("{path}: fiemap: {e}"));
                    }
                    let blocks = vec![None; len.div_ceil(self.block_size) as usize];
                    return Some(Mapped { blocks, shared: false, extents: Vec::new() });
                }
            }
        }
        let kept = self.cache.entries.get(&id).and_then(|e| e.window.as_ref()).map_or(&[][..], |w| &w.extents[..]);
        let extents = fetched.as_deref().unwrap_or(kept);
        let extents: Vec<Extent> =
            extents.iter().filter(|e| e.logical < end && e.logical + e.length > off).copied().collect();
        if extents.iter().any(|e| e.is_inline()) {
            if locked(&self.ctx.inline).insert(id) {
                self.out.inline_files += 1;
            }
            return None;
        }
        Some(Mapped {
            blocks: physical_map(&extents, off, len, self.block_size),
            shared: extents.iter().any(|e| e.is_shared()),
            extents,
        })
    }

    /// Keep `ext` as the map of `[start, end)` of file `id` if the file is
    /// kept; otherwise hand it back for this one use.
    fn keep_window(&mut self, id: FileId, start: u64, end: u64, ext: Vec<Extent>) -> Option<Vec<Extent>> {
        let c = &mut self.cache;
        // The newest window is never the one dropped to make room: a map
        // too large to keep beside others is used once only.
        let Some(e) = c.entries.get_mut(&id).filter(|_| ext.len() <= MAX_EXTENTS / 4) else { return Some(ext) };
        c.tick += 1;
        e.used = c.tick;
        c.extents += ext.len();
        if let Some(old) = e.window.replace(Window { start, end, extents: ext }) {
            c.extents -= old.extents.len();
        }
        c.trim();
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(used: u64, extents: usize) -> Entry {
        let file = Rc::new(File::open("/dev/null").unwrap());
        let ext = Extent { logical: 0, physical: 0, length: 4096, flags: 0 };
        let window = (extents > 0).then(|| Window { start: 0, end: 4096, extents: vec![ext; extents] });
        Entry { file, window, used }
    }

    #[test]
    fn trim_drops_the_least_recently_used_files_then_maps() {
        let mut c = FileCache::default();
        for k in 0..MAX_FILES as u64 + 3 {
            c.entries.insert(FileId(k as i64), entry(k, 0));
        }
        c.trim();
        assert_eq!(c.entries.len(), MAX_FILES);
        assert!((0..3).all(|k| !c.entries.contains_key(&FileId(k))), "the oldest files go first");
        // Maps over the extent budget: the oldest maps go, the files stay.
        c.entries.clear();
        for k in 0..4 {
            c.entries.insert(FileId(k), entry(k as u64, MAX_EXTENTS / 3));
            c.extents += MAX_EXTENTS / 3;
        }
        c.trim();
        assert_eq!(c.entries.len(), 4);
        assert!(c.entries[&FileId(0)].window.is_none() && c.entries[&FileId(3)].window.is_some());
        assert_eq!(c.extents, 3 * (MAX_EXTENTS / 3));
        c.forget(FileId(3));
        assert_eq!(c.extents, 2 * (MAX_EXTENTS / 3));
    }

    #[test]
    fn windows_cover_the_range_within_the_span() {
        let mb = 1 << 20;
        // No span known: the range itself.
        assert_eq!(window_for(None, 5 * mb, mb), (5 * mb, 6 * mb));
        // A small file: its whole span.
        assert_eq!(window_for(Some((4096, 3 * mb)), mb, 4096), (4096, 3 * mb));
        // A large one: the aligned window holding the range.
        assert_eq!(window_for(Some((0, 1000 * mb)), 100 * mb, mb), (64 * mb, 128 * mb));
        // A range across the window's end is still covered whole.
        assert_eq!(window_for(Some((0, 1000 * mb)), 127 * mb, 2 * mb), (64 * mb, 129 * mb));
    }
}
