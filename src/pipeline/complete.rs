//! Which earlier run an incremental plan may build on ([`Complete`]).
//!
//! A real run that went through all of its plan matched every file it saw
//! against every other file it saw, under its settings. A later
//! incremental run may skip the groups of files hashed before it only if
//! that run saw at least what this one sees, with the same settings. A run
//! over `/srv/a` matches its new files against `/srv/a` only: taken as the
//! last complete run of `/srv`, it hid the copies of those files elsewhere
//! in `/srv` from every later run (their groups held no file newer than
//! it). So the database keeps the last complete runs by starting paths and
//! settings, and a run builds on the newest whose paths cover its own.
//!
//! Matched once is not shared for good. `btrfs filesystem defragment`
//! (with `-c` to compress, or on fragmented files) rewrites extents
//! unshared and leaves the files' times as they were: to change detection
//! nothing happened, and no incremental plan would look at those files
//! again. Nor would it retry a destination the kernel refused with an
//! error other than a full disk. So each complete run also carries when
//! the newest run it descends from planned every file (`full_at`), and
//! once that is older than `--full-plan-days` the next run plans every
//! file again. It reads no file data: the share phase maps the planned
//! files and submits only what is no longer shared.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::db::Db;
use crate::progress::Progress;

/// Meta key: the last complete runs, newest first, as JSON.
const COMPLETE_RUNS: &str = "complete_share_runs";
/// Meta key of builds that kept one complete run, whatever its paths and
/// settings (read when [`COMPLETE_RUNS`] is not there yet).
const LAST_SHARE_RUN: &str = "last_complete_share_run";
/// Runs kept: a few sets of starting paths in turn (nightly `/srv`, now
/// and then `/srv/a` by hand) never reach it.
const KEPT: usize = 16;

/// One complete run: its id, starting paths (hex of their bytes: paths
/// need not be UTF-8), plan settings, and when the newest run it descends
/// from planned every file (unix seconds; 0 in entries of builds before
/// this one: the next run plans every file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Complete {
    run: i64,
    roots: Vec<String>,
    settings: String,
    #[serde(default)]
    full_at: u64,
}

/// What a run's plan builds on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Base {
    /// Nothing: every file is planned.
    All,
    /// The complete run `run`, which descends from a full plan at `full_at`.
    Run { run: i64, full_at: u64 },
}

impl Base {
    /// The complete run to build on, if any.
    pub(super) fn run(self) -> Option<i64> {
        match self {
            Base::All => None,
            Base::Run { run, .. } => Some(run),
        }
    }

    /// `full_at` of a run that completes on this base at `now`.
    fn full_at(self, now: u64) -> u64 {
        match self {
            Base::All => now,
            Base::Run { full_at, .. } => full_at,
        }
    }
}

impl Complete {
    /// Run `run` over `roots` with `settings` went through its plan, which
    /// built on `base`.
    pub(super) fn new(run: i64, roots: &[PathBuf], settings: String, base: Base) -> Complete {
        let full_at = base.full_at(unix_now());
        Complete { run, roots: roots.iter().map(|r| hex(r)).collect(), settings, full_at }
    }

    /// Whether every path of `other` is one of ours or inside one.
    fn covers(&self, other: &Complete) -> bool {
        other.roots.iter().all(|o| self.roots.iter().any(|r| inside(o, r)))
    }
}

/// What the plan of a run over `roots` with `settings` builds on: the
/// newest complete run that saw all of `roots`, with the same settings,
/// unless its line of incremental plans started more than `full_plan_days`
/// days ago (0: never too old). With `incremental`, `-v` says why a run
/// plans every file.
pub(super) fn base(
    db: &Db,
    (roots, settings): (&[PathBuf], &str),
    (incremental, full_plan_days): (bool, u64),
    progress: &dyn Progress,
) -> rusqlite::Result<Base> {
    if !incremental {
        return Ok(Base::All);
    }
    let this = Complete::new(0, roots, settings.to_owned(), Base::All);
    let base = match db.meta(COMPLETE_RUNS)? {
        Some(json) => choose(&parse(&json), &this),
        // Recorded by a build that kept one run: as that build did, once.
        None => db.meta(LAST_SHARE_RUN)?.and_then(|v| v.parse().ok()).map(|run| Base::Run { run, full_at: 0 }),
    };
    Ok(match too_old(base, unix_now(), full_plan_days) {
        Ok(b) => b,
        Err(why) => {
            progress.info(&format!("planning every file: {why}"));
            Base::All
        }
    })
}

/// `base`, or why every file is planned instead.
fn too_old(base: Option<Base>, now: u64, full_plan_days: u64) -> Result<Base, String> {
    match base {
        None => Err("no complete run over these paths with these settings yet".into()),
        Some(Base::Run { full_at, .. }) if full_plan_days > 0 && now.saturating_sub(full_at) > full_plan_days * DAY => {
            Err(match full_at {
                0 => "no run recorded when every file was last planned".into(),
                t => format!(
                    "every file was last planned {} days ago (--full-plan-days {full_plan_days}): \
                     sharing undone since without a change to the files (a defragment) is found again",
                    now.saturating_sub(t) / DAY
                ),
            })
        }
        Some(b) => Ok(b),
    }
}

const DAY: u64 = 86_400;

fn unix_now() -> u64 {
    crate::db::unix_now().max(0) as u64
}

/// Record `done` as the newest complete run.
pub(super) fn record(db: &Db, done: Complete) -> rusqlite::Result<()> {
    let old = db.meta(COMPLETE_RUNS)?.map(|j| parse(&j)).unwrap_or_default();
    let json = serde_json::to_string(&recorded(old, done)).expect("serializable");
    db.set_meta(COMPLETE_RUNS, &json)
}

/// The newest of `runs` (newest first) that covers `this`, with its
/// settings.
fn choose(runs: &[Complete], this: &Complete) -> Option<Base> {
    let r = runs.iter().find(|r| r.settings == this.settings && r.covers(this))?;
    Some(Base::Run { run: r.run, full_at: r.full_at })
}

/// `runs` with `done` first; the runs it makes useless (same settings,
/// paths it covers: any run they would serve, it serves, and it is newer)
/// dropped; at most [`KEPT`].
fn recorded(runs: Vec<Complete>, done: Complete) -> Vec<Complete> {
    let rest = runs.into_iter().filter(|r| !(r.settings == done.settings && done.covers(r)));
    std::iter::once(done.clone()).chain(rest).take(KEPT).collect()
}

/// A damaged entry is no entry: the next run plans every file.
fn parse(json: &str) -> Vec<Complete> {
    serde_json::from_str(json).unwrap_or_default()
}

fn hex(p: &Path) -> String {
    p.as_os_str().as_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether the path `a` (hex) is `b` (hex) or inside it.
fn inside(a: &str, b: &str) -> bool {
    a == b || (a.starts_with(b) && (b.ends_with("2f") || a[b.len()..].starts_with("2f")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(run: i64, roots: &[&str], settings: &str) -> Complete {
        let roots: Vec<PathBuf> = roots.iter().map(PathBuf::from).collect();
        Complete::new(run, &roots, settings.to_owned(), Base::All)
    }

    /// The id of the run `choose` builds on.
    fn chosen(runs: &[Complete], this: &Complete) -> Option<i64> {
        choose(runs, this).and_then(Base::run)
    }

    #[test]
    fn a_run_builds_on_the_newest_run_that_saw_all_it_sees() {
        let srv = run(1, &["/srv"], "s");
        let a = run(2, &["/srv/a"], "s");
        let runs = recorded(recorded(vec![], srv), a);
        // Over /srv: the run over /srv/a saw less; build on the one before.
        assert_eq!(chosen(&runs, &run(0, &["/srv"], "s")), Some(1));
        assert_eq!(chosen(&runs, &run(0, &["/srv/a"], "s")), Some(2));
        assert_eq!(chosen(&runs, &run(0, &["/srv/a/x", "/srv/b"], "s")), Some(1));
        // Not inside: a name that only starts the same, another tree, the
        // root above.
        assert_eq!(chosen(&runs, &run(0, &["/srv2"], "s")), None);
        assert_eq!(chosen(&runs, &run(0, &["/home"], "s")), None);
        assert_eq!(chosen(&runs, &run(0, &["/"], "s")), None);
        // Other settings: none.
        assert_eq!(chosen(&runs, &run(0, &["/srv/a"], "t")), None);
        // A newer run over /srv makes both older ones useless.
        let runs = recorded(runs, run(3, &["/srv"], "s"));
        assert_eq!(runs, vec![run(3, &["/srv"], "s")]);
        // One with other settings does not.
        let runs = recorded(runs, run(4, &["/srv"], "t"));
        assert_eq!(runs.len(), 2);
        assert_eq!(chosen(&runs, &run(0, &["/srv/a"], "s")), Some(3));
        assert_eq!(chosen(&runs, &run(0, &["/srv/a"], "t")), Some(4));
        // The root covers everything.
        assert_eq!(chosen(&recorded(vec![], run(5, &["/"], "s")), &run(0, &["/srv"], "s")), Some(5));
    }

    #[test]
    fn at_most_a_few_runs_are_kept_and_damage_means_none() {
        let mut runs = vec![];
        for i in 0..40 {
            runs = recorded(runs, run(i, &[&format!("/srv/d{i}")], "s"));
        }
        assert_eq!(runs.len(), KEPT);
        assert_eq!(runs[0].run, 39);
        assert!(parse("{not json").is_empty());
        let json = serde_json::to_string(&runs).unwrap();
        assert_eq!(parse(&json), runs);
        // An entry of an older build, without `full_at`: the next run
        // plans every file.
        let old = parse(r#"[{"run":7,"roots":["2f737276"],"settings":"s"}]"#);
        let base = choose(&old, &run(0, &["/srv"], "s"));
        assert_eq!(base, Some(Base::Run { run: 7, full_at: 0 }));
        assert!(too_old(base, unix_now(), 7).is_err());
    }

    #[test]
    fn every_file_is_planned_again_once_the_last_full_plan_is_too_old() {
        let (now, full) = (1_800_000_000, 1_800_000_000 - 7 * DAY);
        let on = |full_at| Some(Base::Run { run: 3, full_at });
        assert_eq!(too_old(on(full), now, 7), Ok(Base::Run { run: 3, full_at: full }), "7 days: not yet");
        let why = too_old(on(full - 1), now, 7).unwrap_err();
        assert!(why.contains("7 days ago"), "{why}");
        assert_eq!(too_old(on(full - 1), now, 8), Ok(Base::Run { run: 3, full_at: full - 1 }));
        assert_eq!(too_old(on(0), now, 0), Ok(Base::Run { run: 3, full_at: 0 }), "0: never");
        assert!(too_old(None, now, 0).is_err(), "nothing to build on");
        // A run that plans every file starts a new line; one built on a
        // run carries that run's start on.
        assert_eq!(Base::All.full_at(now), now);
        assert_eq!(Base::Run { run: 3, full_at: full }.full_at(now), full);
        let runs = recorded(vec![], Complete { full_at: full, ..run(4, &["/srv"], "s") });
        assert_eq!(choose(&runs, &run(0, &["/srv/a"], "s")), Some(Base::Run { run: 4, full_at: full }));
    }
}
