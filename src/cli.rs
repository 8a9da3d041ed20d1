//! Command-line definitions: the one place flags live. The doc comments are
//! the help text (and the man page). Nothing outside `main.rs` and
//! `config.rs` sees these types.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::dedupe::headroom::KeepFree;

/// Find data stored twice on btrfs and XFS and let the kernel share it.
///
/// dedupscan crawls the given paths, hashes file blocks into a database,
/// finds ranges with the same content (whole files and 4 KiB-aligned runs
/// anywhere in two files), and asks the kernel to share them with
/// FIDEDUPERANGE. The kernel compares the bytes itself before it shares
/// anything, so a file's content never changes.
///
/// Files are never opened for writing, symlinks never followed, other mounts
/// never entered. A `user.nodedup` extended attribute on a file or directory,
/// or a `.nodedup` file in a directory, keeps it (and everything below) out.
#[derive(Debug, Parser)]
#[command(
    name = "dedupscan",
    version,
    subcommand_negates_reqs = true,
    after_help = "Exit codes: 0 success, 1 finished but some paths or ranges had errors, 2 usage error (nothing done), 3 fatal error, 4 database locked by another run, 5 stopped before finishing (signal, --max-runtime, or the filesystem stopped; the next run carries on), 6 not btrfs or XFS with reflink, or mounted read-only (refused, nothing done)."
)]
pub struct Cli {
    /// The command; none is the default one (scan, then share).
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Options of the default command.
    #[command(flatten)]
    pub run: RunArgs,

    /// Options every command takes.
    #[command(flatten)]
    pub global: GlobalArgs,
}

impl Cli {
    /// Parse the command line (usage errors print and exit with 2).
    pub fn parse_args() -> Cli {
        Self::try_parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// Parse `args`. Options every command takes may come before a
    /// command's name (`dedupscan --db FILE scan PATH`), but the default
    /// command's own paths and options may not: they would be silently
    /// ignored (`dedupscan --incremental scan PATH` would rehash everything).
    pub fn try_parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::parser::ValueSource;
        use clap::{CommandFactory, FromArgMatches};
        let mut cmd = Cli::command();
        let m = cmd.try_get_matches_from_mut(args)?;
        if let Some(sub) = m.subcommand_name() {
            let run_args = RunArgs::augment_args(clap::Command::new("run"));
            for a in run_args.get_arguments() {
                if m.value_source(a.get_id().as_str()) == Some(ValueSource::CommandLine) {
                    let what = a.get_long().map_or_else(|| a.get_id().to_string(), |l| format!("--{l}"));
                    return Err(cmd.error(
                        clap::error::ErrorKind::ArgumentConflict,
                        format!("`{what}` before `{sub}`: paths and options of `{sub}` go after its name, e.g. `dedupscan {sub} --incremental PATH`"),
                    ));
                }
            }
        }
        Cli::from_arg_matches(&m).map_err(|e| e.format(&mut cmd))
    }
}

/// Options every command takes.
#[derive(Debug, Args, Clone)]
pub struct GlobalArgs {
    /// Database file [default: /var/lib/dedupscan/<filesystem-uuid>.sqlite as root,
    /// $XDG_STATE_HOME/dedupscan/<filesystem-uuid>.sqlite otherwise].
    ///
    /// A clone of the filesystem's device (dd, an LVM snapshot, a copied
    /// image) mounted beside it has the same UUID: the one found with its
    /// twin owning that file gets <filesystem-uuid>+<device>.sqlite, and
    /// keeps it.
    #[arg(long, value_name = "FILE", global = true, env = "DEDUPSCAN_DB")]
    pub db: Option<PathBuf>,

    /// Print the report as one JSON document on stdout.
    #[arg(long, global = true)]
    pub json: bool,

    /// More detail (repeatable); every warning about a single path, not
    /// only the first 200 of a run.
    #[arg(short, long, action = clap::ArgAction::Count, global = true, conflicts_with = "quiet")]
    pub verbose: u8,

    /// Less output: no per-path warnings, no progress.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub quiet: u8,

    /// How chatty stderr is when neither -v nor -q is given.
    #[arg(long, value_enum, value_name = "LEVEL", env = "DEDUPSCAN_LOG", global = true)]
    pub log_level: Option<LogLevel>,

    /// Progress display on stderr: bars on a terminal (auto), always, or never.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto, global = true)]
    pub progress: ProgressMode,
}

/// Message levels for `--log-level` / `DEDUPSCAN_LOG`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    /// The final report and fatal errors only.
    Quiet,
    /// Also a warning per problem path and a line per phase (default).
    Normal,
    /// Also details of every phase.
    Verbose,
}

/// When to draw progress bars.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProgressMode {
    /// Bars on a terminal, log lines elsewhere.
    Auto,
    /// Bars, even when stderr is not a terminal.
    Always,
    /// Plain log lines with a rate and, once known, an ETA.
    Never,
}

/// Options of a scan (shared by the default command and `scan`).
#[derive(Debug, Args, Clone)]
pub struct ScanArgs {
    /// Paths to scan: directories or files, all on one filesystem (a path
    /// inside another one given is scanned once, as part of it).
    #[arg(value_name = "PATH")]
    pub paths: Vec<PathBuf>,

    /// Rehash only files whose size, mtime or ctime changed since the last
    /// run (the default: a rerun, also after an interrupted run, carries on
    /// where the database stands). Kept for scripts that say so.
    #[arg(long)]
    pub incremental: bool,

    /// Rehash every file, even those unchanged since the last run, and plan
    /// every duplicate again (not only those involving new files).
    #[arg(long, conflicts_with = "incremental")]
    pub rehash: bool,

    /// Block size for fingerprints: a power of two from 4K to 1M (suffixes K, M).
    /// At least the filesystem's own block size: XFS made with 16K or 64K
    /// blocks shares whole blocks of that size only, so those are used.
    #[arg(long, value_name = "BYTES", default_value = "4K", value_parser = parse_block_size)]
    pub block_size: u64,

    /// Hashing threads [default: 8 per CPU, 8 to 64: most wait on the disk].
    #[arg(long, value_name = "N", value_parser = parse_threads)]
    pub threads: Option<usize>,

    /// Leave out paths matching this glob (repeatable; matched on the full path,
    /// so it starts with '/' or '*', e.g. '**/*.qcow2' or '/srv/tmp/**'). A glob
    /// that matches nothing is warned about.
    #[arg(long, value_name = "GLOB")]
    pub exclude: Vec<String>,

    /// Read more exclude globs from FILE, one per line ('#' starts a comment).
    #[arg(long, value_name = "FILE")]
    pub exclude_from: Vec<PathBuf>,

    /// Also share into read-only btrfs snapshots (left alone by default, a
    /// path given inside one too: sharing into many snapshots can grow
    /// metadata instead of freeing space).
    #[arg(long)]
    pub include_readonly_snapshots: bool,

    /// Also share btrfs files marked NOCOW ('chattr +C', left alone by
    /// default: a shared extent is copied on its next write, the rewriting
    /// NOCOW was set to avoid). For images no longer written, such as the
    /// golden images of a VM store kept in a NOCOW directory. They are
    /// shared only with each other (btrfs refuses to mix them with files
    /// that keep data checksums).
    #[arg(long)]
    pub include_nocow: bool,

    /// Also share files of different owners. By default a file is shared
    /// only with files of the same owner: sharing is visible to a file's
    /// owner (FIEMAP), so a user could otherwise confirm a guess at the
    /// content of a file they cannot read.
    #[arg(long)]
    pub share_across_owners: bool,

    /// Drop file data from the page cache once it is hashed, so a scan does
    /// not evict the server's working set (used by the systemd unit; costs
    /// rereads when ranges are shared, which then run on more workers).
    #[arg(long)]
    pub drop_cache: bool,

    /// Stop cleanly when this much time is spent (e.g. 90m, 2h); work done
    /// is committed, the exit status is 5 and the next run carries on.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub max_runtime: Option<std::time::Duration>,

    /// After the run, write its figures in the Prometheus text format to
    /// this file (replaced atomically), e.g. for node_exporter's textfile
    /// collector: /var/lib/prometheus/node-exporter/dedupscan-srv.prom.
    #[arg(long, value_name = "PATH")]
    pub metrics_file: Option<PathBuf>,
}

/// Options of the default command: scan, then share.
#[derive(Debug, Args, Clone)]
pub struct RunArgs {
    /// The options of a scan.
    #[command(flatten)]
    pub scan: ScanArgs,

    /// Show what would be shared, verified byte for byte, and change nothing
    /// on the volume.
    #[arg(long, short = 'n')]
    pub dry_run: bool,

    /// Shortest range worth sharing, in bytes (rounded down to blocks; whole
    /// small files are always shared).
    #[arg(long, value_name = "BYTES", default_value = "4K", value_parser = parse_size)]
    pub min_range: u64,

    /// btrfs: where a destination extent is only partly shared, copy its
    /// remainder into a fresh extent so the old one is freed — when the
    /// remainder is at most RATIO times the shared part (so at most RATIO
    /// bytes are copied for each byte freed). 0 turns it off. Where bytes
    /// stay pinned below RATIO, the run's report says what each of 2, 4, 8
    /// and 16 above RATIO would free and copy.
    // Why 4: see `plan::DEFAULT_REWRITE_RATIO`.
    #[arg(long, value_name = "RATIO", default_value_t = crate::plan::DEFAULT_REWRITE_RATIO, value_parser = parse_ratio)]
    pub rewrite_ratio: f64,

    /// btrfs: rewrite (see --rewrite-ratio) only while the volume keeps at
    /// least this much free: a size (e.g. 20G) or a share of the volume
    /// (e.g. 2%). The copies hold space until the old extents are released
    /// at the next commit, and other programs write meanwhile; a file whose
    /// rest would go below waits: tried again in the room the run's sharing
    /// frees, else left whole, pending, for a later run. 0 turns it off.
    /// Sharing itself writes no data and is not limited.
    #[arg(long, value_name = "SIZE|PERCENT", default_value = "1%", value_parser = parse_keep_free)]
    pub keep_free: KeepFree,

    /// btrfs: also share into files whose extents a read-only snapshot (or
    /// another file outside the run) still keeps, and turn into holes the
    /// written zeros such a snapshot also holds (copying the data that
    /// shares their extent first, within --keep-free). Nothing is freed
    /// until those snapshots are deleted, and sharing adds metadata
    /// meanwhile; by default such files wait, counted as pending. Meant
    /// for rotating snapshots (snapper, timeshift), where every old extent
    /// is always kept by the newest snapshot and would otherwise wait
    /// forever.
    #[arg(long)]
    pub share_snapshotted: bool,

    /// Leave written zero blocks as they are. By default runs of at least
    /// 64 KiB of zeros (thick-provisioned images, files preallocated by
    /// writing zeros) become holes: the kernel compares them with zeros
    /// first, and the file reads the same. Zeros reflinked copies share
    /// are punched in every file holding them (on btrfs only where every
    /// holder is in the run; with data in their extent, that data is
    /// copied once and shared into every holder).
    #[arg(long)]
    pub keep_zeros: bool,

    /// Also list every planned range (source, destination, offsets, bytes):
    /// with --dry-run, what would be shared.
    #[arg(long)]
    pub list: bool,

    /// Plan every file again, not only what changed, when the last run that
    /// did is more than DAYS days old. Sharing that something undid without
    /// changing the files (`btrfs filesystem defragment` rewrites extents
    /// unshared and leaves the files' times) is then found again, and
    /// destinations the kernel refused are retried. Reads no file data: the
    /// files planned are mapped, and only what is no longer shared is
    /// submitted. 0: never.
    #[arg(long, value_name = "DAYS", default_value_t = 7)]
    pub full_plan_days: u64,
}

/// The commands other than the default one.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Only crawl and hash into the database; share nothing.
    Scan(ScanArgs),
    /// Print what the database knows: files, bytes shared, not yet shared and pinned (btrfs), and the history of runs.
    Report(ReportArgs),
}

/// Options of `report`.
#[derive(Debug, Args, Clone)]
pub struct ReportArgs {
    /// A path on the filesystem whose database to read (when --db is not given).
    #[arg(value_name = "PATH")]
    pub path: Option<PathBuf>,

    /// Also write the report as one self-contained HTML page to FILE: savings
    /// history, space now, where duplicates remain (no script, nothing fetched).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Also list every duplicate range the database knows (source,
    /// destination, offsets, bytes) and whether it is shared now.
    #[arg(long)]
    pub list: bool,
}

/// Parse sizes like `4096`, `4K`, `4KiB`, `1M`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("'{s}' is not a size"))?;
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("unknown unit in '{s}' (use K, M, G or T)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("'{s}' is too large"))
}

/// `--keep-free`: a size, or a percentage from 0 to 100.
fn parse_keep_free(s: &str) -> Result<KeepFree, String> {
    match s.trim().strip_suffix('%') {
        Some(p) => match p.trim().parse::<f64>() {
            Ok(p) if (0.0..=100.0).contains(&p) => Ok(KeepFree::Percent(p)),
            _ => Err(format!("'{s}' is not a percentage from 0% to 100%")),
        },
        None => parse_size(s).map(KeepFree::Bytes),
    }
}

/// `--threads`: at least one (0 would hash nothing), at most 1024.
fn parse_threads(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n @ 1..=1024) => Ok(n),
        Ok(n) => Err(format!("must be from 1 to 1024, not {n}")),
        Err(_) => Err(format!("'{s}' is not a number")),
    }
}

/// `--rewrite-ratio`: a finite number, 0 or more.
fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 0.0 => Ok(r),
        _ => Err(format!("'{s}' is not a ratio (a number, 0 or more)")),
    }
}

fn parse_block_size(s: &str) -> Result<u64, String> {
    let n = parse_size(s)?;
    if !n.is_power_of_two() || !(4096..=1 << 20).contains(&n) {
        return Err(format!("block size must be a power of two from 4K to 1M, not {n}"));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_args(std::iter::once("dedupscan").chain(args.iter().copied()))
    }

    #[test]
    fn default_command_takes_paths_and_flags() {
        let c = parse(&["/srv", "--dry-run", "--block-size", "64K", "--json"]).unwrap();
        assert!(c.command.is_none());
        assert_eq!(c.run.scan.paths, vec![PathBuf::from("/srv")]);
        assert!(c.run.dry_run && c.global.json);
        assert_eq!(c.run.scan.block_size, 65536);
    }

    #[test]
    fn subcommands_parse() {
        let c = parse(&["scan", "/a", "/b", "--incremental"]).unwrap();
        match c.command {
            Some(Command::Scan(s)) => {
                assert_eq!(s.paths.len(), 2);
                assert!(s.incremental);
            }
            other => panic!("{other:?}"),
        }
        let c = parse(&["report", "--json", "--db", "/tmp/x.sqlite"]).unwrap();
        assert!(matches!(c.command, Some(Command::Report(_))));
        assert!(c.global.json);
        // Options every command takes may come before the command's name.
        for args in [&["--db", "/tmp/x.sqlite", "scan", "/a"][..], &["--json", "-q", "scan", "/a"]] {
            match parse(args).unwrap().command {
                Some(Command::Scan(s)) => assert_eq!(s.paths, vec![PathBuf::from("/a")]),
                other => panic!("{args:?}: {other:?}"),
            }
        }
        let c = parse(&["--db", "/tmp/x.sqlite", "report"]).unwrap();
        assert!(matches!(c.command, Some(Command::Report(_))));
        // The default command's own paths and options are not taken
        // before another command's name.
        for args in [&["--incremental", "scan", "/a"][..], &["--dry-run", "report"]] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{args:?}");
        }
    }

    #[test]
    fn bad_block_sizes_are_usage_errors() {
        for bad in ["3000", "2K", "2M", "abc", "4X"] {
            assert!(parse(&["/srv", "--block-size", bad]).is_err(), "{bad}");
        }
        assert!(parse(&["/srv", "--block-size", "1M"]).is_ok());
    }

    #[test]
    fn metrics_file_on_run_and_scan() {
        let c = parse(&["/srv", "--metrics-file", "/m/d.prom"]).unwrap();
        assert_eq!(c.run.scan.metrics_file, Some(PathBuf::from("/m/d.prom")));
        match parse(&["scan", "/srv", "--metrics-file", "/m/d.prom"]).unwrap().command {
            Some(Command::Scan(s)) => assert_eq!(s.metrics_file, Some(PathBuf::from("/m/d.prom"))),
            other => panic!("{other:?}"),
        }
        assert!(parse(&["report", "--metrics-file", "/m/d.prom"]).is_err());
    }

    #[test]
    fn bad_numbers_are_usage_errors() {
        for args in [
            &["/srv", "--threads", "0"][..],
            &["/srv", "--threads", "-1"],
            &["/srv", "--threads", "99999"],
            &["/srv", "--rewrite-ratio", "-1"],
            &["/srv", "--rewrite-ratio", "nan"],
            &["/srv", "--rehash", "--incremental"],
            &["/srv", "--keep-free", "101%"],
            &["/srv", "--keep-free", "-1%"],
            &["/srv", "--keep-free", "5X"],
        ] {
            assert!(parse(args).is_err(), "{args:?}");
        }
        let keep = |v: &str| parse(&["/srv", "--keep-free", v]).unwrap().run.keep_free;
        assert_eq!(keep("2.5%"), KeepFree::Percent(2.5));
        assert_eq!(keep("20G"), KeepFree::Bytes(20 << 30));
        assert_eq!(keep("1T"), KeepFree::Bytes(1 << 40));
        assert_eq!(parse(&["/srv"]).unwrap().run.keep_free, KeepFree::DEFAULT);
        assert_eq!(parse(&["/srv", "--threads", "3"]).unwrap().run.scan.threads, Some(3));
        assert!(parse(&["/srv", "--rehash"]).unwrap().run.scan.rehash);
    }

    #[test]
    fn help_lists_every_exit_code() {
        use clap::CommandFactory;
        let help = Cli::command().get_after_help().map(|h| h.to_string()).unwrap_or_default();
        for c in crate::exit::ExitCode::ALL {
            assert!(help.contains(&format!("{} ", c.code())), "--help lacks exit code {}", c.code());
        }
    }

    #[test]
    fn verbose_and_quiet_conflict() {
        assert!(parse(&["/srv", "-v", "-q"]).is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("2m"), Ok(2 << 20));
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
