//! Progress and messages, without tying the pipeline to a terminal.
//!
//! The pipeline talks to a [`Progress`]; on a terminal [`Bars`] draws an
//! indicatif bar per phase, elsewhere (systemd, cron, a pipe) [`LogLines`]
//! prints one line per phase and a short status line every few seconds.
//! Warnings go through the same object so they never tear a bar.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How chatty messages are: -q lowers, -v raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verbosity {
    /// Only the final report and fatal errors.
    Quiet,
    /// Warnings about individual paths, phase summaries.
    Normal,
    /// Also details of every phase.
    Verbose,
}

/// Receives progress of the pipeline. Implementations must be cheap: `inc`
/// is called from the hashing threads for every file.
pub trait Progress: Send + Sync {
    /// A new phase starts; `total` is known work (files or bytes), if any.
    fn phase(&self, label: &str, total: Option<u64>, bytes: bool);
    /// `n` more units of the current phase are done.
    fn inc(&self, n: u64);
    /// The current phase is over; `summary` says what it did.
    fn finish_phase(&self, summary: &str);
    /// A problem with one path; the run goes on.
    fn warn(&self, msg: &str);
    /// Detail for `-v`.
    fn info(&self, msg: &str);
}

/// Draws nothing and says nothing: for library use and tests.
pub struct Silent;

impl Progress for Silent {
    fn phase(&self, _: &str, _: Option<u64>, _: bool) {}
    fn inc(&self, _: u64) {}
    fn finish_phase(&self, _: &str) {}
    fn warn(&self, _: &str) {}
    fn info(&self, _: &str) {}
}

/// indicatif bars on a terminal (stderr).
pub struct Bars {
    bar: Mutex<Option<ProgressBar>>,
    verbosity: Verbosity,
}

impl Bars {
    pub fn new(verbosity: Verbosity) -> Bars {
        Bars { bar: Mutex::new(None), verbosity }
    }

    fn print(&self, msg: &str) {
        match &*self.bar.lock().unwrap() {
            Some(b) => b.suspend(|| eprintln!("{msg}")),
            None => eprintln!("{msg}"),
        }
    }
}

impl Progress for Bars {
    fn phase(&self, label: &str, total: Option<u64>, bytes: bool) {
        let bar = match total {
            Some(t) => ProgressBar::with_draw_target(Some(t), ProgressDrawTarget::stderr()),
            None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
        };
        let tmpl = match (total.is_some(), bytes) {
            (true, true) => "{prefix:>8} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            (true, false) => "{prefix:>8} [{bar:30}] {pos}/{len} eta {eta}",
            (false, true) => "{prefix:>8} {spinner} {bytes} {bytes_per_sec}",
            (false, false) => "{prefix:>8} {spinner} {pos}",
        };
        bar.set_style(ProgressStyle::with_template(tmpl).expect("valid template").progress_chars("=> "));
        bar.set_prefix(label.to_owned());
        bar.enable_steady_tick(Duration::from_millis(200));
        *self.bar.lock().unwrap() = Some(bar);
    }

    fn inc(&self, n: u64) {
        if let Some(b) = &*self.bar.lock().unwrap() {
            b.inc(n);
        }
    }

    fn finish_phase(&self, summary: &str) {
        if let Some(b) = self.bar.lock().unwrap().take() {
            b.finish_and_clear();
        }
        if self.verbosity >= Verbosity::Normal && !summary.is_empty() {
            eprintln!("{summary}");
        }
    }

    fn warn(&self, msg: &str) {
        if self.verbosity >= Verbosity::Normal {
            self.print(&format!("warning: {msg}"));
        }
    }

    fn info(&self, msg: &str) {
        if self.verbosity >= Verbosity::Verbose {
            self.print(msg);
        }
    }
}

/// Plain log lines for the journal: no control characters, a status line at
/// most every [`LogLines::EVERY`].
pub struct LogLines {
    verbosity: Verbosity,
    label: Mutex<String>,
    done: AtomicU64,
    total: AtomicU64,
    last: Mutex<Instant>,
}

impl LogLines {
    pub const EVERY: Duration = Duration::from_secs(10);

    pub fn new(verbosity: Verbosity) -> LogLines {
        LogLines {
            verbosity,
            label: Mutex::new(String::new()),
            done: AtomicU64::new(0),
            total: AtomicU64::new(0),
            last: Mutex::new(Instant::now()),
        }
    }
}

impl Progress for LogLines {
    fn phase(&self, label: &str, total: Option<u64>, _bytes: bool) {
        *self.label.lock().unwrap() = label.to_owned();
        self.done.store(0, Ordering::Relaxed);
        self.total.store(total.unwrap_or(0), Ordering::Relaxed);
        *self.last.lock().unwrap() = Instant::now();
        if self.verbosity >= Verbosity::Verbose {
            eprintln!("{label}: started");
        }
    }

    fn inc(&self, n: u64) {
        let done = self.done.fetch_add(n, Ordering::Relaxed) + n;
        if self.verbosity < Verbosity::Normal {
            return;
        }
        let mut last = self.last.lock().unwrap();
        if last.elapsed() >= Self::EVERY {
            *last = Instant::now();
            let total = self.total.load(Ordering::Relaxed);
            let label = self.label.lock().unwrap();
            if total > 0 {
                eprintln!("{label}: {done}/{total} ({:.0}%)", done as f64 * 100.0 / total as f64);
            } else {
                eprintln!("{label}: {done}");
            }
        }
    }

    fn finish_phase(&self, summary: &str) {
        if self.verbosity >= Verbosity::Normal && !summary.is_empty() {
            eprintln!("{summary}");
        }
    }

    fn warn(&self, msg: &str) {
        if self.verbosity >= Verbosity::Normal {
            eprintln!("warning: {msg}");
        }
    }

    fn info(&self, msg: &str) {
        if self.verbosity >= Verbosity::Verbose {
            eprintln!("{msg}");
        }
    }
}
