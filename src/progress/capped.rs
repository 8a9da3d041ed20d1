//! At most [`PATH_WARNINGS_SHOWN`] warnings about single paths a run.
//!
//! A user can make thousands of their files change, vanish or fail under a
//! root run (`touch` in a loop is enough), and each was a warning line. In
//! the journal, past journald's rate limit (10,000 messages in 30 s by
//! default) lines are dropped — the run's own last ones, the filesystem
//! that stopped, the summary, with them — and on a terminal the rest
//! scrolls away. So after that many, warnings about single paths are
//! counted, not shown: the first one over the limit says so, and
//! [`Capped::finish`] says how many were left out. `-v` shows every one.
//! Run-wide warnings ([`Progress::warn_run`]) are never held back, and the
//! report's counts are what they were.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Progress, Verbosity};

/// Warnings about single paths a run shows without `-v`.
pub const PATH_WARNINGS_SHOWN: u64 = 200;

/// A [`Progress`] that passes everything on to another, and holds back the
/// warnings about single paths past [`PATH_WARNINGS_SHOWN`].
pub struct Capped {
    inner: Box<dyn Progress>,
    /// `-v`: show every warning.
    all: bool,
    /// Warnings about single paths so far, shown or not.
    seen: AtomicU64,
}

impl Capped {
    /// `inner`, capped unless `verbosity` is `-v`.
    pub fn new(inner: Box<dyn Progress>, verbosity: Verbosity) -> Capped {
        Capped { inner, all: verbosity >= Verbosity::Verbose, seen: AtomicU64::new(0) }
    }

    /// Say how many warnings about single paths were not shown, if any.
    pub fn finish(&self) {
        let held = self.seen.load(Ordering::Relaxed).saturating_sub(PATH_WARNINGS_SHOWN);
        if !self.all && held > 0 {
            self.inner.warn_run(&format!(
                "{held} more warnings about single paths were not shown (-v shows every one; the report counts them)"
            ));
        }
    }
}

impl Progress for Capped {
    fn phase(&self, label: &str, total: Option<u64>, bytes: bool) {
        self.inner.phase(label, total, bytes);
    }
    fn inc(&self, n: u64) {
        self.inner.inc(n);
    }
    fn finish_phase(&self, summary: &str) {
        self.inner.finish_phase(summary);
    }
    fn set_total(&self, total: u64, files: Option<u64>) {
        self.inner.set_total(total, files);
    }
    fn inc_files(&self, n: u64) {
        self.inner.inc_files(n);
    }
    fn warn(&self, msg: &str) {
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        if self.all || n < PATH_WARNINGS_SHOWN {
            self.inner.warn(msg);
        } else if n == PATH_WARNINGS_SHOWN {
            self.inner.warn_run(&format!(
                "more than {PATH_WARNINGS_SHOWN} warnings about single paths: the rest are counted, not shown \
                 (-v shows every one)"
            ));
        }
    }
    fn warn_run(&self, msg: &str) {
        self.inner.warn_run(msg);
    }
    fn info(&self, msg: &str) {
        self.inner.info(msg);
    }
    fn shows_info(&self) -> bool {
        self.inner.shows_info()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Keeps what it is told to say.
    #[derive(Clone, Default)]
    struct Said(Arc<Mutex<Vec<String>>>);

    impl Progress for Said {
        fn phase(&self, _: &str, _: Option<u64>, _: bool) {}
        fn inc(&self, _: u64) {}
        fn finish_phase(&self, _: &str) {}
        fn warn(&self, msg: &str) {
            self.0.lock().unwrap().push(format!("path: {msg}"));
        }
        fn warn_run(&self, msg: &str) {
            self.0.lock().unwrap().push(format!("run: {msg}"));
        }
        fn info(&self, _: &str) {}
    }

    fn flood(verbosity: Verbosity, paths: u64) -> Vec<String> {
        let said = Said::default();
        let p = Capped::new(Box::new(said.clone()), verbosity);
        p.warn_run("before");
        for i in 0..paths {
            p.warn(&format!("f{i}: changed"));
        }
        p.warn_run("after");
        p.finish();
        let out = said.0.lock().unwrap().clone();
        out
    }

    #[test]
    fn a_flood_of_path_warnings_is_cut_and_counted_and_run_warnings_stay() {
        let out = flood(Verbosity::Normal, 10_000);
        let paths = out.iter().filter(|l| l.starts_with("path: ")).count() as u64;
        assert_eq!(paths, PATH_WARNINGS_SHOWN);
        assert_eq!(out[0], "run: before");
        assert!(out.iter().any(|l| l.starts_with("run: more than 200 warnings about single paths")), "{out:?}");
        assert!(out.contains(&"run: after".to_owned()), "{out:?}");
        assert_eq!(
            out.last().unwrap(),
            "run: 9800 more warnings about single paths were not shown (-v shows every one; the report counts them)"
        );
    }

    #[test]
    fn under_the_limit_or_with_v_everything_is_shown() {
        let out = flood(Verbosity::Normal, PATH_WARNINGS_SHOWN);
        assert_eq!(out.len() as u64, PATH_WARNINGS_SHOWN + 2, "{out:?}");
        let out = flood(Verbosity::Verbose, 1000);
        assert_eq!(out.len(), 1002, "{out:?}");
    }
}
