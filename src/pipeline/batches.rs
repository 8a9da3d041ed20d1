//! The plan between the plan phase and the share phase: its batches (see
//! [`crate::plan::from_db`]) kept in memory up to [`MEM_RANGES`] ranges,
//! the rest in an unnamed temporary file (40 bytes a range; `O_TMPFILE`,
//! never visible, gone when the run ends however it ends), so that a plan
//! over ten million files does not have to fit in memory. Where no
//! temporary file can be made, or it cannot take a batch (its filesystem
//! full: `/var/tmp` is often the root filesystem, not the volume being
//! shared), the batches from there on stay in memory and the run goes on;
//! each batch is flushed whole, so those already in the file are intact.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, Write};

use crate::file::FileId;
use crate::plan::{Plan, Range};

/// Ranges held in memory (40 bytes each: 40 MiB); later batches go to the
/// temporary file.
pub const MEM_RANGES: usize = 1 << 20;

/// The batches of one plan: those held in memory, then those in the file.
pub struct Batches {
    mem: Vec<Plan>,
    held: usize,
    /// The temporary file and the number of ranges of each batch in it.
    spilled: Option<(BufWriter<File>, Vec<usize>)>,
    limit: Option<usize>,
    /// Makes the temporary file ([`crate::sys::spill::spill_file`]).
    make: fn() -> io::Result<File>,
}

impl Default for Batches {
    fn default() -> Batches {
        Batches { mem: Vec::new(), held: 0, spilled: None, limit: None, make: crate::sys::spill::spill_file }
    }
}

impl Batches {
    /// Batches held in memory up to `limit` ranges (default [`MEM_RANGES`]).
    pub fn with_limit(limit: usize) -> Batches {
        Batches { limit: Some(limit), ..Default::default() }
    }

    /// Batches for a run's `limits`: with the tests' tiny limits, the
    /// temporary file is used from a few ranges on.
    pub fn for_limits(limits: &crate::plan::Limits) -> Batches {
        if limits.is_tiny() {
            Batches::with_limit(limits.batch_files as usize)
        } else {
            Batches::default()
        }
    }

    /// Memory it is from now on: no temporary file, or no room in it.
    fn keep(&mut self, plan: Plan) {
        self.limit = Some(usize::MAX);
        self.held += plan.ranges.len();
        self.mem.push(plan);
    }

    /// Keep one batch.
    pub fn push(&mut self, plan: Plan) -> io::Result<()> {
        if self.held + plan.ranges.len() <= self.limit.unwrap_or(MEM_RANGES) {
            self.held += plan.ranges.len();
            self.mem.push(plan);
            return Ok(());
        }
        if self.spilled.is_none() {
            match (self.make)() {
                Ok(f) => self.spilled = Some((BufWriter::new(f), Vec::new())),
                // No temporary file: memory it is (the plan is as large
                // as it was before batches).
                Err(_) => {
                    self.keep(plan);
                    return Ok(());
                }
            }
        }
        let (w, counts) = self.spilled.as_mut().expect("just made");
        let written = (plan.ranges.iter())
            .flat_map(|r| [r.src.0 as u64, r.src_off, r.len, r.dest.0 as u64, r.dest_off])
            .try_for_each(|v| w.write_all(&v.to_le_bytes()))
            .and_then(|()| w.flush());
        match written {
            Ok(()) => counts.push(plan.ranges.len()),
            Err(_) => {
                // No room left in the file: the batches in it were flushed
                // whole, and what this one left behind them is never read
                // (`counts`). Whatever is still buffered is dropped, not
                // written when the file is read back.
                let (w, counts) = self.spilled.take().expect("just used");
                let (file, _) = w.into_parts();
                self.spilled = Some((BufWriter::new(file), counts));
                self.keep(plan);
            }
        }
        Ok(())
    }

    /// Call `f` on every batch, those held in memory first; stops at the
    /// first `false`.
    pub fn for_each(self, mut f: impl FnMut(&Plan) -> anyhow::Result<bool>) -> anyhow::Result<()> {
        for p in &self.mem {
            if !f(p)? {
                return Ok(());
            }
        }
        drop(self.mem);
        let Some((w, counts)) = self.spilled else { return Ok(()) };
        let mut file = w.into_inner().map_err(|e| e.into_error())?;
        file.rewind()?;
        let mut r = BufReader::new(file);
        let mut word = || -> io::Result<u64> {
            let mut b = [0u8; 8];
            r.read_exact(&mut b)?;
            Ok(u64::from_le_bytes(b))
        };
        for n in counts {
            let mut plan = Plan::default();
            for _ in 0..n {
                let (src, src_off, len, dest, dest_off) = (word()?, word()?, word()?, word()?, word()?);
                plan.ranges.push(Range { src: FileId(src as i64), src_off, len, dest: FileId(dest as i64), dest_off });
            }
            if !f(&plan)? {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(k: i64, n: u64) -> Plan {
        let ranges = (0..n)
            .map(|i| Range { src: FileId(k), src_off: i * 4096, len: 4096 + i, dest: FileId(k + 1), dest_off: i })
            .collect();
        Plan { ranges }
    }

    /// Every batch, as `for_each` hands them back, sorted.
    fn all(b: Batches) -> Vec<Plan> {
        let mut got = Vec::new();
        b.for_each(|p| {
            got.push(p.clone());
            Ok(true)
        })
        .unwrap();
        got.sort_by_key(|p| p.ranges[0]);
        got
    }

    #[test]
    fn a_full_or_missing_temporary_file_keeps_the_batches_in_memory() {
        let want: Vec<Plan> = vec![batch(1, 3), batch(3, 400), batch(5, 1), batch(7, 2)];
        let full = || File::options().write(true).read(true).open("/dev/full");
        let none = || Err(io::Error::other("no room"));
        for make in [full as fn() -> io::Result<File>, none] {
            let mut b = Batches { make, ..Batches::with_limit(5) };
            for p in &want {
                b.push(p.clone()).unwrap();
            }
            assert_eq!(b.mem.len(), 4);
            assert_eq!(all(b), want);
        }
    }

    #[test]
    fn batches_come_back_in_order_from_memory_and_from_the_file() {
        let mut b = Batches::with_limit(5);
        let want: Vec<Plan> = vec![batch(1, 3), batch(3, 4), batch(5, 1), batch(7, 2)];
        for p in &want {
            b.push(p.clone()).unwrap();
        }
        // 3 fit in memory; 4 do not (spilled), then 1 fits, then 2 do not.
        assert_eq!((b.mem.len(), b.spilled.as_ref().map(|s| s.1.len())), (2, Some(2)));
        let mut got = Vec::new();
        b.for_each(|p| {
            got.push(p.clone());
            Ok(true)
        })
        .unwrap();
        let mut want = want;
        for v in [&mut got, &mut want] {
            v.sort_by_key(|p| p.ranges[0]);
        }
        assert_eq!(got, want);
    }
}
