//! The first grouping's slices written out: one pass over the block maps
//! for many slices of the fingerprint space instead of one pass each.
//!
//! Grouping holds at most [`super::group::GROUP_BUDGET`] blocks at once,
//! so a volume of N blocks takes N / 4 Mi slices, and reading every map
//! once per slice made the plan's first grouping grow with the square of
//! the volume: 16 passes over 64 Mi blocks (256 GiB of data) took 8.4 s,
//! and 1 TiB would take 64 passes, 10 TiB 640 (hours, and the database
//! read from disk as many times when it does not fit in the page cache).
//! One pass now writes each slice's blocks to its own unnamed temporary
//! file (`$TMPDIR`, else `/var/tmp`; up to [`OPEN_SLICES`] files at once),
//! and each slice is read back
//! and grouped as if its pass had taken it in: the same blocks of the same
//! files in the same order, so the same groups. A block is written as its
//! fingerprint, its file's id and its file's mark ([`super::links::mark`]),
//! 13 bytes, without its index in the file: this grouping only links files
//! into components (the batches group their own blocks again,
//! `from_db::Batcher::regroup`), so only which files hold a fingerprint, how
//! often, and whether they are small matters here. Where no temporary file can
//! be made or written (a full disk), the slices left are grouped with one
//! pass each, as before.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, Write};
use std::ops::Range;

use rustc_hash::FxHashSet;

use super::group::{blocks_to_group, Member, SliceGrouper};
use super::links::mark;
use crate::blockmap::Fp;
use crate::file::FileId;

/// Slices written out by one pass over the maps (temporary files open at
/// once, 8 KiB of buffer each). A slice file holds up to 4 Mi blocks, 52
/// MiB, and each is gone once read back, so a pass takes at most 3.3 GiB
/// of temporary disk: 1 TiB of 4 KiB blocks (64 slices) takes one pass, 10
/// TiB ten, where they took 640.
pub const OPEN_SLICES: u32 = 64;

/// Fingerprint, file id (48 bits each, little-endian), the file's mark.
const RECORD: usize = 13;

/// The blocks of slices `range` (of `slices`) on their way to their files.
pub struct SliceFiles<'k> {
    range: Range<u32>,
    slices: u32,
    keys: Option<&'k FxHashSet<Fp>>,
    files: Vec<BufWriter<File>>,
    /// Blocks of each slice left out as already shared.
    skipped: Vec<u64>,
    /// The first write error: the files are then given up.
    error: Option<io::Error>,
}

impl<'k> SliceFiles<'k> {
    /// One file per slice of `range`, each from `make` (in a run,
    /// [`crate::sys::spill::spill_file`]); with `keys`, only blocks whose
    /// fingerprint is one of them.
    pub fn create(
        range: Range<u32>,
        slices: u32,
        keys: Option<&'k FxHashSet<Fp>>,
        mut make: impl FnMut() -> io::Result<File>,
    ) -> io::Result<SliceFiles<'k>> {
        let files = range.clone().map(|_| make().map(BufWriter::new)).collect::<io::Result<_>>()?;
        Ok(SliceFiles { skipped: vec![0; range.len()], range, slices, keys, files, error: None })
    }

    /// Write out the blocks of file `id` (encoded map) that fall in the
    /// slices, but those in `skip`, as [`SliceGrouper::add_as`] takes them
    /// in for linking.
    pub fn add(&mut self, id: FileId, map: &[u8], skip: &[(u64, u64)]) {
        // An id that does not fit a group member would be left out of
        // every group anyway.
        if self.error.is_some() || Member::new(id, 0).is_none() {
            return;
        }
        let (range, slices) = (self.range.clone(), self.slices as Fp);
        let in_range = |fp: Fp| range.contains(&((fp % slices) as u32));
        let mark = mark(map) as u8;
        for (_, fp, left_out) in blocks_to_group(map, skip, self.keys, in_range) {
            let slice = ((fp % slices) as u32 - self.range.start) as usize;
            if left_out {
                self.skipped[slice] += 1;
                continue;
            }
            let mut rec = [0u8; RECORD];
            for (i, v) in [fp, id.0 as u64].into_iter().enumerate() {
                rec[i * 6..i * 6 + 6].copy_from_slice(&v.to_le_bytes()[..6]);
            }
            rec[12] = mark;
            if let Err(e) = self.files[slice].write_all(&rec) {
                self.error = Some(e);
                return;
            }
        }
    }

    /// The slices' files, rewound, in slice order, each with how many of
    /// its blocks were left out as already shared; the first error if any
    /// write failed.
    pub fn finish(self) -> io::Result<Vec<(File, u64)>> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let mut files = Vec::with_capacity(self.files.len());
        for w in self.files {
            let mut f = w.into_inner().map_err(|e| e.into_error())?;
            f.rewind()?;
            files.push(f);
        }
        Ok(files.into_iter().zip(self.skipped).collect())
    }
}

/// Read one slice's file back into `into`, block by block in the order it
/// was written, each as its file's mark.
pub fn read_slice(file: File, into: &mut SliceGrouper) -> io::Result<()> {
    into.reserve((file.metadata()?.len() / RECORD as u64) as usize);
    let mut r = BufReader::with_capacity(64 << 10, file);
    let mut rec = [0u8; RECORD];
    let field = |rec: &[u8; RECORD], i: usize| {
        let mut v = [0u8; 8];
        v[..6].copy_from_slice(&rec[i * 6..i * 6 + 6]);
        u64::from_le_bytes(v)
    };
    loop {
        match r.read_exact(&mut rec) {
            Ok(()) => into.add_one(FileId(field(&rec, 1) as i64), field(&rec, 0) as Fp, rec[12] as u64),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::group::BlockGroups;

    fn maps() -> Vec<(FileId, Vec<u8>)> {
        let mut rng = crate::corpus::Rng::new(3);
        let common: Vec<u64> = (0..300).map(|_| rng.next_u64() | 1).collect();
        (1..=6)
            .map(|i| {
                let mut fps: Vec<u64> = (0..200).map(|_| rng.next_u64() | 1).collect();
                // Every file shares a different part of `common`, some of
                // it twice over, and has a hole.
                fps[10..60].copy_from_slice(&common[i * 20..i * 20 + 50]);
                fps[100..110].copy_from_slice(&common[0..10]);
                fps[150..160].fill(0);
                // Every second file's first block is one more's later one;
                // the last file is small.
                fps[i % 2 * 190] = common[299];
                fps.truncate(if i == 6 { 60 } else { 200 });
                (FileId(i as i64 * 7), crate::blockmap::BlockMap::from_fps(&fps).into_bytes())
            })
            .collect()
    }

    fn skip(id: FileId) -> Vec<(u64, u64)> {
        if id.0 == 14 {
            vec![(12, 20), (105, 300)]
        } else {
            Vec::new()
        }
    }

    /// Every slice grouped by passes over the maps, as without files.
    fn by_passes(maps: &[(FileId, Vec<u8>)], slices: u32) -> (BlockGroups, u64) {
        let (mut out, mut skipped) = (BlockGroups::default(), 0);
        for slice in 0..slices {
            let mut g = SliceGrouper::new(slice, slices, None);
            maps.iter().for_each(|(id, m)| g.add_as(*id, m, &skip(*id), |_| mark(m)));
            skipped += g.finish(&mut out);
        }
        (out, skipped)
    }

    /// Each group's members (what linking takes).
    fn files(g: &BlockGroups) -> Vec<Vec<(FileId, u64)>> {
        g.iter().map(|g| g.iter().map(|m| m.pair()).collect()).collect()
    }

    #[test]
    fn slices_written_out_group_as_passes_do() {
        let maps = maps();
        for (slices, open) in [(1, 1), (5, 5), (7, 3), (16, 256)] {
            let (mut out, mut skipped) = (BlockGroups::default(), 0);
            let mut first = 0;
            while first < slices {
                let range = first..(first + open).min(slices);
                let mut files = SliceFiles::create(range.clone(), slices, None, tempfile::tempfile).unwrap();
                maps.iter().for_each(|(id, m)| files.add(*id, m, &skip(*id)));
                for (slice, (f, left_out)) in range.clone().zip(files.finish().unwrap()) {
                    let mut g = SliceGrouper::new(slice, slices, None);
                    read_slice(f, &mut g).unwrap();
                    g.add_skipped(left_out);
                    skipped += g.finish(&mut out);
                }
                first = range.end;
            }
            let (want, want_skipped) = by_passes(&maps, slices);
            assert!(want.len() > 50, "{} groups", want.len());
            assert_eq!(files(&out), files(&want), "{slices} slices, {open} open");
            assert_eq!(skipped, want_skipped);
            assert!(skipped > 0);
        }
    }

    #[test]
    fn a_file_that_cannot_be_made_or_written_is_an_error() {
        let none = || Err(io::Error::other("no room"));
        assert!(SliceFiles::create(0..4, 4, None, none).is_err());
        let full = || File::options().write(true).open("/dev/full");
        let mut files = SliceFiles::create(0..4, 4, None, full).unwrap();
        // More than the buffer holds, so that a write reaches the file.
        for (id, m) in maps() {
            for _ in 0..20 {
                files.add(id, &m, &[]);
            }
        }
        assert!(files.finish().is_err());
    }
}
