//! Runs of the binary in bounded memory, with their peak RSS: a regression
//! that makes a run's memory grow with what a user can write fails the test
//! instead of eating the machine.

use std::fs::File;
use std::io::Read;
use std::process::Stdio;

use super::{dedupscan, Volume};

/// Address space a run may reserve: far more than it needs (thread stacks
/// and malloc arenas reserve a lot they never touch), far less than what
/// the regressions these tests catch asked for.
pub const AS_LIMIT: &str = "--as=6000000000";

/// Outcome of one bounded run.
pub struct Bounded {
    /// Exit code (128 + signal when killed).
    pub code: i32,
    /// Peak resident set of the run, bytes.
    pub max_rss: u64,
    /// The JSON report (exit 0 or 1), else null.
    pub json: serde_json::Value,
    /// What it wrote to stderr.
    pub stderr: String,
}

/// Runs the command after `--` and writes its peak RSS (KiB) to the file
/// named first, exiting as it exited (128 + signal if killed). Why not
/// `wait4` on our own child: Linux carries a process's high-water RSS over
/// `fork` and `exec`, so the child of a test process that once held a
/// 256 MiB buffer (or whose sibling test threads did) reports at least
/// that. This wrapper is a fresh process; the command it forks is measured
/// alone.
const PEAK_RSS: &str = r#"
import os, sys
out, cmd = sys.argv[1], sys.argv[3:]
pid = os.fork()
if pid == 0:
    try:
        os.execvp(cmd[0], cmd)
    finally:
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
open(out, "w").write(str(ru.ru_maxrss))
sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
"#;

/// Run the binary with `args --json --db <db>` under [`AS_LIMIT`], and
/// measure its peak RSS (see [`PEAK_RSS`]).
pub fn bounded(vol: &Volume, args: &[&str]) -> Bounded {
    let err_path = vol.db().with_extension("stderr");
    let rss_path = vol.db().with_extension("maxrss");
    let rss_arg = rss_path.to_str().expect("UTF-8 path").to_owned();
    let mut child = dedupscan()
        .under(["python3", "-c", PEAK_RSS, &rss_arg, "--", "prlimit", AS_LIMIT, "--"])
        .args(args)
        .json()
        .arg("--progress=never")
        .db(vol.db())
        .command()
        .stdout(Stdio::piped())
        .stderr(File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    let status = child.wait().unwrap();
    let code = status.code().expect("the wrapper exits");
    let kib = std::fs::read_to_string(&rss_path).unwrap_or_else(|e| panic!("{}: {e}", rss_path.display()));
    let max_rss = kib.trim().parse::<u64>().expect("peak RSS in KiB") * 1024;
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let json = if code == 0 || code == 1 {
        serde_json::from_slice(&out)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}\n{stderr}", String::from_utf8_lossy(&out)))
    } else {
        serde_json::Value::Null
    };
    Bounded { code, max_rss, json, stderr }
}
