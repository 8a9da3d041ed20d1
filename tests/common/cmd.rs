//! The one way the tests run the binary: [`dedupscan`] starts a [`Cmd`],
//! configured step by step (arguments, environment, stdin, a wrapper such as
//! `strace`, the exit codes expected), then [`Cmd::run`] waits and returns
//! an [`Out`] (exit code, stdout, stderr, the JSON report when `--json` was
//! given), or [`Cmd::command`] hands over the `Command` for a test that
//! signals or kills the child.

use std::ffi::{OsStr, OsString};
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The binary under test: `DEDUPSCAN_TEST_BIN` when set (another build,
/// e.g. an older one, to see a test fail on it), else the one cargo built
/// with these tests.
pub fn bin() -> PathBuf {
    std::env::var_os("DEDUPSCAN_TEST_BIN").map(PathBuf::from).unwrap_or_else(|| env!("CARGO_BIN_EXE_dedupscan").into())
}

/// A run of [`bin`] with no arguments yet.
pub fn dedupscan() -> Cmd {
    Cmd { program: bin(), wrapper: Vec::new(), args: Vec::new(), env: Vec::new(), stdin: None, expect: Vec::new() }
}

/// A run of the binary being configured; nothing runs before [`Cmd::run`],
/// [`Cmd::spawn`] or [`Cmd::command`].
#[must_use]
#[derive(Debug, Clone)]
pub struct Cmd {
    program: PathBuf,
    /// A program and its arguments the binary runs under (`strace`,
    /// `setpriv`, `prlimit`): the binary's path and arguments follow them.
    wrapper: Vec<OsString>,
    args: Vec<OsString>,
    /// Variables to set (`Some`) or remove (`None`).
    env: Vec<(OsString, Option<OsString>)>,
    /// Bytes fed to stdin; `None` is `/dev/null` (never the test's own).
    stdin: Option<Vec<u8>>,
    /// Exit codes [`Cmd::run`] accepts; empty accepts any.
    expect: Vec<i32>,
}

/// What a finished run left.
#[derive(Debug, Clone)]
pub struct Out {
    /// The exit code, or 128 + the signal that killed it (as a shell says).
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    /// stdout parsed, when the arguments had `--json` and stdout is not
    /// empty; `Null` otherwise.
    pub json: serde_json::Value,
}

impl Cmd {
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Cmd {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, args: I) -> Cmd {
        self.args.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// `--db <path>`.
    pub fn db(self, db: impl AsRef<Path>) -> Cmd {
        self.arg("--db").arg(db.as_ref())
    }

    /// `--json`: [`Out::json`] holds the parsed report.
    pub fn json(self) -> Cmd {
        self.arg("--json")
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Cmd {
        self.env.push((key.as_ref().to_owned(), Some(value.as_ref().to_owned())));
        self
    }

    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Cmd {
        self.env.push((key.as_ref().to_owned(), None));
        self
    }

    /// Feed `data` to stdin (by default stdin is `/dev/null`).
    pub fn stdin(mut self, data: impl Into<Vec<u8>>) -> Cmd {
        self.stdin = Some(data.into());
        self
    }

    /// Run the binary under `wrapper` (e.g. `["strace", "-f", ...]`): the
    /// wrapper's arguments come first, then the binary and its own.
    pub fn under<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, wrapper: I) -> Cmd {
        self.wrapper = wrapper.into_iter().map(|a| a.as_ref().to_owned()).collect();
        self
    }

    /// Run this copy of the binary instead (e.g. one an unprivileged user
    /// can reach).
    pub fn program(mut self, path: impl Into<PathBuf>) -> Cmd {
        self.program = path.into();
        self
    }

    /// [`Cmd::run`] panics, with stdout and stderr, unless the run exits
    /// with `code` (or with a code of an earlier `expect`).
    pub fn expect(mut self, code: i32) -> Cmd {
        self.expect.push(code);
        self
    }

    /// The command line, for messages.
    pub fn line(&self) -> String {
        let mut words = self.wrapper.clone();
        words.push(self.program.clone().into());
        words.extend(self.args.iter().cloned());
        words.iter().map(|w| w.to_string_lossy()).collect::<Vec<_>>().join(" ")
    }

    fn wants_json(&self) -> bool {
        self.args.iter().any(|a| a == "--json")
    }

    /// The configured `Command`, stdin `/dev/null` unless [`Cmd::stdin`]
    /// gave data (then piped: [`Cmd::run`] writes it); stdout and stderr
    /// are the caller's to set.
    pub fn command(&self) -> Command {
        let mut cmd = match self.wrapper.split_first() {
            Some((prog, rest)) => {
                let mut c = Command::new(prog);
                c.args(rest).arg(&self.program);
                c
            }
            None => Command::new(&self.program),
        };
        cmd.args(&self.args);
        // A test run under systemd must not make the binary prefix journal
        // priorities: only tests that set it on purpose get it.
        cmd.env_remove("JOURNAL_STREAM");
        for (k, v) in &self.env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        cmd.stdin(if self.stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        cmd
    }

    /// Started, stdout and stderr piped; the caller waits (or kills).
    pub fn spawn(&self) -> Child {
        let mut child = self
            .command()
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", self.line()));
        if let Some(data) = &self.stdin {
            let mut pipe = child.stdin.take().unwrap();
            let data = data.clone();
            // A thread, so a child that writes before it reads cannot
            // deadlock against us.
            std::thread::spawn(move || {
                let _ = pipe.write_all(&data);
            });
        }
        child
    }

    /// Run to the end; checks the exit code against [`Cmd::expect`].
    pub fn run(self) -> Out {
        let out = self.spawn().wait_with_output().unwrap_or_else(|e| panic!("{}: {e}", self.line()));
        let code = out.status.code().unwrap_or_else(|| 128 + out.status.signal().unwrap_or(0));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !self.expect.is_empty() && !self.expect.contains(&code) {
            panic!("`{}` exited {code}, want {:?}\nstdout: {stdout}\nstderr: {stderr}", self.line(), self.expect);
        }
        let json = if self.wants_json() && !out.stdout.is_empty() {
            serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("`{}`: stdout is not JSON ({e}): {stdout}\nstderr: {stderr}", self.line()))
        } else {
            serde_json::Value::Null
        };
        Out { code, stdout, stderr, json }
    }
}
