//! The `dedupscan` binary: parse, resolve, dispatch, map to an exit code.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use dedupscan::cli::Cli;
use dedupscan::config::{Action, Config};
use dedupscan::db::DbError;
use dedupscan::exit::ExitCode;
use dedupscan::progress::{Bars, LogLines, Progress};
use dedupscan::{history, run};

fn main() {
    let cli = Cli::parse_args(); // usage errors exit with 2
    let code = match Config::from_cli(cli) {
        Ok(cfg) => dispatch(&cfg),
        Err(e) => {
            dedupscan::progress::print_error(&e);
            ExitCode::Usage
        }
    };
    std::process::exit(code.code());
}

fn dispatch(cfg: &Config) -> ExitCode {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // A first signal asks for a clean stop; a second one kills at once.
        let _ = signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&stop));
        let _ = signal_hook::flag::register(sig, Arc::clone(&stop));
    }
    if let Some(budget) = cfg.max_runtime {
        // The time budget stops the run the same clean way a signal does.
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            std::thread::sleep(budget);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }
    let progress: Box<dyn Progress> =
        if cfg.bars { Box::new(Bars::new(cfg.verbosity)) } else { Box::new(LogLines::new(cfg.verbosity)) };
    let result = match cfg.action {
        Action::Report => history::summarize_with(&cfg.db_path, progress.as_ref(), cfg.list).and_then(|s| {
            print_out(cfg.json, &s, || s.to_text())?;
            Ok(ExitCode::Success)
        }),
        Action::Run | Action::Scan => run::run(cfg, progress.as_ref(), &stop).and_then(|r| {
            print_out(cfg.json, &r, || r.to_text())?;
            let metrics_ok = write_metrics(cfg, &r);
            Ok(if r.errors > 0 || !metrics_ok { ExitCode::PartialErrors } else { ExitCode::Success })
        }),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            dedupscan::progress::print_error(&e);
            match e.downcast_ref::<DbError>() {
                Some(DbError::Locked { .. }) => ExitCode::Locked,
                _ => ExitCode::Fatal,
            }
        }
    }
}

/// `--metrics-file`: a failure to write it is a warning and exit code 1,
/// never a reason to lose the run's report.
fn write_metrics(cfg: &Config, report: &dedupscan::report::Report) -> bool {
    let Some(path) = &cfg.metrics_file else { return true };
    match dedupscan::metrics::write_atomic(path, report) {
        Ok(()) => true,
        Err(e) => {
            let msg = format!("{}: cannot write the metrics file: {e}", dedupscan::report::display_path(path));
            dedupscan::progress::emit(dedupscan::progress::Level::Warning, &dedupscan::progress::warning_line(&msg));
            false
        }
    }
}

fn print_out<T: serde::Serialize>(json: bool, value: &T, text: impl FnOnce() -> String) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{}", text());
    }
    Ok(())
}
