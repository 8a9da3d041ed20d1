//! The `dedupscan` binary: parse, resolve, dispatch, map to an exit code.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use dedupscan::cli::Cli;
use dedupscan::config::{Action, Config, ReadOnly, ReportConfig, ScanConfig, Unsupported};
use dedupscan::db::DbError;
use dedupscan::exit::ExitCode;
use dedupscan::progress::{Bars, Capped, LogLines, Progress};
use dedupscan::{pipeline, summary};

fn main() {
    dedupscan::sys::limits::lean_malloc();
    let cli = Cli::parse_args(); // usage errors exit with 2
    let code = match Config::from_cli(cli) {
        Ok(cfg) => dispatch(&cfg),
        // Usage errors and unsupported filesystems are found here, before
        // any database is opened or any file read.
        Err(e) => {
            dedupscan::progress::print_error(&e);
            if e.downcast_ref::<Unsupported>().is_some() || e.downcast_ref::<ReadOnly>().is_some() {
                ExitCode::Unsupported
            } else {
                ExitCode::Usage
            }
        }
    };
    std::process::exit(code.code());
}

fn dispatch(cfg: &Config) -> ExitCode {
    // Many files open at once in the share phase: see raise_fd_limit.
    dedupscan::sys::limits::raise_fd_limit();
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // A first signal asks for a clean stop; a second one kills at once.
        let _ = signal_hook::flag::register_conditional_shutdown(sig, dedupscan::exit::KILLED, Arc::clone(&stop));
        let _ = signal_hook::flag::register(sig, Arc::clone(&stop));
    }
    if matches!(cfg.action, Action::Report(_)) {
        // `report` only reads, and on millions of files it measures for
        // minutes without a point to stop cleanly at: the first signal
        // ends it at once (exit 130), as the second one ends a run.
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    if let Some(budget) = cfg.scan().and_then(|s| s.max_runtime) {
        // The time budget stops the run the same clean way a signal does.
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            std::thread::sleep(budget);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }
    let shown: Box<dyn Progress> =
        if cfg.bars { Box::new(Bars::new(cfg.verbosity)) } else { Box::new(LogLines::new(cfg.verbosity)) };
    let progress = Capped::new(shown, cfg.verbosity);
    if let Some(note) = &cfg.db_note {
        progress.warn_run(note);
    }
    // The run's report, when it finished: for the metrics file.
    let mut finished = None;
    let result = match &cfg.action {
        Action::Report(r) => report_command(cfg, r, &progress),
        Action::Run { scan, share } => pipeline::run(&cfg.db_path, scan, Some(share), &progress, &stop)
            .and_then(|r| run_finished(cfg, r, &mut finished)),
        Action::Scan(scan) => {
            pipeline::run(&cfg.db_path, scan, None, &progress, &stop).and_then(|r| run_finished(cfg, r, &mut finished))
        }
    };
    progress.finish();
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            dedupscan::progress::print_error(&e);
            match e.downcast_ref::<DbError>() {
                Some(DbError::Locked { .. }) => ExitCode::Locked,
                _ => ExitCode::Fatal,
            }
        }
    };
    // Metrics on every exit path of a run, locked and fatal included.
    if let Some(scan) = cfg.scan() {
        if !write_metrics(cfg, scan, code, finished.as_ref()) && code == ExitCode::Success {
            return ExitCode::PartialErrors;
        }
    }
    code
}

/// `dedupscan report`: print (and with `--html` write) what the database
/// knows.
fn report_command(cfg: &Config, r: &ReportConfig, progress: &dyn Progress) -> anyhow::Result<ExitCode> {
    let mut s = summary::summarize_with(&cfg.db_path, progress, r.list)?;
    if let Some(html) = &r.html {
        // The page shows numbers, never the list (which would be read into
        // memory whole to render it).
        let list = s.ranges.take();
        let page = s.to_html();
        s.ranges = list;
        // Root's report names files in directories only root may list:
        // readable by its owner only, and never written through a symlink.
        dedupscan::sys::fs::write_replacing(html, page.as_bytes(), 0o600)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", dedupscan::display::display_path(html)))?;
    }
    print_out(cfg.json, &s, || s.to_text(), s.ranges.as_ref())?;
    Ok(ExitCode::Success)
}

/// Print the report of a run that finished (or stopped cleanly), keep it for
/// the metrics file, and say which exit code it earns.
fn run_finished(
    cfg: &Config,
    r: dedupscan::report::Report,
    finished: &mut Option<dedupscan::report::Report>,
) -> anyhow::Result<ExitCode> {
    print_out(cfg.json, &r, || r.to_text(), r.ranges.as_ref())?;
    let code = if r.interrupted {
        // Not 0: a timer or script must see that the volume was not
        // fully processed (the report says how far it got).
        if cfg.verbosity > dedupscan::progress::Verbosity::Quiet {
            dedupscan::progress::emit(
                dedupscan::progress::Level::Warning,
                "dedupscan: warning: stopped before finishing (a signal, --max-runtime, or the filesystem stopped): the work done is \
                 kept; the next run carries on (exit status 5)",
            );
        }
        ExitCode::Interrupted
    } else if r.errors > 0 {
        ExitCode::PartialErrors
    } else {
        ExitCode::Success
    };
    *finished = Some(r);
    Ok(code)
}

/// `--metrics-file`: a failure to write it is a warning and exit code 1,
/// never a reason to lose the run's report.
fn write_metrics(cfg: &Config, scan: &ScanConfig, code: ExitCode, report: Option<&dedupscan::report::Report>) -> bool {
    let Some(path) = &scan.metrics_file else { return true };
    let outcome = dedupscan::metrics::Outcome {
        exit_code: code.code(),
        fs_uuid: scan.fs.uuid.clone(),
        filesystem: scan.fs.kind.name().to_owned(),
        paths: scan.paths.iter().map(|p| dedupscan::display::display_path(p)).collect(),
        report,
    };
    match dedupscan::metrics::write_atomic(path, &cfg.db_path, &outcome) {
        Ok(()) => true,
        Err(e) => {
            let msg = format!("{}: cannot write the metrics file: {e}", dedupscan::display::display_path(path));
            dedupscan::progress::emit(dedupscan::progress::Level::Warning, &dedupscan::progress::warning_line(&msg));
            false
        }
    }
}

/// Print the report on stdout, its `--list` streamed (read back from its
/// temporary file as it is written, never held whole). A reader that went
/// away (`| head -1`) ends the output quietly: the run itself is done and
/// its exit status stands.
fn print_out<T: serde::Serialize>(
    json: bool,
    value: &T,
    text: impl FnOnce() -> String,
    list: Option<&dedupscan::report::Listed>,
) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = if json {
        serde_json::to_writer_pretty(&mut out, value).map_err(std::io::Error::from).and_then(|()| writeln!(out))
    } else {
        out.write_all(text().as_bytes()).and_then(|()| match list {
            Some(l) => writeln!(out).and_then(|()| l.write_text(&mut out)),
            None => Ok(()),
        })
    };
    match written.and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("writing the report"))
        }
        _ => Ok(()),
    }
}
