//! `dedupscan report`: what the database knows, without scanning.
//!
//! In: a database path. Out: totals of the files it describes and the
//! history of runs (each run's own report, as it was measured).

use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use crate::db::Db;
use crate::report::{display_path, human};

/// One past run.
#[derive(Debug, Serialize)]
pub struct RunEntry {
    pub id: i64,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub command: String,
    pub dry_run: bool,
    /// That run's report (null when it did not finish).
    pub report: Option<serde_json::Value>,
}

/// The database summary.
#[derive(Debug, Serialize)]
pub struct DbSummary {
    pub database: String,
    pub filesystem_uuid: Option<String>,
    pub block_size: Option<u64>,
    pub files: u64,
    pub logical_bytes: u64,
    /// Files that share size and content with at least one other file.
    pub whole_file_duplicate_files: u64,
    pub whole_file_duplicate_bytes: u64,
    /// Sum over runs of bytes freed, as measured by statfs.
    pub freed_bytes_total: i64,
    pub runs: Vec<RunEntry>,
}

pub fn summarize(path: &Path) -> Result<DbSummary> {
    if !path.exists() {
        anyhow::bail!("no database at {}: run `dedupscan PATH` or `dedupscan scan PATH` first", display_path(path));
    }
    let conn = Db::open_readonly(path)?;
    let meta =
        |k: &str| -> Option<String> { conn.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| r.get(0)).ok() };
    let (files, logical): (i64, i64) =
        conn.query_row("SELECT count(*), coalesce(sum(size), 0) FROM files", [], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let (dup_files, dup_bytes): (i64, i64) = conn.query_row(
        "SELECT coalesce(sum(n - 1), 0), coalesce(sum((n - 1) * size), 0)
           FROM (SELECT size, count(*) AS n FROM files GROUP BY size, digest HAVING n > 1)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let mut st = conn.prepare("SELECT id, started_at, finished_at, command, dry_run, report FROM runs ORDER BY id")?;
    let runs = st
        .query_map([], |r| {
            let report: Option<String> = r.get(5)?;
            Ok(RunEntry {
                id: r.get(0)?,
                started_at: r.get(1)?,
                finished_at: r.get(2)?,
                command: r.get(3)?,
                dry_run: r.get(4)?,
                report: report.and_then(|s| serde_json::from_str(&s).ok()),
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let freed = runs.iter().filter_map(|r| r.report.as_ref()?.get("freed_bytes")?.as_i64()).sum();
    Ok(DbSummary {
        database: display_path(path),
        filesystem_uuid: meta("filesystem"),
        block_size: meta("block_size").and_then(|s| s.parse().ok()),
        files: files as u64,
        logical_bytes: logical as u64,
        whole_file_duplicate_files: dup_files as u64,
        whole_file_duplicate_bytes: dup_bytes as u64,
        freed_bytes_total: freed,
        runs,
    })
}

impl DbSummary {
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "database {} (filesystem {})\n  {} files, {}; whole-file duplicates: {} files, {}\n  freed so far (measured): {} bytes over {} runs\n",
            self.database,
            self.filesystem_uuid.as_deref().unwrap_or("?"),
            self.files,
            human(self.logical_bytes),
            self.whole_file_duplicate_files,
            human(self.whole_file_duplicate_bytes),
            self.freed_bytes_total,
            self.runs.len()
        );
        for r in self.runs.iter().rev().take(10) {
            let get = |k: &str| r.report.as_ref().and_then(|v| v.get(k)).and_then(|v| v.as_i64()).unwrap_or(0);
            s.push_str(&format!(
                "  run {} at {}: {}{}, hashed {}, duplicate {}, shared {}, freed {}\n",
                r.id,
                r.started_at,
                r.command,
                if r.dry_run { " (dry run)" } else { "" },
                human(get("bytes_hashed") as u64),
                human(get("duplicate_bytes") as u64),
                human(get("deduped_bytes") as u64),
                get("freed_bytes")
            ));
        }
        s
    }
}
