//! The resolved configuration of one invocation.
//!
//! Built once from the parsed command line and the environment (terminal,
//! user, filesystem of the paths); nothing downstream sees clap.

use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::cli::{Cli, Command, LogLevel, ProgressMode, ScanArgs};
use crate::display::display_path;
use crate::policy::Excludes;
use crate::progress::Verbosity;
use crate::sys::{self, FsInfo, FsKind};

/// The paths of a run (the default command, also with `--dry-run`) are on a
/// filesystem dedupscan cannot share on. Found before any file is read or a
/// database is created; `main` maps it to exit code 6
/// ([`crate::exit::ExitCode::Unsupported`]). `scan` is not refused: it
/// records any filesystem, for a report or a later copy to btrfs/XFS.
#[derive(Debug, thiserror::Error)]
#[error(
    "{path}: on {fs}: dedupscan shares only on btrfs and on XFS made with reflink=1, so nothing was done (no file \
     read, no database created); `dedupscan scan {path}` records its files anyway"
)]
pub struct Unsupported {
    /// The first starting path, escaped.
    pub path: String,
    /// Name of the filesystem (`ext4`, `tmpfs`, `XFS made with reflink=0`,
    /// or its magic number).
    pub fs: String,
}

/// The paths of a run that would share are on a read-only mount: every
/// request would fail with `EROFS` (one warning a range). Found before any
/// file is read; `main` maps it to exit code 6, as [`Unsupported`]. A dry
/// run and `scan` are not refused.
#[derive(Debug, thiserror::Error)]
#[error(
    "{path}: mounted read-only: nothing can be shared there, so nothing was done (no file read, no database \
     created); remount it read-write, or preview with --dry-run"
)]
pub struct ReadOnly {
    /// The starting path on the read-only mount, escaped.
    pub path: String,
}

/// What to do, with what only that action needs.
#[derive(Debug, Clone)]
pub enum Action {
    /// Scan, plan and share (or preview with [`ShareConfig::dry_run`]).
    Run {
        /// How to scan.
        scan: ScanConfig,
        /// How to plan and share.
        share: ShareConfig,
    },
    /// Scan into the database only.
    Scan(ScanConfig),
    /// Print what the database knows.
    Report(ReportConfig),
}

/// How to scan (the default command and `scan`).
#[derive(Debug, Clone)]
pub struct ScanConfig {
    /// Canonical starting paths, all on one filesystem, none inside
    /// another.
    pub paths: Vec<PathBuf>,
    /// Starting paths given that were the same as or inside another one,
    /// dropped (each with the path that covers it), to be warned about.
    pub overlapping: Vec<(PathBuf, PathBuf)>,
    /// Filesystem of the paths.
    pub fs: FsInfo,
    /// The stable name of its device (`sys::twins::device_name`), recorded
    /// in the database to tell it from a clone with the same UUID.
    pub device: Option<String>,
    /// Bytes per fingerprinted block (`--block-size`).
    pub block_size: u64,
    /// Hashing threads (`--threads`, or 8 per CPU).
    pub threads: usize,
    /// `--exclude` and `--exclude-from` globs, compiled.
    pub excludes: Excludes,
    /// Trust files whose size, mtime and ctime did not change (not `--rehash`).
    pub incremental: bool,
    /// Share into read-only btrfs snapshots too.
    pub include_readonly_snapshots: bool,
    /// Share btrfs NOCOW files too (`--include-nocow`).
    pub include_nocow: bool,
    /// Drop hashed data from the page cache (`--drop-cache`).
    pub drop_cache: bool,
    /// Match and share files of different owners (`--share-across-owners`).
    pub share_across_owners: bool,
    /// Time budget of the run.
    pub max_runtime: Option<std::time::Duration>,
    /// Where to write the run's figures for Prometheus (`--metrics-file`).
    pub metrics_file: Option<PathBuf>,
}

impl ScanConfig {
    /// Whether files found NOCOW when opened to be shared are left alone:
    /// on btrfs, without `--include-nocow` (see `dedupe::nocow_left`).
    pub fn leaves_nocow(&self) -> bool {
        self.fs.kind == crate::sys::FsKind::Btrfs && !self.include_nocow
    }
}

/// How to plan and share (the default command).
#[derive(Debug, Clone)]
pub struct ShareConfig {
    /// Verify byte for byte instead of sharing (`--dry-run`).
    pub dry_run: bool,
    /// Shortest range worth sharing, in bytes (`--min-range`).
    pub min_range: u64,
    /// See `--rewrite-ratio`.
    pub rewrite_ratio: f64,
    /// See `--keep-free`.
    pub keep_free: crate::dedupe::headroom::KeepFree,
    /// Share into extents read-only snapshots keep (`--share-snapshotted`).
    pub share_snapshotted: bool,
    /// Leave written zero blocks alone (`--keep-zeros`).
    pub keep_zeros: bool,
    /// `--list`: include every planned range in the report.
    pub list: bool,
    /// Plan every file again when the last run that did is older than this
    /// many days (`--full-plan-days`; 0: never).
    pub full_plan_days: u64,
}

/// What `report` reads and writes.
#[derive(Debug, Clone)]
pub struct ReportConfig {
    /// `report --html FILE`.
    pub html: Option<PathBuf>,
    /// `report --list`: every duplicate range and its state.
    pub list: bool,
}

/// Everything an invocation needs, resolved.
#[derive(Debug, Clone)]
pub struct Config {
    /// What to do.
    pub action: Action,
    /// The database of the filesystem (or `--db`).
    pub db_path: PathBuf,
    /// Print the report as JSON (`--json`).
    pub json: bool,
    /// How chatty stderr is.
    pub verbosity: Verbosity,
    /// Draw progress bars (else log lines).
    pub bars: bool,
    /// Said once before a run whose filesystem has a twin (a clone of its
    /// device, mounted with the same UUID) and a database of its own now.
    pub db_note: Option<String>,
}

impl Config {
    /// Resolve the parsed command line: check the globs, find the
    /// filesystem and the database. Every usage error is found here,
    /// before any database is opened (`main` maps it to exit code 2; an
    /// [`Unsupported`] filesystem to 6).
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
            // A dumb terminal cannot redraw a bar: plain lines there, as in a pipe.
            ProgressMode::Auto => {
                std::io::stderr().is_terminal()
                    && std::env::var_os("TERM").is_none_or(|t| t != "dumb")
                    && verbosity > Verbosity::Quiet
            }
        };
        let mut db_note = None;
        let (action, db_path) = match cli.command {
            None => {
                let r = cli.run;
                let scan = scan_config(r.scan, true)?;
                if !r.dry_run {
                    if let Some(p) = scan.paths.iter().find(|p| sys::fs::mounted_read_only(p)) {
                        return Err(ReadOnly { path: display_path(p) }.into());
                    }
                }
                let share = ShareConfig {
                    dry_run: r.dry_run,
                    min_range: r.min_range,
                    rewrite_ratio: r.rewrite_ratio,
                    keep_free: r.keep_free,
                    share_snapshotted: r.share_snapshotted,
                    keep_zeros: r.keep_zeros,
                    list: r.list,
                    full_plan_days: r.full_plan_days,
                };
                let (db_path, note) = db_path(g.db, &scan)?;
                db_note = note;
                (Action::Run { scan, share }, db_path)
            }
            Some(Command::Scan(s)) => {
                let scan = scan_config(s, false)?;
                let (db_path, note) = db_path(g.db, &scan)?;
                db_note = note;
                (Action::Scan(scan), db_path)
            }
            Some(Command::Report(r)) => {
                let fs = r.path.as_deref().map(resolve_fs).transpose()?;
                let db_path = match (g.db, &fs) {
                    (Some(db), _) => db,
                    (None, Some((at, fs))) => default_db(fs, at, device_of(fs, at).as_deref())?.0,
                    (None, None) => bail!("report needs a path on the filesystem, or --db FILE"),
                };
                (Action::Report(ReportConfig { html: r.html, list: r.list }), db_path)
            }
        };
        Ok(Config { action, db_path, json: g.json, verbosity, bars, db_note })
    }

    /// How to scan, for the actions that scan.
    pub fn scan(&self) -> Option<&ScanConfig> {
        match &self.action {
            Action::Run { scan, .. } | Action::Scan(scan) => Some(scan),
            Action::Report(_) => None,
        }
    }
}

/// `--db`, or the default database of the scan's filesystem, with a note
/// when that is one kept apart from its twin's for the first time.
fn db_path(db: Option<PathBuf>, scan: &ScanConfig) -> Result<(PathBuf, Option<String>)> {
    match db {
        Some(db) => Ok((db, None)),
        None => default_db(&scan.fs, &scan.paths[0], scan.device.as_deref()),
    }
}

/// The default database of the filesystem `fs` that `at` is on, on the
/// device named `device` (see [`crate::db::owner`]), and what to say when
/// it is a new one kept apart from a twin's.
fn default_db(fs: &FsInfo, at: &Path, device: Option<&str>) -> Result<(PathBuf, Option<String>)> {
    let usual = default_db_path(&fs.uuid)?;
    let twins = sys::inode::open_path_readonly(at).map(|f| sys::twins::twins(fs, f.as_fd())).unwrap_or_default();
    let (path, apart) = crate::db::owner::choose(&usual, &fs.uuid, device, &twins);
    let note = (apart && !path.exists()).then(|| {
        format!(
            "{}: another mounted filesystem has its UUID {} (a clone of the device, or the original: {}); \
             this one keeps its records apart, in {}",
            display_path(at),
            fs.uuid,
            twins.join(", "),
            display_path(&path)
        )
    });
    Ok((path, note))
}

/// The stable name of the device under `at`, on filesystem `fs`.
fn device_of(fs: &FsInfo, at: &Path) -> Option<String> {
    let f = sys::inode::open_path_readonly(at).ok()?;
    sys::twins::device_name(fs, f.as_fd())
}

/// Resolve the options of a scan: globs compiled, paths made canonical and
/// checked to be on one filesystem; with `shares`, one dedupscan can share on.
fn scan_config(scan: ScanArgs, shares: bool) -> Result<ScanConfig> {
    let ScanArgs {
        paths,
        incremental: _,
        rehash,
        block_size,
        threads,
        exclude,
        exclude_from,
        include_readonly_snapshots,
        include_nocow,
        share_across_owners,
        drop_cache,
        max_runtime,
        metrics_file,
    } = scan;
    let excludes = excludes(exclude, &exclude_from)?;
    let (canon, fs) = one_filesystem(&paths)?;
    let in_fs = sys::mounts::paths_in_fs(&canon);
    let (canon, overlapping) = drop_overlaps(canon, &in_fs);
    if shares {
        let fs_name = match fs.kind {
            FsKind::Other => Some(fs_name(fs.magic)),
            FsKind::Xfs if sys::fs::xfs_has_reflink(&canon[0]) == Some(false) => {
                Some("XFS made with reflink=0".to_owned())
            }
            _ => None,
        };
        if let Some(fs) = fs_name {
            return Err(Unsupported { path: display_path(&paths[0]), fs }.into());
        }
    }
    // Hashing threads also keep reads in flight: on a cold disk most of
    // them wait for I/O, so more threads than CPUs keep both busy
    // (measured in docs/BENCHMARKS.md: 2 → 8 threads, 2.98 s → 2.49 s
    // on SMALL; 8 → 16 threads on FULL, btrfs, 0.90/0.74× → 0.80/0.68×
    // of a cold raw read). Each costs a 1 MiB read buffer.
    let threads = threads.unwrap_or_else(|| {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        (cpus * 8).clamp(8, 64)
    });
    // The kernel shares whole blocks of the filesystem only (a range that
    // starts inside one is refused with EINVAL), so fingerprints are never
    // finer than those: XFS made with `-b size=65536` gets 64 KiB blocks.
    let block_size = fs_block_floor(block_size, fs.block_size);
    let device = device_of(&fs, &canon[0]);
    Ok(ScanConfig {
        paths: canon,
        overlapping,
        fs,
        device,
        block_size,
        threads: threads.max(1),
        excludes,
        // A rerun carries on from what the database knows; --rehash
        // starts over.
        incremental: !rehash,
        include_readonly_snapshots,
        include_nocow,
        drop_cache,
        share_across_owners,
        max_runtime,
        metrics_file,
    })
}

/// The starting paths made canonical ([`resolve_fs`]), and their
/// filesystem: refused unless there is one and they are all on it.
fn one_filesystem(paths: &[PathBuf]) -> Result<(Vec<PathBuf>, FsInfo)> {
    if paths.is_empty() {
        bail!("no path given: name the directories to scan, e.g. `dedupscan /srv`");
    }
    let mut canon = Vec::new();
    let mut fs: Option<FsInfo> = None;
    for p in paths {
        let (c, info) = resolve_fs(p)?;
        match &fs {
            // By instance: a clone of the device mounted beside its
            // original has the same UUID, and the kernel shares nothing
            // between the two.
            Some(f) if f.instance != info.instance => bail!(
                "{} is on another filesystem ({}{}) than {} ({}); run dedupscan once per filesystem",
                display_path(p),
                info.uuid,
                if f.uuid == info.uuid { ", a clone of the same device" } else { "" },
                display_path(&paths[0]),
                f.uuid
            ),
            _ => fs = Some(info),
        }
        canon.push(c);
    }
    let fs = fs.expect("at least one path");
    Ok((canon, fs))
}

/// The fingerprint block size: the one asked for, or the filesystem's own
/// where that is larger (a power of two up to 1 MiB; anything else statfs
/// might say is ignored).
fn fs_block_floor(asked: u64, fs_block: u64) -> u64 {
    if fs_block.is_power_of_two() && fs_block <= 1 << 20 {
        asked.max(fs_block)
    } else {
        asked
    }
}

/// Split canonical starting paths into those to crawl and those that are
/// the same as or lie inside another one (each with a path covering it):
/// crawled twice, their files were counted twice, recorded twice and
/// planned against themselves. Compared by where they lie in the
/// filesystem (`in_fs`, [`sys::mounts::paths_in_fs`]), not by their own paths,
/// which a bind mount makes differ: `/srv/data` and a bind mount of it (or
/// of a directory in it) elsewhere were both crawled, and no file was
/// shared (exit 0). Compared by components (`/srv/a` is not inside
/// `/srv/ab`); of equal ones the first given is kept.
fn drop_overlaps(canon: Vec<PathBuf>, in_fs: &[PathBuf]) -> (Vec<PathBuf>, Vec<(PathBuf, PathBuf)>) {
    let covering = |i: usize| {
        let p = &in_fs[i];
        (in_fs.iter().enumerate())
            .find(|&(j, q)| j != i && p.starts_with(q) && (p != q || j < i))
            .map(|(j, _)| &canon[j])
    };
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    for (i, p) in canon.iter().enumerate() {
        match covering(i) {
            Some(q) => dropped.push((p.clone(), q.clone())),
            None => kept.push(p.clone()),
        }
    }
    (kept, dropped)
}

/// The `--exclude` globs and those of the `--exclude-from` files, checked
/// one by one (so the message names the culprit) and compiled.
fn excludes(mut globs: Vec<String>, files: &[PathBuf]) -> Result<Excludes> {
    for g in &globs {
        check_exclude(g).map_err(|e| anyhow::anyhow!("--exclude '{g}': {e}"))?;
    }
    for f in files {
        let text = std::fs::read_to_string(f).with_context(|| format!("--exclude-from {}", display_path(f)))?;
        for (n, line) in text.lines().enumerate() {
            let g = line.trim();
            if g.is_empty() || g.starts_with('#') {
                continue;
            }
            check_exclude(g).map_err(|e| anyhow::anyhow!("{}:{}: '{g}': {e}", display_path(f), n + 1))?;
            globs.push(g.to_owned());
        }
    }
    Excludes::new(globs).context("invalid --exclude glob")
}

/// Usage errors of one exclude glob, found before the database is opened:
/// a glob that does not parse, or a relative one. Globs are matched against
/// full paths, so a relative glob (`tmp/**`) would silently never match;
/// rather than guess what it is relative to (the current directory? each
/// scanned path? any depth?), it is refused with the two ways to say it.
fn check_exclude(glob: &str) -> Result<(), String> {
    globset::Glob::new(glob).map_err(|e| e.kind().to_string())?;
    if !(glob.starts_with('/') || glob.starts_with('*')) {
        let tail = glob.trim_start_matches("./");
        return Err(format!(
            "relative glob: globs are matched against the full path, so this one would never match; \
             write '/full/path/{tail}' or '**/{tail}'"
        ));
    }
    Ok(())
}

/// A filesystem's name from its `statfs` magic, for messages.
fn fs_name(magic: i64) -> String {
    match magic {
        0xEF53 => "ext2/ext3/ext4",
        0x0102_1994 => "tmpfs",
        0x8584_58f6 => "ramfs",
        0x2FC1_2FC1 => "zfs",
        0xF2F5_2010 => "f2fs",
        0xCA45_1A4E => "bcachefs",
        0x794C_7630 => "overlayfs",
        0x6969 => "nfs",
        0xFF53_4D42 | 0xFE53_4D42 => "cifs/smb",
        0x6573_5546 => "a FUSE filesystem",
        0x4d44 => "vfat",
        0x5346_544e => "ntfs",
        0x7371_7368 => "squashfs",
        _ => return format!("a filesystem with magic {magic:#x}"),
    }
    .to_owned()
}

/// Canonical path and the filesystem it is on. A symlink on the way is
/// followed only if nobody but root or this user could have put it there
/// ([`sys::resolve`]): `/home/alice/vms` given as a starting path is
/// alice's to replace with a symlink to `/root` at any moment, and was
/// followed, so the run read, recorded and shared files it was never given.
/// Such a path is refused (exit 2) rather than crawled: the administrator
/// gives the path the link leads to, or a directory above it. The result
/// is opened later without following any symlink (`sys::beneath::Tree`),
/// so a component swapped for one after this fails the open.
fn resolve_fs(p: &Path) -> Result<(PathBuf, FsInfo)> {
    let c = match sys::resolve::resolve(p, true) {
        Ok((c, missing)) if missing.is_empty() => c,
        Ok(_) => Err(std::io::Error::from(std::io::ErrorKind::NotFound))
            .with_context(|| format!("{}: cannot open", display_path(p)))?,
        Err(sys::resolve::Resolve::Io(e)) => Err(e).with_context(|| format!("{}: cannot open", display_path(p)))?,
        Err(sys::resolve::Resolve::Unsafe(why)) => bail!(
            "{}: refused: {why} (another user could point it anywhere; give the path it leads to)",
            display_path(p)
        ),
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excludes_must_parse_and_be_absolute() {
        for ok in ["/srv/tmp/**", "**/*.qcow2", "*.iso", "/srv/{a,b}/**"] {
            assert!(check_exclude(ok).is_ok(), "{ok}");
        }
        for bad in ["[abc", "/srv/{a", "**/[x"] {
            assert!(check_exclude(bad).is_err(), "{bad}");
        }
        let e = check_exclude("./tmp/**").unwrap_err();
        assert!(e.contains("relative") && e.contains("'**/tmp/**'"), "{e}");
        assert!(check_exclude("tmp").is_err());
    }

    #[test]
    fn fingerprints_are_never_finer_than_the_filesystems_blocks() {
        assert_eq!(fs_block_floor(4096, 4096), 4096);
        assert_eq!(fs_block_floor(4096, 1024), 4096, "XFS with 1 KiB blocks keeps 4 KiB");
        assert_eq!(fs_block_floor(4096, 65536), 65536, "XFS with 64 KiB blocks");
        assert_eq!(fs_block_floor(1 << 20, 65536), 1 << 20);
        assert_eq!(fs_block_floor(4096, 3 << 12), 4096, "not a power of two: ignored");
        assert_eq!(fs_block_floor(4096, 4 << 20), 4096, "beyond 1 MiB: ignored");
    }

    #[test]
    fn a_starting_path_inside_another_or_given_twice_is_dropped() {
        let p = |s: &str| PathBuf::from(s);
        let same = |v: Vec<PathBuf>| {
            let in_fs = v.clone();
            drop_overlaps(v, &in_fs)
        };
        let (kept, dropped) = same(vec![p("/t9"), p("/t9/sub"), p("/t9"), p("/t90"), p("/x/f"), p("/x")]);
        assert_eq!(kept, vec![p("/t9"), p("/t90"), p("/x")]);
        assert_eq!(dropped, vec![(p("/t9/sub"), p("/t9")), (p("/t9"), p("/t9")), (p("/x/f"), p("/x"))]);
        // Nested three deep, the innermost first: only the outermost stays.
        let (kept, dropped) = same(vec![p("/a/b/c"), p("/a/b"), p("/a")]);
        assert_eq!(kept, vec![p("/a")]);
        assert_eq!(dropped.len(), 2);
        // Bind mounts: `/b` shows `/t9`, `/c` shows `/t9/sub`.
        let (kept, dropped) = drop_overlaps(vec![p("/t9"), p("/b"), p("/c")], &[p("/t9"), p("/t9"), p("/t9/sub")]);
        assert_eq!(kept, vec![p("/t9")]);
        assert_eq!(dropped, vec![(p("/b"), p("/t9")), (p("/c"), p("/t9"))]);
    }

    #[test]
    fn filesystem_names() {
        assert_eq!(fs_name(0xEF53), "ext2/ext3/ext4");
        assert_eq!(fs_name(0x0102_1994), "tmpfs");
        assert_eq!(fs_name(0x1234), "a filesystem with magic 0x1234");
    }
}
