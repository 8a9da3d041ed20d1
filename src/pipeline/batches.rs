//! The plan between the plan phase and the share phase: its batches (see
//! [`crate::plan::from_db`]) kept in memory up to [`MEM_RANGES`] ranges,
//! the rest in an unnamed temporary file (40 bytes a range; `O_TMPFILE`,
//! never visible, gone when the run ends however it ends), so that a plan
//! over ten million files does not have to fit in memory. Where no
//! temporary file can be made, the batches stay in memory.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, Write};

use crate::file::FileId;
use crate::plan::{Plan, Range};

/// Ranges held in memory (40 bytes each: 40 MiB); later batches go to the
/// temporary file.
pub const MEM_RANGES: usize = 1 << 20;

/// The batches of one plan, in the order they were planned.
#[derive(Default)]
pub struct Batches {
    mem: Vec<Plan>,
    held: usize,
    /// The temporary file and the number of ranges of each batch in it.
    spilled: Option<(BufWriter<File>, Vec<usize>)>,
    limit: Option<usize>,
}

impl Batches {
    /// Batches held in memory up to `limit` ranges (default [`MEM_RANGES`]).
    pub fn with_limit(limit: usize) -> Batches {
        Batches { limit: Some(limit), ..Default::default() }
    }

    /// Keep one batch.
    pub fn push(&mut self, plan: Plan) -> io::Result<()> {
        if self.held + plan.ranges.len() <= self.limit.unwrap_or(MEM_RANGES) {
            self.held += plan.ranges.len();
            self.mem.push(plan);
            return Ok(());
        }
        if self.spilled.is_none() {
            match crate::sys::spill::spill_file() {
                Ok(f) => self.spilled = Some((BufWriter::new(f), Vec::new())),
                Err(_) => {
                    // No room for a temporary file: memory it is (the
                    // plan is as large as it was before batches).
                    self.limit = Some(usize::MAX);
                    return self.push(plan);
                }
            }
        }
        let (w, counts) = self.spilled.as_mut().expect("just made");
        for r in &plan.ranges {
            for v in [r.src.0 as u64, r.src_off, r.len, r.dest.0 as u64, r.dest_off] {
                w.write_all(&v.to_le_bytes())?;
            }
        }
        counts.push(plan.ranges.len());
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
