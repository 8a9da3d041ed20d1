//! `dedupscan report`: what the database knows, without scanning.
//!
//! In: a database path. Out: totals of the files it describes, what is
//! shared and what still is not — the plan rebuilt from the database and
//! every range measured with FIEMAP (metadata only, no data is read) — and
//! the history of runs (each run's own report, as it was measured).
//! Described by `schema/db-report.schema.json`.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use crate::db::Db;
use crate::dedupe::{range_states, RangeState};
use crate::plan::PlanOptions;
use crate::report::{display_path, human};
use crate::types::FileId;
use crate::walk::Candidate;

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

/// A source file whose copies still hold unshared duplicate bytes.
#[derive(Debug, Serialize)]
pub struct RemainingGroup {
    pub source: String,
    pub unshared_bytes: u64,
    pub destinations: u64,
}

/// A directory holding unshared duplicate bytes (as destinations).
#[derive(Debug, Serialize)]
pub struct RemainingDir {
    pub directory: String,
    pub unshared_bytes: u64,
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
    /// Sum of the files' allocated blocks (st_blocks), as they are now;
    /// shared blocks count in every file that uses them.
    pub allocated_bytes: u64,
    /// Duplicate bytes the plan finds among the known files now.
    pub duplicate_bytes: u64,
    /// Of those, bytes already sharing one extent (measured with FIEMAP).
    pub shared_bytes: u64,
    /// Of those, bytes not shared yet: what the next run would submit.
    pub unshared_bytes: u64,
    /// Bytes of ranges whose files could not be opened or mapped (gone,
    /// changed, volume not mounted).
    pub unknown_bytes: u64,
    /// Sources with the most unshared duplicate bytes, largest first.
    pub largest_remaining_groups: Vec<RemainingGroup>,
    /// Directories holding the most unshared duplicate bytes.
    pub top_directories: Vec<RemainingDir>,
    /// Duplicate bytes left for a later run, by reason: out of space, or
    /// pinned by a file outside the run (see [`crate::dedupe::Pending`]).
    pub pending: std::collections::BTreeMap<String, crate::report::PendingWork>,
    pub pending_bytes: u64,
    /// Sum over runs of bytes freed, as measured by statfs.
    pub freed_bytes_total: i64,
    pub runs: Vec<RunEntry>,
}

pub fn summarize(path: &Path) -> Result<DbSummary> {
    if !path.exists() {
        anyhow::bail!("no database at {}: run `dedupscan PATH` or `dedupscan scan PATH` first", display_path(path));
    }
    let db = Db::open_for_report(path)?;
    let conn = &db.conn;
    let meta =
        |k: &str| -> Option<String> { conn.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| r.get(0)).ok() };
    let block_size: u64 = meta("block_size").and_then(|s| s.parse().ok()).unwrap_or(4096);
    let live = live_status(&db, block_size)?;
    let (files, logical): (i64, i64) =
        conn.query_row("SELECT count(*), coalesce(sum(size), 0) FROM files", [], |r| Ok((r.get(0)?, r.get(1)?)))?;
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
    // A database from before schema v5 has no pending table: nothing pending.
    let mut pending: std::collections::BTreeMap<String, crate::report::PendingWork> = Default::default();
    if let Ok(mut st) = conn.prepare("SELECT reason, count(*), sum(bytes) FROM pending GROUP BY reason") {
        let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)))?;
        for row in rows {
            let (why, files, bytes) = row?;
            pending.insert(why, crate::report::PendingWork { files: files as u64, bytes: bytes as u64 });
        }
    }
    let pending_bytes = pending.values().map(|w| w.bytes).sum();
    Ok(DbSummary {
        database: display_path(path),
        filesystem_uuid: meta("filesystem"),
        block_size: Some(block_size),
        allocated_bytes: live.allocated,
        duplicate_bytes: live.duplicate,
        shared_bytes: live.shared,
        unshared_bytes: live.unshared,
        unknown_bytes: live.unknown,
        largest_remaining_groups: live.groups,
        top_directories: live.dirs,
        files: files as u64,
        logical_bytes: logical as u64,
        whole_file_duplicate_files: live.whole_dup_files,
        whole_file_duplicate_bytes: live.whole_dup_bytes,
        pending,
        pending_bytes,
        freed_bytes_total: freed,
        runs,
    })
}

struct Live {
    allocated: u64,
    duplicate: u64,
    shared: u64,
    unshared: u64,
    unknown: u64,
    whole_dup_files: u64,
    whole_dup_bytes: u64,
    groups: Vec<RemainingGroup>,
    dirs: Vec<RemainingDir>,
}

/// Plan over every known file and measure each range with FIEMAP.
fn live_status(db: &Db, block_size: u64) -> Result<Live> {
    let index = db.load_index()?;
    let mut allocated = 0;
    let files: HashMap<FileId, Candidate> = index
        .into_iter()
        .map(|((dev, ino), k)| {
            if let Ok(m) = std::fs::symlink_metadata(&k.path) {
                allocated += m.blocks() * 512;
            }
            let c = Candidate { path: k.path, dev, ino, size: k.size, mtime: k.mtime, ctime: k.ctime };
            (k.id, c)
        })
        .collect();
    let allowed: HashSet<FileId> = files.keys().copied().collect();
    let opts = PlanOptions { block_size, ..Default::default() };
    let planned = db.plan(&allowed, None, opts)?;
    let plan = planned.plan;
    let status = range_states(&plan, &files, block_size);
    let mut live = Live {
        allocated,
        duplicate: 0,
        shared: 0,
        unshared: 0,
        unknown: 0,
        whole_dup_files: 0,
        whole_dup_bytes: 0,
        groups: vec![],
        dirs: vec![],
    };
    for g in &planned.whole_groups {
        let copies = g.len() as u64 - 1;
        live.whole_dup_files += copies;
        live.whole_dup_bytes += copies * files[&g[0]].size;
    }
    let mut by_src: HashMap<FileId, (u64, HashSet<FileId>)> = HashMap::new();
    let mut by_dir: HashMap<PathBuf, u64> = HashMap::new();
    for (r, st) in plan.ranges.iter().zip(status) {
        if st != RangeState::Inline {
            live.duplicate += r.len;
        }
        match st {
            RangeState::Inline => {}
            RangeState::Unknown => live.unknown += r.len,
            RangeState::Unshared(u) => {
                live.unshared += u;
                live.shared += r.len - u;
                if u > 0 {
                    let e = by_src.entry(r.src).or_default();
                    e.0 += u;
                    e.1.insert(r.dest);
                    let dir = files[&r.dest].path.parent().map(Path::to_owned).unwrap_or_default();
                    *by_dir.entry(dir).or_default() += u;
                }
            }
        }
    }
    let mut groups: Vec<RemainingGroup> = by_src
        .into_iter()
        .map(|(id, (bytes, dests))| RemainingGroup {
            source: display_path(&files[&id].path),
            unshared_bytes: bytes,
            destinations: dests.len() as u64,
        })
        .collect();
    groups.sort_by(|a, b| b.unshared_bytes.cmp(&a.unshared_bytes).then_with(|| a.source.cmp(&b.source)));
    groups.truncate(TOP);
    let mut dirs: Vec<RemainingDir> = by_dir
        .into_iter()
        .map(|(d, bytes)| RemainingDir { directory: display_path(&d), unshared_bytes: bytes })
        .collect();
    dirs.sort_by(|a, b| b.unshared_bytes.cmp(&a.unshared_bytes).then_with(|| a.directory.cmp(&b.directory)));
    dirs.truncate(TOP);
    live.groups = groups;
    live.dirs = dirs;
    Ok(live)
}

/// How many groups and directories the report lists.
const TOP: usize = 10;

impl DbSummary {
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "database {} (filesystem {})\n  {} files, {} logical, {} allocated; whole-file duplicates: {} files, {}\n  duplicate ranges: {}, of which shared {}, not yet shared {}{}\n  freed so far (measured with statfs): {} over {} runs\n",
            self.database,
            self.filesystem_uuid.as_deref().unwrap_or("?"),
            self.files,
            human(self.logical_bytes),
            human(self.allocated_bytes),
            self.whole_file_duplicate_files,
            human(self.whole_file_duplicate_bytes),
            human(self.duplicate_bytes),
            human(self.shared_bytes),
            human(self.unshared_bytes),
            if self.unknown_bytes > 0 { format!(", unknown {}", human(self.unknown_bytes)) } else { String::new() },
            human(self.freed_bytes_total.max(0) as u64),
            self.runs.len()
        );
        if self.pending_bytes > 0 {
            let list: Vec<String> =
                self.pending.iter().map(|(k, w)| format!("{k}: {} in {} files", human(w.bytes), w.files)).collect();
            s.push_str(&format!(
                "  pending: {} left for the next run ({})\n",
                human(self.pending_bytes),
                list.join(", ")
            ));
        }
        for g in &self.largest_remaining_groups {
            s.push_str(&format!(
                "  unshared {} in {} copies of {}\n",
                human(g.unshared_bytes),
                g.destinations,
                g.source
            ));
        }
        for d in &self.top_directories {
            s.push_str(&format!("  unshared {} in {}/\n", human(d.unshared_bytes), d.directory));
        }
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
