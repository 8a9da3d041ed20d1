//! The resolved configuration of one invocation.
//!
//! Built once from the parsed command line and the environment (terminal,
//! user, filesystem of the paths); nothing downstream sees clap.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::cli::{Cli, Command, LogLevel, ProgressMode, ScanArgs};
use crate::progress::Verbosity;
use crate::report::display_path;
use crate::sys::{self, FsInfo};

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Scan, plan and share (or preview with `dry_run`).
    Run,
    /// Scan into the database only.
    Scan,
    /// Print what the database knows.
    Report,
}

/// Everything a run needs, resolved.
#[derive(Debug, Clone)]
pub struct Config {
    pub action: Action,
    /// Canonical starting paths (empty for `report`).
    pub paths: Vec<PathBuf>,
    /// Filesystem of the paths (for `report` without a path: None).
    pub fs: Option<FsInfo>,
    pub db_path: PathBuf,
    pub block_size: u64,
    pub threads: usize,
    pub excludes: Vec<String>,
    pub incremental: bool,
    pub dry_run: bool,
    pub min_range: u64,
    /// See `--rewrite-ratio`.
    pub rewrite_ratio: f64,
    pub json: bool,
    pub verbosity: Verbosity,
    pub bars: bool,
    /// Share into read-only btrfs snapshots too.
    pub include_readonly_snapshots: bool,
    /// Drop hashed data from the page cache (`--drop-cache`).
    pub drop_cache: bool,
    /// Time budget of the run.
    pub max_runtime: Option<std::time::Duration>,
    /// Where to write the run's figures for Prometheus (`--metrics-file`).
    pub metrics_file: Option<PathBuf>,
    /// `--list`: include every planned range in the report.
    pub list: bool,
}

impl Config {
    pub fn from_cli(cli: Cli) -> Result<Config> {
        let g = cli.global;
        let verbosity = match (g.quiet, g.verbose, g.log_level) {
            (q, _, _) if q > 0 => Verbosity::Quiet,
            (_, v, _) if v > 0 => Verbosity::Verbose,
            (_, _, Some(LogLevel::Quiet)) => Verbosity::Quiet,
            (_, _, Some(LogLevel::Verbose)) => Verbosity::Verbose,
            _ => Verbosity::Normal,
        };
        let bars = match g.progress {
            ProgressMode::Always => true,
            ProgressMode::Never => false,
            ProgressMode::Auto => std::io::stderr().is_terminal() && verbosity > Verbosity::Quiet,
        };
        let list = cli.run.list || matches!(&cli.command, Some(Command::Report(r)) if r.list);
        let (action, scan, dry_run, min_range, rewrite_ratio) = match cli.command {
            None => (Action::Run, cli.run.scan, cli.run.dry_run, cli.run.min_range, cli.run.rewrite_ratio),
            Some(Command::Scan(s)) => (Action::Scan, s, false, 0, 0.0),
            Some(Command::Report(r)) => {
                let fs = r.path.as_deref().map(resolve_fs).transpose()?;
                let db_path = match (g.db, &fs) {
                    (Some(db), _) => db,
                    (None, Some((_, fs))) => default_db_path(&fs.uuid)?,
                    (None, None) => bail!("report needs a path on the filesystem, or --db FILE"),
                };
                return Ok(Config {
                    action: Action::Report,
                    paths: fs.iter().map(|(p, _)| p.clone()).collect(),
                    fs: fs.map(|(_, f)| f),
                    db_path,
                    block_size: 4096,
                    threads: 1,
                    excludes: vec![],
                    incremental: false,
                    dry_run: false,
                    min_range: 0,
                    rewrite_ratio: 0.0,
                    json: g.json,
                    verbosity,
                    bars,
                    include_readonly_snapshots: false,
                    drop_cache: false,
                    max_runtime: None,
                    metrics_file: None,
                    list,
                });
            }
        };
        let ScanArgs {
            paths,
            incremental,
            block_size,
            threads,
            mut exclude,
            exclude_from,
            include_readonly_snapshots,
            drop_cache,
            max_runtime,
            metrics_file,
        } = scan;
        for f in &exclude_from {
            let text = std::fs::read_to_string(f).with_context(|| format!("--exclude-from {}", display_path(f)))?;
            exclude.extend(
                text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_owned),
            );
        }
        if paths.is_empty() {
            bail!("no path given: name the directories to scan, e.g. `dedupscan /srv`");
        }
        let mut canon = Vec::new();
        let mut fs: Option<FsInfo> = None;
        for p in &paths {
            let (c, info) = resolve_fs(p)?;
            match &fs {
                Some(f) if f.uuid != info.uuid => bail!(
                    "{} is on another filesystem ({}) than {} ({}); run dedupscan once per filesystem",
                    display_path(p),
                    info.uuid,
                    display_path(&paths[0]),
                    f.uuid
                ),
                _ => fs = Some(info),
            }
            canon.push(c);
        }
        let fs = fs.expect("at least one path");
        let db_path = match g.db {
            Some(db) => db,
            None => default_db_path(&fs.uuid)?,
        };
        // Hashing threads also keep reads in flight: on a cold disk most of
        // them wait for I/O, so more threads than CPUs keep both busy
        // (measured in docs/BENCHMARKS.md: 2 → 8 threads, 2.98 s → 2.49 s
        // on SMALL; 8 → 16 threads on FULL, btrfs, 0.90/0.74× → 0.80/0.68×
        // of a cold raw read). Each costs a 1 MiB read buffer.
        let threads = threads.unwrap_or_else(|| {
            let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
            (cpus * 8).clamp(8, 64)
        });
        Ok(Config {
            action,
            paths: canon,
            fs: Some(fs),
            db_path,
            block_size,
            threads: threads.max(1),
            excludes: exclude,
            incremental,
            dry_run,
            min_range,
            rewrite_ratio,
            json: g.json,
            verbosity,
            bars,
            include_readonly_snapshots,
            drop_cache,
            max_runtime,
            metrics_file,
            list,
        })
    }
}

/// Canonical path and the filesystem it is on.
fn resolve_fs(p: &Path) -> Result<(PathBuf, FsInfo)> {
    let c = std::fs::canonicalize(p).with_context(|| format!("{}: cannot open", display_path(p)))?;
    let info = sys::fs::fs_info_of_path(&c).with_context(|| format!("{}: cannot read filesystem", display_path(&c)))?;
    Ok((c, info))
}

/// `/var/lib/dedupscan/<uuid>.sqlite` for root, the XDG state directory for
/// other users: one database per filesystem.
pub fn default_db_path(uuid: &str) -> Result<PathBuf> {
    let name = format!("{uuid}.sqlite");
    if nix::unistd::geteuid().is_root() {
        return Ok(Path::new("/var/lib/dedupscan").join(name));
    }
    let state = match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(s) => PathBuf::from(s),
        None => {
            let home = std::env::var_os("HOME").context("neither XDG_STATE_HOME nor HOME is set; give --db")?;
            Path::new(&home).join(".local/state")
        }
    };
    Ok(state.join("dedupscan").join(name))
}
