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

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::db::Db;

/// Meta key: the last complete runs, newest first, as JSON.
const COMPLETE_RUNS: &str = "complete_share_runs";
/// Meta key of builds that kept one complete run, whatever its paths and
/// settings (read when [`COMPLETE_RUNS`] is not there yet).
const LAST_SHARE_RUN: &str = "last_complete_share_run";
/// Runs kept: a few sets of starting paths in turn (nightly `/srv`, now
/// and then `/srv/a` by hand) never reach it.
const KEPT: usize = 16;

/// One complete run: its id, starting paths (hex of their bytes: paths
/// need not be UTF-8) and plan settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Complete {
    run: i64,
    roots: Vec<String>,
    settings: String,
}

impl Complete {
    pub(super) fn new(run: i64, roots: &[PathBuf], settings: String) -> Complete {
        Complete { run, roots: roots.iter().map(|r| hex(r)).collect(), settings }
    }

    /// Whether every path of `other` is one of ours or inside one.
    fn covers(&self, other: &Complete) -> bool {
        other.roots.iter().all(|o| self.roots.iter().any(|r| inside(o, r)))
    }
}

/// The run the incremental plan of a run over `roots` with `settings` may
/// build on: the newest complete run that saw all of `roots`, with the
/// same settings. `None`: plan every file.
pub(super) fn last_complete(db: &Db, roots: &[PathBuf], settings: &str) -> rusqlite::Result<Option<i64>> {
    let this = Complete::new(0, roots, settings.to_owned());
    Ok(match db.meta(COMPLETE_RUNS)? {
        Some(json) => choose(&parse(&json), &this),
        // Recorded by a build that kept one run: as that build did.
        None => db.meta(LAST_SHARE_RUN)?.and_then(|v| v.parse().ok()),
    })
}

/// Record `done` as the newest complete run.
pub(super) fn record(db: &Db, done: Complete) -> rusqlite::Result<()> {
    let old = db.meta(COMPLETE_RUNS)?.map(|j| parse(&j)).unwrap_or_default();
    let json = serde_json::to_string(&recorded(old, done)).expect("serializable");
    db.set_meta(COMPLETE_RUNS, &json)
}

/// The newest of `runs` (newest first) that covers `this`, with its
/// settings.
fn choose(runs: &[Complete], this: &Complete) -> Option<i64> {
    runs.iter().find(|r| r.settings == this.settings && r.covers(this)).map(|r| r.run)
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
        Complete::new(run, &roots, settings.to_owned())
    }

    #[test]
    fn a_run_builds_on_the_newest_run_that_saw_all_it_sees() {
        let srv = run(1, &["/srv"], "s");
        let a = run(2, &["/srv/a"], "s");
        let runs = recorded(recorded(vec![], srv), a);
        // Over /srv: the run over /srv/a saw less; build on the one before.
        assert_eq!(choose(&runs, &run(0, &["/srv"], "s")), Some(1));
        assert_eq!(choose(&runs, &run(0, &["/srv/a"], "s")), Some(2));
        assert_eq!(choose(&runs, &run(0, &["/srv/a/x", "/srv/b"], "s")), Some(1));
        // Not inside: a name that only starts the same, another tree, the
        // root above.
        assert_eq!(choose(&runs, &run(0, &["/srv2"], "s")), None);
        assert_eq!(choose(&runs, &run(0, &["/home"], "s")), None);
        assert_eq!(choose(&runs, &run(0, &["/"], "s")), None);
        // Other settings: none.
        assert_eq!(choose(&runs, &run(0, &["/srv/a"], "t")), None);
        // A newer run over /srv makes both older ones useless.
        let runs = recorded(runs, run(3, &["/srv"], "s"));
        assert_eq!(runs, vec![run(3, &["/srv"], "s")]);
        // One with other settings does not.
        let runs = recorded(runs, run(4, &["/srv"], "t"));
        assert_eq!(runs.len(), 2);
        assert_eq!(choose(&runs, &run(0, &["/srv/a"], "s")), Some(3));
        assert_eq!(choose(&runs, &run(0, &["/srv/a"], "t")), Some(4));
        // The root covers everything.
        assert_eq!(choose(&recorded(vec![], run(5, &["/"], "s")), &run(0, &["/srv"], "s")), Some(5));
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
    }
}
