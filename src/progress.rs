//! Progress and messages, without tying the pipeline to a terminal.
//!
//! The pipeline talks to a [`Progress`]; on a terminal [`Bars`] draws an
//! indicatif bar per phase, elsewhere (systemd, cron, a pipe) [`LogLines`]
//! prints one line per phase and a short status line every few seconds.
//! Warnings go through the same object so they never tear a bar.
//!
//! Every message has one shape, `dedupscan: LEVEL: PATH: reason`, and goes
//! through [`emit`]: when stderr is the journal (systemd sets
//! `JOURNAL_STREAM` to stderr's `dev:ino`), each line carries its syslog
//! priority (`<3>` error, `<4>` warning, `<6>` info) so that
//! `journalctl -p warning` finds the warnings.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

use crate::display::human;

mod capped;
pub use capped::{Capped, PATH_WARNINGS_SHOWN};

/// How serious a message is; its number is the syslog priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// `dedupscan: error:`, the run cannot go on.
    Error = 3,
    /// `dedupscan: warning:`, a path or range left alone.
    Warning = 4,
    /// Anything else worth a line (`-v`).
    Info = 6,
}

/// Whether stderr is connected to the journal: `JOURNAL_STREAM` names the
/// `dev:ino` of the stream systemd gave us, and stderr is still that stream
/// (a redirect in a unit's script would make it something else).
pub fn stderr_is_journal() -> bool {
    static IS: OnceLock<bool> = OnceLock::new();
    *IS.get_or_init(|| {
        let Some(v) = std::env::var_os("JOURNAL_STREAM") else { return false };
        let Some((dev, ino)) = v.to_str().and_then(|s| s.split_once(':')) else { return false };
        let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else { return false };
        use std::os::fd::AsFd;
        match nix::sys::stat::fstat(std::io::stderr().as_fd()) {
            Ok(st) => {
                let (d, i): (u64, u64) = (st.st_dev, st.st_ino);
                d == dev && i == ino
            }
            Err(_) => false,
        }
    })
}

/// One message on stderr as lines, each with its journal priority prefix
/// when stderr is the journal.
pub fn emit(level: Level, msg: &str) {
    let _ = std::io::Write::write_all(
        &mut std::io::stderr().lock(),
        format_lines(level, msg, stderr_is_journal()).as_bytes(),
    );
}

fn format_lines(level: Level, msg: &str, journal: bool) -> String {
    let mut out = String::with_capacity(msg.len() + 8);
    for line in msg.lines() {
        if journal {
            let _ = write!(out, "<{}>", level as u8);
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// `dedupscan: warning: MSG`, the one shape of a warning.
pub fn warning_line(msg: &str) -> String {
    format!("dedupscan: warning: {msg}")
}

/// Print a fatal error: `dedupscan: error: ...` with its causes, each said
/// once (an I/O error is often both a cause and part of its context's text:
/// "Read-only file system (os error 30)" would otherwise appear twice).
pub fn print_error(e: &anyhow::Error) {
    emit(Level::Error, &format!("dedupscan: error: {}", error_text(e)));
}

/// The error and its causes joined with `: `, leaving out a cause whose text
/// the message so far already contains, or that only prefixes the previous
/// one with a code (SQLite's "Error code 11: database disk image is
/// malformed" under "database disk image is malformed").
pub fn error_text(e: &anyhow::Error) -> String {
    let mut s = String::new();
    let mut last = String::new();
    for cause in e.chain() {
        let c = cause.to_string();
        if s.contains(&c) || (!last.is_empty() && c.ends_with(&last)) {
            continue;
        }
        if !s.is_empty() {
            s.push_str(": ");
        }
        s.push_str(&c);
        last = c;
    }
    s
}

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
    /// The current phase's total is known now (e.g. the crawl has ended):
    /// `total` units, `files` files. Turns a spinner into a bar with an ETA.
    fn set_total(&self, _total: u64, _files: Option<u64>) {}
    /// `n` more files of the current phase are done (alongside [`Progress::inc`]).
    fn inc_files(&self, _n: u64) {}
    /// A problem with one path, as `PATH: reason`; the run goes on. The
    /// binary shows at most [`PATH_WARNINGS_SHOWN`] of them a run without
    /// `-v` ([`Capped`]).
    fn warn(&self, msg: &str);
    /// A problem with the run as a whole (a filesystem that stopped, an
    /// exclude that matched nothing, the database upgraded): never held
    /// back by [`Capped`].
    fn warn_run(&self, msg: &str) {
        self.warn(msg);
    }
    /// Detail for `-v`.
    fn info(&self, msg: &str);
    /// Whether [`Progress::info`] is shown: detail that costs something
    /// to put together (a path resolved) is not, when it would not be.
    fn shows_info(&self) -> bool {
        true
    }
}

/// Draws nothing and says nothing: for library use and tests.
pub struct Silent;

impl Progress for Silent {
    fn phase(&self, _: &str, _: Option<u64>, _: bool) {}
    fn inc(&self, _: u64) {}
    fn finish_phase(&self, _: &str) {}
    fn warn(&self, _: &str) {}
    fn info(&self, _: &str) {}
    fn shows_info(&self) -> bool {
        false
    }
}

/// Files done and files expected in the current phase (0: not known yet),
/// shared with the bar's template.
#[derive(Default)]
struct FileCounts {
    done: AtomicU64,
    total: AtomicU64,
}

impl FileCounts {
    fn reset(&self) {
        self.done.store(0, Ordering::Relaxed);
        self.total.store(0, Ordering::Relaxed);
    }

    /// `12 files`, `12/40 files`, or nothing before the first file.
    fn text(&self) -> String {
        let (done, total) = (self.done.load(Ordering::Relaxed), self.total.load(Ordering::Relaxed));
        match (done, total) {
            (0, 0) => String::new(),
            (d, 0) => format!("{d} {}", files_word(d)),
            (d, t) => format!("{d}/{t} {}", files_word(t)),
        }
    }
}

/// indicatif bars on a terminal (stderr).
pub struct Bars {
    bar: Mutex<Option<ProgressBar>>,
    /// Whether the current phase counts bytes.
    bytes: Mutex<bool>,
    files: Arc<FileCounts>,
    verbosity: Verbosity,
}

impl Bars {
    /// Bars for the terminal on stderr; messages below `verbosity` are not shown.
    pub fn new(verbosity: Verbosity) -> Bars {
        Bars { bar: Mutex::new(None), bytes: Mutex::new(false), files: Arc::default(), verbosity }
    }

    fn print(&self, level: Level, msg: &str) {
        match &*self.bar.lock().unwrap() {
            Some(b) => b.suspend(|| emit(level, msg)),
            None => emit(level, msg),
        }
    }

    /// The bar's look: a bar with an ETA once the total is known, before
    /// that a spinner with what is done so far and the elapsed time (so a
    /// phase that counts nothing, like planning, still visibly moves).
    fn style(&self, total_known: bool, bytes: bool) -> ProgressStyle {
        let tmpl = match (total_known, bytes) {
            (true, true) => "{prefix:>8} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {files} eta {eta}",
            (true, false) => "{prefix:>8} [{bar:30}] {pos}/{len} {files} eta {eta}",
            (false, true) => "{prefix:>8} {spinner} {bytes} {bytes_per_sec} {files} {elapsed}",
            (false, false) => "{prefix:>8} {spinner} {elapsed} {msg}",
        };
        let files = Arc::clone(&self.files);
        ProgressStyle::with_template(tmpl)
            .expect("valid template")
            .with_key("files", move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&files.text());
            })
            // indicatif says "0s" before anything is done; say "?" until
            // there is a rate to go by.
            .with_key("eta", |st: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = match st.pos() {
                    0 => w.write_str("?"),
                    _ => write!(
                        w,
                        "{}",
                        humantime::format_duration(Duration::from_secs(st.eta().as_secs_f64().ceil() as u64))
                    ),
                };
            })
            .progress_chars("=> ")
    }
}

impl Progress for Bars {
    fn phase(&self, label: &str, total: Option<u64>, bytes: bool) {
        if let Some(old) = self.bar.lock().unwrap().take() {
            old.finish_and_clear();
        }
        self.files.reset();
        *self.bytes.lock().unwrap() = bytes;
        let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
        bar.set_style(self.style(total.is_some(), bytes));
        bar.set_prefix(label.to_owned());
        bar.enable_steady_tick(Duration::from_millis(200));
        *self.bar.lock().unwrap() = Some(bar);
    }

    fn set_total(&self, total: u64, files: Option<u64>) {
        if let Some(f) = files {
            self.files.total.store(f, Ordering::Relaxed);
        }
        let bytes = *self.bytes.lock().unwrap();
        if let Some(b) = &*self.bar.lock().unwrap() {
            b.set_length(total);
            b.set_style(self.style(true, bytes));
            // Show the totals now (a forced redraw), not at the next steady
            // tick: a scan that ends within a tick would never show them.
            b.suspend(|| ());
        }
    }

    fn inc(&self, n: u64) {
        if let Some(b) = &*self.bar.lock().unwrap() {
            b.inc(n);
        }
    }

    fn inc_files(&self, n: u64) {
        self.files.done.fetch_add(n, Ordering::Relaxed);
    }

    fn finish_phase(&self, summary: &str) {
        if let Some(b) = self.bar.lock().unwrap().take() {
            b.finish_and_clear();
        }
        if self.verbosity >= Verbosity::Normal && !summary.is_empty() {
            emit(Level::Info, summary);
        }
    }

    fn warn(&self, msg: &str) {
        if self.verbosity >= Verbosity::Normal {
            self.print(Level::Warning, &warning_line(msg));
        }
    }

    fn info(&self, msg: &str) {
        if self.verbosity >= Verbosity::Verbose {
            self.print(Level::Info, msg);
        }
    }
    fn shows_info(&self) -> bool {
        self.verbosity >= Verbosity::Verbose
    }
}

/// Plain log lines for the journal: no control characters, a status line at
/// most every [`LogLines::every`], with units, a rate and, once the total is
/// known, how much is left and an ETA. A phase that counts nothing (the
/// plan phase, measuring freed space) still says every `every` that it is
/// working: a heartbeat thread prints the status line when nothing else was
/// printed for that long, so a journal never goes silent for minutes.
pub struct LogLines(Arc<LogState>);

/// What [`LogLines`] and its heartbeat thread share.
pub struct LogState {
    verbosity: Verbosity,
    label: Mutex<String>,
    bytes: Mutex<bool>,
    done: AtomicU64,
    total: AtomicU64,
    files: FileCounts,
    started: Mutex<Instant>,
    last: Mutex<Instant>,
    every: Duration,
    /// A phase has started and not finished: the heartbeat may speak.
    active: AtomicBool,
    /// Status lines the heartbeat printed (for tests).
    beats: AtomicU64,
}

impl std::ops::Deref for LogLines {
    type Target = LogState;
    fn deref(&self) -> &LogState {
        &self.0
    }
}

impl LogLines {
    /// Default interval between status lines.
    pub const EVERY: Duration = Duration::from_secs(10);

    /// `DEDUPSCAN_PROGRESS_INTERVAL` (seconds) overrides [`LogLines::EVERY`].
    pub fn new(verbosity: Verbosity) -> LogLines {
        let every = std::env::var("DEDUPSCAN_PROGRESS_INTERVAL")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map_or(Self::EVERY, Duration::from_secs_f64);
        LogLines::every(verbosity, every)
    }

    /// A status line at most every `every`.
    fn every(verbosity: Verbosity, every: Duration) -> LogLines {
        let state = Arc::new(LogState {
            verbosity,
            label: Mutex::new(String::new()),
            bytes: Mutex::new(false),
            done: AtomicU64::new(0),
            total: AtomicU64::new(0),
            files: FileCounts::default(),
            started: Mutex::new(Instant::now()),
            last: Mutex::new(Instant::now()),
            every,
            active: AtomicBool::new(false),
            beats: AtomicU64::new(0),
        });
        if verbosity >= Verbosity::Normal {
            let weak = Arc::downgrade(&state);
            let tick = every.clamp(Duration::from_millis(10), Duration::from_secs(1));
            // Without the thread the run only loses its heartbeat.
            let _ = std::thread::Builder::new().name("heartbeat".into()).spawn(move || heartbeat(&weak, tick));
        }
        LogLines(state)
    }
}

impl LogState {
    /// The status line of the current phase with `done` units done.
    fn status_line(&self, done: u64) -> String {
        let label = self.label.lock().unwrap().clone();
        let bytes = *self.bytes.lock().unwrap();
        status_line(
            &label,
            bytes,
            done,
            self.total.load(Ordering::Relaxed),
            (self.files.done.load(Ordering::Relaxed), self.files.total.load(Ordering::Relaxed)),
            self.started.lock().unwrap().elapsed(),
        )
    }
}

/// Until the [`LogLines`] is dropped: every `tick`, print the status line
/// of the active phase if nothing was printed for `every`.
fn heartbeat(state: &std::sync::Weak<LogState>, tick: Duration) {
    loop {
        std::thread::sleep(tick);
        let Some(s) = state.upgrade() else { return };
        if !s.active.load(Ordering::Relaxed) {
            continue;
        }
        let mut last = s.last.lock().unwrap();
        if last.elapsed() >= s.every {
            *last = Instant::now();
            drop(last);
            emit(Level::Info, &s.status_line(s.done.load(Ordering::Relaxed)));
            s.beats.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One status line: `1/3 scan: 1.2 GiB of 5.0 GiB (24%), 1234 of 5678
/// files, 350.0 MiB/s, about 12s left` (parts unknown yet are left out).
fn status_line(label: &str, bytes: bool, done: u64, total: u64, files: (u64, u64), elapsed: Duration) -> String {
    let amount = |n: u64| if bytes { human(n) } else { n.to_string() };
    if done == 0 && total == 0 && files == (0, 0) {
        // A phase that counts nothing: say that it is alive.
        let so_far = humantime::format_duration(Duration::from_secs(elapsed.as_secs()));
        return format!("{label}: working, {so_far} so far");
    }
    let mut s = format!("{label}: {}", amount(done));
    if total > 0 {
        let _ = write!(s, " of {} ({:.0}%)", amount(total), done.min(total) as f64 * 100.0 / total as f64);
    }
    match files {
        (0, 0) => {}
        (d, 0) => {
            let _ = write!(s, ", {d} {}", files_word(d));
        }
        (d, t) => {
            let _ = write!(s, ", {d} of {t} {}", files_word(t));
        }
    }
    let secs = elapsed.as_secs_f64();
    // The rate even when it is 0 (a heartbeat before the first byte, or a
    // phase that is stuck): a status line always says how fast it goes.
    if secs > 0.0 {
        let rate = done as f64 / secs;
        if bytes {
            let _ = write!(s, ", {}/s", human(rate as u64));
        } else {
            let _ = write!(s, ", {rate:.0}/s");
        }
        if total > done && done > 0 {
            let left = Duration::from_secs(((total - done) as f64 / rate).ceil() as u64);
            let _ = write!(s, ", about {} left", humantime::format_duration(left));
        }
    }
    s
}

/// `file` or `files`.
fn files_word(n: u64) -> &'static str {
    if n == 1 {
        "file"
    } else {
        "files"
    }
}

impl Progress for LogLines {
    fn phase(&self, label: &str, total: Option<u64>, bytes: bool) {
        *self.label.lock().unwrap() = label.to_owned();
        *self.bytes.lock().unwrap() = bytes;
        self.done.store(0, Ordering::Relaxed);
        self.total.store(total.unwrap_or(0), Ordering::Relaxed);
        self.files.reset();
        *self.started.lock().unwrap() = Instant::now();
        *self.last.lock().unwrap() = Instant::now();
        self.active.store(true, Ordering::Relaxed);
        if self.verbosity >= Verbosity::Verbose {
            emit(Level::Info, &format!("{label}: started"));
        }
    }

    fn set_total(&self, total: u64, files: Option<u64>) {
        self.total.store(total, Ordering::Relaxed);
        if let Some(f) = files {
            self.files.total.store(f, Ordering::Relaxed);
        }
        if self.verbosity >= Verbosity::Normal {
            let label = self.label.lock().unwrap().clone();
            let bytes = *self.bytes.lock().unwrap();
            let amount = if bytes { human(total) } else { total.to_string() };
            let files = files.map(|f| format!(" in {f} {}", files_word(f))).unwrap_or_default();
            emit(Level::Info, &format!("{label}: {amount}{files} to go through"));
        }
    }

    fn inc(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
        if self.verbosity < Verbosity::Normal {
            return;
        }
        let mut last = self.last.lock().unwrap();
        if last.elapsed() >= self.every {
            *last = Instant::now();
            // Counted and said under the lock: hashing threads passing here
            // together (a short DEDUPSCAN_PROGRESS_INTERVAL) print in order,
            // the latest count last, not an older one after a newer.
            emit(Level::Info, &self.status_line(self.done.load(Ordering::Relaxed)));
        }
    }

    fn inc_files(&self, n: u64) {
        self.files.done.fetch_add(n, Ordering::Relaxed);
    }

    fn finish_phase(&self, summary: &str) {
        self.active.store(false, Ordering::Relaxed);
        if self.verbosity >= Verbosity::Normal && !summary.is_empty() {
            emit(Level::Info, summary);
        }
    }

    fn warn(&self, msg: &str) {
        if self.verbosity >= Verbosity::Normal {
            emit(Level::Warning, &warning_line(msg));
        }
    }

    fn info(&self, msg: &str) {
        if self.verbosity >= Verbosity::Verbose {
            emit(Level::Info, msg);
        }
    }
    fn shows_info(&self) -> bool {
        self.verbosity >= Verbosity::Verbose
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_lines_carry_their_priority() {
        assert_eq!(format_lines(Level::Warning, "dedupscan: warning: /a: b", true), "<4>dedupscan: warning: /a: b\n");
        assert_eq!(format_lines(Level::Error, "x\ny", true), "<3>x\n<3>y\n");
        assert_eq!(format_lines(Level::Info, "x", false), "x\n");
    }

    #[test]
    fn status_lines_have_units_totals_and_eta() {
        let s = status_line("1/3 scan", true, 512 << 20, 2 << 30, (10, 40), Duration::from_secs(2));
        assert_eq!(s, "1/3 scan: 512.0 MiB of 2.0 GiB (25%), 10 of 40 files, 256.0 MiB/s, about 6s left");
        let s = status_line("1/3 scan", true, 879254300, 0, (5, 0), Duration::from_secs(1));
        assert_eq!(s, "1/3 scan: 838.5 MiB, 5 files, 838.5 MiB/s");
        assert_eq!(status_line("report", false, 0, 10, (0, 0), Duration::ZERO), "report: 0 of 10 (0%)");
        // A heartbeat before the first byte: a rate of 0, no ETA.
        let s = status_line("1/3 scan", true, 0, 30 << 20, (0, 30), Duration::from_millis(20));
        assert_eq!(s, "1/3 scan: 0 B of 30.0 MiB (0%), 0 of 30 files, 0 B/s");
        let s = status_line("2/3 plan", false, 0, 0, (0, 0), Duration::from_millis(75_400));
        assert_eq!(s, "2/3 plan: working, 1m 15s so far");
    }

    #[test]
    fn a_phase_that_counts_nothing_still_has_a_heartbeat() {
        let lines = LogLines::every(Verbosity::Normal, Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(lines.beats.load(Ordering::Relaxed), 0, "no phase, no heartbeat");
        lines.phase("2/3 plan", None, false);
        std::thread::sleep(Duration::from_millis(300));
        let beats = lines.beats.load(Ordering::Relaxed);
        assert!(beats >= 2, "{beats} heartbeats in 300 ms at 20 ms");
        lines.finish_phase("");
        std::thread::sleep(Duration::from_millis(60));
        let after = lines.beats.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(lines.beats.load(Ordering::Relaxed), after, "a finished phase stays quiet");
    }

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::from_raw_os_error(libc::EROFS);
        let e = anyhow::Error::new(io)
            .context(format!("cannot create database /x: {}", std::io::Error::from_raw_os_error(libc::EROFS)));
        let t = error_text(&e);
        assert_eq!(t.matches("Read-only file system").count(), 1, "{t}");
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_text(&e), "outer: inner");
        let sqlite = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CORRUPT),
            Some("database disk image is malformed".into()),
        );
        assert_eq!(error_text(&anyhow::Error::new(sqlite)), "database disk image is malformed");
    }
}
