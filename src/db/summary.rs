//! The queries of the `report` command and of the metrics file: totals,
//! the history of runs, pending work. Plain rows; `crate::summary` and
//! `crate::metrics` turn them into what they show.

use std::path::Path;

use super::Db;
use crate::file::FileId;

/// One recorded run, as stored.
#[derive(Debug, Clone)]
pub struct RunRow {
    /// Its id (runs are numbered in the order they started).
    pub id: i64,
    /// Unix seconds.
    pub started_at: i64,
    /// Unix seconds; `None` if it never recorded an end.
    pub finished_at: Option<i64>,
    /// `run` or `scan`.
    pub command: String,
    /// Whether it was a dry run.
    pub dry_run: bool,
    /// Its report as JSON text (`None` when it did not finish).
    pub report: Option<String>,
}

/// Destinations left pending for one reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRow {
    /// Why (`no_space_rewrite`, `no_space_share`, `referenced_outside_run`).
    pub reason: String,
    /// How many destination files.
    pub files: u64,
    /// Planned bytes not shared.
    pub bytes: u64,
}

/// Bytes one file's sharing left pinned, for one reason (see
/// [`crate::dedupe::PinReason`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedRow {
    /// The destination file.
    pub file: FileId,
    /// Why (`below_rewrite_ratio`, `compressed`, ...).
    pub reason: String,
    /// Shared bytes that freed nothing.
    pub bytes: u64,
}

impl Db {
    /// Number of known files and the sum of their sizes.
    pub fn file_totals(&self) -> rusqlite::Result<(u64, u64)> {
        self.conn.query_row("SELECT count(*), coalesce(sum(size), 0) FROM files", [], |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
        })
    }

    /// Every recorded run, oldest first.
    pub fn runs(&self) -> rusqlite::Result<Vec<RunRow>> {
        self.run_rows("")
    }

    /// The runs that finished with a report, oldest first.
    pub fn finished_runs(&self) -> rusqlite::Result<Vec<RunRow>> {
        self.run_rows("WHERE finished_at IS NOT NULL AND report IS NOT NULL")
    }

    fn run_rows(&self, filter: &str) -> rusqlite::Result<Vec<RunRow>> {
        let mut st = self.conn.prepare(&format!(
            "SELECT id, started_at, finished_at, command, dry_run, report FROM runs {filter} ORDER BY id"
        ))?;
        let rows = st.query_map([], |r| {
            Ok(RunRow {
                id: r.get(0)?,
                started_at: r.get(1)?,
                finished_at: r.get(2)?,
                command: r.get(3)?,
                dry_run: r.get(4)?,
                report: r.get(5)?,
            })
        })?;
        rows.collect()
    }

    /// Pending destinations grouped by reason, in reason order. A database
    /// from before schema v5 has no pending table: nothing pending.
    pub fn pending_by_reason(&self) -> rusqlite::Result<Vec<PendingRow>> {
        // Not the rows of files removed since (see `Db::pending`).
        let Ok(mut st) = self.conn.prepare(
            "SELECT reason, count(*), sum(bytes) FROM pending WHERE file_id IN (SELECT id FROM files) \
             GROUP BY reason ORDER BY reason",
        ) else {
            return Ok(Vec::new());
        };
        let rows = st.query_map([], |r| {
            Ok(PendingRow { reason: r.get(0)?, files: r.get::<_, i64>(1)? as u64, bytes: r.get::<_, i64>(2)? as u64 })
        })?;
        rows.collect()
    }
}

impl Db {
    /// Every file's pinned bytes still true of it (the file unchanged since
    /// the row was written), largest first. A database from before schema
    /// v8 has no pinned table: nothing pinned.
    pub fn pinned_files(&self) -> rusqlite::Result<Vec<PinnedRow>> {
        let Ok(mut st) = self.conn.prepare(
            "SELECT p.file_id, p.reason, p.bytes FROM pinned p \
             JOIN files f ON f.id = p.file_id AND f.ctime = p.ctime \
             ORDER BY p.bytes DESC, p.file_id, p.reason",
        ) else {
            return Ok(Vec::new());
        };
        let rows = st.query_map([], |r| {
            Ok(PinnedRow { file: r.get(0)?, reason: r.get(1)?, bytes: r.get::<_, i64>(2)? as u64 })
        })?;
        rows.collect()
    }
}

/// The finished runs of the database at `path` (see [`Db::finished_runs`]);
/// empty when there is no readable database (a first run that failed
/// early).
pub fn finished_runs_at(path: &Path) -> Vec<RunRow> {
    Db::open_for_report(path).and_then(|db| Ok(db.finished_runs()?)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_totals_and_pending_of_a_fresh_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let db = Db::open(&path, "fs").unwrap();
        let a = db.begin_run("run", false).unwrap();
        db.finish_run(a, "{}").unwrap();
        db.begin_run("scan", true).unwrap();
        assert_eq!(db.file_totals().unwrap(), (0, 0));
        let runs = db.runs().unwrap();
        assert_eq!(
            runs.iter().map(|r| (r.command.as_str(), r.dry_run)).collect::<Vec<_>>(),
            [("run", false), ("scan", true)]
        );
        assert_eq!(runs[1].finished_at, None);
        assert_eq!(db.finished_runs().unwrap().len(), 1);
        assert_eq!(db.pending_by_reason().unwrap(), vec![]);
        drop(db);
        assert_eq!(finished_runs_at(&path).len(), 1);
        assert!(finished_runs_at(&dir.path().join("none")).is_empty());
    }
}
