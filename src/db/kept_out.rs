//! The `kept_out` table (`schema/0009_kept_out.sql`): the files a run kept
//! out of its plan for their hard links, written a bounded number at a
//! time ([`KeptOut`]): a scan of one snapshot of an rsnapshot tree keeps
//! out every file in it.

use rusqlite::{params, Transaction};

use super::Db;
use crate::file::{FileId, IdSet};

/// Rows read, or files looked up, at a time.
pub const CHUNK: usize = 1 << 16;

/// Run `run`'s rows being written, in one transaction: the rows of the
/// files it saw were dropped when this was made; [`KeptOut::add`] adds
/// those it keeps out, [`KeptOut::finish`] drops the rows of forgotten
/// files and commits. Rows of files it did not see stay.
///
/// A file an earlier run kept out and this one lets in (the crawl saw
/// every name this time: `dedupscan /backup/daily.0`, then `dedupscan
/// /backup`) is new to the plan though it did not change: its
/// `hashed_run` becomes `run`, so that an incremental plan, this run's or
/// a later one's if this one only previews, takes it up. It used to stay
/// unshared until it changed ("nothing new since the last complete run").
pub struct KeptOut<'a> {
    tx: Transaction<'a>,
    run: i64,
    /// Files whose rows were dropped and not added again: let in.
    let_in: IdSet,
}

impl Db {
    /// Start recording which files run `run` keeps out of its plan: the
    /// rows of the files it saw (`seen`) are dropped first.
    pub fn kept_out_writer(&self, run: i64, seen: impl Fn(FileId) -> bool) -> rusqlite::Result<KeptOut<'_>> {
        let tx = self.conn.unchecked_transaction()?;
        let mut let_in = IdSet::new();
        {
            let mut old = tx.prepare("SELECT file_id FROM kept_out WHERE file_id > ?1 ORDER BY file_id LIMIT ?2")?;
            let mut del = tx.prepare("DELETE FROM kept_out WHERE file_id = ?1")?;
            let mut after = FileId(-1);
            loop {
                let ids: Vec<FileId> =
                    old.query_map(params![after, CHUNK as i64], |r| r.get(0))?.collect::<Result<_, _>>()?;
                let Some(&last) = ids.last() else { break };
                for id in ids.into_iter().filter(|&id| seen(id)) {
                    del.execute([id])?;
                    let_in.insert(id);
                }
                after = last;
            }
        }
        Ok(KeptOut { tx, run, let_in })
    }

    /// Each file the last run that saw it kept out of its plan for its
    /// hard links, in order (none in a database from before schema v9);
    /// how many.
    pub fn for_each_kept_out(&self, mut each: impl FnMut(FileId)) -> rusqlite::Result<u64> {
        let Ok(mut st) = self.conn.prepare("SELECT file_id FROM kept_out ORDER BY file_id") else {
            return Ok(0);
        };
        let mut rows = st.query([])?;
        let mut n = 0;
        while let Some(row) = rows.next()? {
            each(row.get(0)?);
            n += 1;
        }
        Ok(n)
    }
}

impl KeptOut<'_> {
    /// These files are kept out by this run.
    pub fn add(&mut self, kept: &[FileId]) -> rusqlite::Result<()> {
        let mut ins = self.tx.prepare_cached("INSERT OR REPLACE INTO kept_out (file_id, run) VALUES (?1, ?2)")?;
        for &id in kept {
            ins.execute(params![id, self.run])?;
            self.let_in.remove(id);
        }
        Ok(())
    }

    /// Mark the files let in new to the plan; drop the rows of forgotten
    /// files; commit.
    pub fn finish(self) -> rusqlite::Result<()> {
        {
            let mut new = self.tx.prepare("UPDATE files SET hashed_run = ?1 WHERE id = ?2")?;
            for id in self.let_in.iter() {
                new.execute(params![self.run, id])?;
            }
        }
        self.tx.execute("DELETE FROM kept_out WHERE file_id NOT IN (SELECT id FROM files)", [])?;
        self.tx.commit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept_out(db: &Db) -> Vec<FileId> {
        let mut ids = Vec::new();
        let n = db.for_each_kept_out(|id| ids.push(id)).unwrap();
        assert_eq!(n, ids.len() as u64);
        ids
    }

    /// The rows of files a run saw are replaced, the others stay, those of
    /// forgotten files go, over more rows than one chunk.
    #[test]
    fn a_run_replaces_the_rows_of_the_files_it_saw() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("db"), "fs").unwrap();
        let n = (CHUNK * 2 + 100) as i64;
        db.conn.execute("INSERT INTO dirs (id, path, dev) VALUES (1, x'2f', 1)", []).unwrap();
        let tx = db.conn.unchecked_transaction().unwrap();
        for id in 1..=n {
            tx.execute(
                "INSERT INTO files (id, dir, name, ino, size, mtime, ctime, hashed_run, blocks) \
                 VALUES (?1, 1, ?2, ?1, 1, 0, 0, 1, x'')",
                params![id, id.to_string()],
            )
            .unwrap();
        }
        tx.commit().unwrap();
        // Run 1 keeps out every file.
        let mut kept = db.kept_out_writer(1, |_| true).unwrap();
        let all: Vec<FileId> = (1..=n).map(FileId).collect();
        for chunk in all.chunks(1000) {
            kept.add(chunk).unwrap();
        }
        kept.finish().unwrap();
        assert_eq!(kept_out(&db), all);
        // Run 2 saw the files up to 100,000 (more than a chunk of rows)
        // and keeps out every third; file 100,001 is forgotten.
        db.conn.execute("DELETE FROM files WHERE id = 100001", []).unwrap();
        let saw = |id: FileId| id.0 <= 100_000;
        let mut kept = db.kept_out_writer(2, saw).unwrap();
        let third: Vec<FileId> = (3..=100_000).step_by(3).map(FileId).collect();
        kept.add(&third).unwrap();
        kept.finish().unwrap();
        let rest = all.into_iter().filter(|&id| !saw(id) && id.0 != 100_001);
        assert_eq!(kept_out(&db), third.iter().copied().chain(rest).collect::<Vec<_>>());
        // The files run 2 let in are new to the plan since run 2; those it
        // kept out, or did not see, are not.
        let new = db.hashed_after(1).unwrap();
        assert_eq!(new.len(), 100_000 - third.len(), "let in: seen and not kept out");
        assert!(new.iter().all(|id| saw(*id) && id.0 % 3 != 0), "{:?}", &new[..10]);
        let runs: i64 = db.conn.query_row("SELECT count(DISTINCT run) FROM kept_out", [], |r| r.get(0)).unwrap();
        assert_eq!(runs, 2);
    }
}
