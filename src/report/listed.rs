//! `--list`: every planned range, named, for a run's report and for
//! `dedupscan report`.
//!
//! A list is as long as the plan (FULL: 105,939 ranges; a large volume:
//! millions), and each entry names two files. Held in memory with its text
//! table, FULL's `report --list` peaked at 125–131 MB, three times the run
//! itself. So the entries beyond [`MEM_ENTRIES`] go, one JSON line each, to
//! an unnamed temporary file (`O_TMPFILE` in [`crate::sys::spill::spill_dir`]:
//! never visible, gone when the process ends however it ends), and the
//! report streams them out: JSON through serde, text row by row with the
//! column widths measured on the way in. Where no temporary file can be
//! made, the list stays in memory; where the file stops taking entries (its
//! filesystem full), the entries from the last whole flush on stay in
//! memory after it, in order.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Seek, Write};
use std::sync::Arc;

use serde::ser::{Error as _, SerializeSeq};
use serde::{Serialize, Serializer};

use super::{table_line, ListedRange};
use crate::display::human;

/// Entries held in memory (a few hundred bytes each); later ones go to the
/// temporary file.
pub const MEM_ENTRIES: usize = 4096;

/// Entries written to the temporary file between two flushes, and kept in
/// memory until flushed (a full filesystem loses the buffered ones).
const FLUSH_EVERY: usize = 256;

/// Column headers of the text list; the last only when states are known.
const HEAD: [&str; 6] = ["bytes", "source", "offset", "destination", "offset", "state"];

/// Columns aligned to the left besides the first: the two paths.
const LEFT: [usize; 2] = [1, 3];

/// A list being built: [`List::push`] every range in order, then
/// [`List::finish`].
#[derive(Debug)]
pub struct List {
    mem: Vec<ListedRange>,
    spill: Option<BufWriter<File>>,
    /// Entries flushed to the file.
    spilled: u64,
    /// Entries written to the file since its last flush.
    unflushed: Vec<ListedRange>,
    /// Entries after the file stopped taking them.
    tail: Vec<ListedRange>,
    widths: [usize; 6],
    with_state: bool,
    limit: Option<usize>,
    /// Makes the temporary file ([`crate::sys::spill::spill_file`]).
    make: fn() -> io::Result<File>,
}

impl Default for List {
    fn default() -> List {
        List {
            mem: Vec::new(),
            spill: None,
            spilled: 0,
            unflushed: Vec::new(),
            tail: Vec::new(),
            widths: [0; 6],
            with_state: false,
            limit: None,
            make: crate::sys::spill::spill_file,
        }
    }
}

impl List {
    /// A list holding at most `limit` entries in memory (default
    /// [`MEM_ENTRIES`]).
    pub fn with_limit(limit: usize) -> List {
        List { limit: Some(limit), ..List::default() }
    }

    /// The list of a run or report: with the tiny plan limits of the tests
    /// (`DEDUPSCAN_TEST_SMALL_BATCHES`), one entry in memory, so that the
    /// integration tests go through the temporary file too.
    pub fn for_limits(tiny: bool) -> List {
        if tiny {
            List::with_limit(1)
        } else {
            List::default()
        }
    }

    /// Add the next range.
    pub fn push(&mut self, r: ListedRange) -> io::Result<()> {
        for (w, cell) in self.widths.iter_mut().zip(cells(&r)) {
            *w = (*w).max(cell.chars().count());
        }
        self.with_state |= r.state.is_some();
        if self.spill.is_none() && self.mem.len() < self.limit.unwrap_or(MEM_ENTRIES) {
            self.mem.push(r);
            return Ok(());
        }
        if !self.tail.is_empty() {
            self.tail.push(r);
            return Ok(());
        }
        if self.spill.is_none() {
            match (self.make)() {
                Ok(f) => self.spill = Some(BufWriter::new(f)),
                Err(_) => {
                    // No room for a temporary file: memory it is.
                    self.limit = Some(usize::MAX);
                    self.mem.push(r);
                    return Ok(());
                }
            }
        }
        let w = self.spill.as_mut().expect("just made");
        let written = serde_json::to_writer(&mut *w, &r).map_err(io::Error::from).and_then(|()| w.write_all(b"\n"));
        self.unflushed.push(r);
        if written.is_err() || self.unflushed.len() >= FLUSH_EVERY {
            self.flush();
        }
        Ok(())
    }

    /// Flush the file; where it cannot take what was written since its
    /// last flush, those entries and all later ones stay in memory (`tail`),
    /// and what the buffer held is dropped (never read: [`Listed`] reads
    /// `spilled` lines).
    fn flush(&mut self) {
        let Some(w) = self.spill.as_mut() else { return };
        if self.tail.is_empty() && w.flush().is_ok() {
            self.spilled += self.unflushed.len() as u64;
            self.unflushed.clear();
            return;
        }
        let w = self.spill.take().expect("checked");
        self.spill = Some(BufWriter::new(w.into_parts().0));
        self.tail.append(&mut self.unflushed);
    }

    /// The list, ready to be read (as often as wanted).
    pub fn finish(mut self) -> io::Result<Listed> {
        self.flush();
        let file = match self.spill {
            Some(w) => Some(Arc::new(w.into_inner().map_err(|e| e.into_error())?)),
            None => None,
        };
        Ok(Listed {
            mem: Arc::new(self.mem),
            file,
            spilled: self.spilled,
            tail: Arc::new(self.tail),
            widths: self.widths,
            with_state: self.with_state,
        })
    }
}

/// A finished list: what [`List`] gathered. Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct Listed {
    mem: Arc<Vec<ListedRange>>,
    file: Option<Arc<File>>,
    spilled: u64,
    tail: Arc<Vec<ListedRange>>,
    widths: [usize; 6],
    with_state: bool,
}

impl Listed {
    /// Number of ranges.
    pub fn len(&self) -> u64 {
        (self.mem.len() + self.tail.len()) as u64 + self.spilled
    }

    /// True for a list of no range.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Call `f` on every range, in order.
    pub fn for_each(&self, mut f: impl FnMut(&ListedRange) -> io::Result<()>) -> io::Result<()> {
        self.mem.iter().try_for_each(&mut f)?;
        if let Some(file) = &self.file {
            let mut file: &File = file;
            file.rewind()?;
            for line in BufReader::new(file).lines().take(self.spilled as usize) {
                f(&serde_json::from_str(&line?)?)?;
            }
        }
        self.tail.iter().try_for_each(&mut f)
    }

    /// Every range, read back into memory (tests).
    pub fn to_vec(&self) -> io::Result<Vec<ListedRange>> {
        let mut out = Vec::new();
        self.for_each(|r| {
            out.push(r.clone());
            Ok(())
        })?;
        Ok(out)
    }

    /// The list as text: a count, then a table, one row per range.
    pub fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        let cols = if self.with_state { 6 } else { 5 };
        let widths: Vec<usize> = (self.widths.iter().zip(HEAD)).take(cols).map(|(&w, h)| w.max(h.len())).collect();
        writeln!(w, "{} ranges:", self.len())?;
        w.write_all(table_line(&HEAD[..cols], &widths, &LEFT).as_bytes())?;
        self.for_each(|r| w.write_all(table_line(&cells(r)[..cols], &widths, &LEFT).as_bytes()))
    }
}

/// The cells of one range's text row.
fn cells(r: &ListedRange) -> [String; 6] {
    [
        human(r.bytes),
        r.source.clone(),
        r.source_offset.to_string(),
        r.destination.clone(),
        r.destination_offset.to_string(),
        r.state.as_deref().unwrap_or("").replace('_', " "),
    ]
}

/// A JSON array of the ranges, read as it is written.
impl Serialize for Listed {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.len() as usize))?;
        let mut failed = None;
        let read = self.for_each(|r| {
            seq.serialize_element(r).map_err(|e| {
                failed = Some(e);
                io::Error::other("serializing")
            })
        });
        if let Some(e) = failed {
            return Err(e);
        }
        read.map_err(|e| S::Error::custom(format!("reading the list of ranges back: {e}")))?;
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(i: u64, state: Option<&str>) -> ListedRange {
        ListedRange {
            source: format!("/v/a{i}"),
            source_offset: i * 4096,
            destination: format!("/v/much/longer/b{i}"),
            destination_offset: i,
            bytes: 4096 * (i + 1),
            state: state.map(str::to_owned),
            unshared_bytes: state.map(|_| i),
        }
    }

    fn list(n: u64, limit: usize, state: Option<&str>) -> Listed {
        let mut l = List::with_limit(limit);
        (0..n).for_each(|i| l.push(range(i, state)).unwrap());
        l.finish().unwrap()
    }

    #[test]
    fn a_list_reads_back_the_same_from_memory_and_from_the_file() {
        let (mem, spilled) = (list(10, 100, Some("partly_shared")), list(10, 3, Some("partly_shared")));
        assert!(mem.file.is_none() && spilled.file.is_some());
        assert_eq!((mem.len(), spilled.len()), (10, 10));
        let want: Vec<ListedRange> = (0..10).map(|i| range(i, Some("partly_shared"))).collect();
        assert_eq!(mem.to_vec().unwrap(), want);
        assert_eq!(spilled.to_vec().unwrap(), want);
        // Read twice (text, then JSON), the same both times.
        let json = serde_json::to_value(&spilled).unwrap();
        assert_eq!(json, serde_json::to_value(&want).unwrap());
        assert_eq!(serde_json::to_value(&spilled).unwrap(), json);
        let text = |l: &Listed| {
            let mut out = Vec::new();
            l.write_text(&mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert_eq!(text(&mem), text(&spilled));
        assert_eq!(serde_json::to_value(list(0, 3, None)).unwrap(), serde_json::json!([]));
    }

    #[test]
    fn a_full_temporary_file_keeps_the_rest_of_the_list_in_memory_in_order() {
        let want: Vec<ListedRange> = (0..1000).map(|i| range(i, None)).collect();
        let full = || File::options().write(true).read(true).open("/dev/full");
        let none = || Err(io::Error::other("no room"));
        for make in [full as fn() -> io::Result<File>, none] {
            let mut l = List { make, ..List::with_limit(3) };
            want.iter().for_each(|r| l.push(r.clone()).unwrap());
            let listed = l.finish().unwrap();
            assert_eq!(listed.len(), 1000);
            assert_eq!(listed.to_vec().unwrap(), want);
        }
    }

    #[test]
    fn the_text_list_is_the_table_it_was() {
        let mut t = super::super::Table::new(&HEAD[..5]).left(1).left(3);
        for i in [0, 7, 12] {
            let c = cells(&range(i, None));
            t.row(c[..5].to_vec());
        }
        let mut out = Vec::new();
        let mut l = List::with_limit(1);
        [0, 7, 12].into_iter().for_each(|i| l.push(range(i, None)).unwrap());
        l.finish().unwrap().write_text(&mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), format!("3 ranges:\n{}", t.render()));
        let text = {
            let mut out = Vec::new();
            list(2, 1, Some("shared")).write_text(&mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert!(text.lines().nth(1).unwrap().ends_with("state") && text.lines().nth(2).unwrap().ends_with("shared"));
    }
}
