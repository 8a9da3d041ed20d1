//! Rendering of the generated documentation: the man page `man/dedupscan.1`
//! and the shell completions under `packaging/completions/`, all from the
//! clap definitions in `src/cli.rs`.
//!
//! Shared by `examples/gen_docs/main.rs` (`cargo run --example gen_docs`
//! writes the files) and `tests/packaging.rs` (which fails when the
//! committed files are stale), so that clap_mangen and clap_complete stay
//! dev-dependencies.

use std::path::PathBuf;

use clap::CommandFactory;
use clap_complete::Shell;
use roff::{bold, italic, line_break, roman, Inline, Roff};

use dedupscan::cli::Cli;
use dedupscan::exit::ExitCode;

/// One generated file: its path relative to the crate root, and its bytes.
pub struct Generated {
    pub path: PathBuf,
    pub contents: Vec<u8>,
}

/// Every generated file, rendered in memory.
pub fn generate() -> Vec<Generated> {
    let mut out = vec![Generated { path: "man/dedupscan.1".into(), contents: man_page().into_bytes() }];
    for (shell, name) in [(Shell::Bash, "dedupscan.bash"), (Shell::Zsh, "_dedupscan"), (Shell::Fish, "dedupscan.fish")]
    {
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut with_hints(Cli::command()), "dedupscan", &mut buf);
        if shell == Shell::Bash {
            // An empty answer (a directory option, or a word that is no
            // option) falls back to directory names, not to every file.
            let text = String::from_utf8(buf).expect("completion is UTF-8");
            let fixed = text.replace("-o bashdefault -o default dedupscan", "-o bashdefault -o dirnames dedupscan");
            assert_ne!(text, fixed, "clap_complete's bash registration line changed: update with_hints' caller");
            buf = fixed.into_bytes();
        }
        out.push(Generated { path: PathBuf::from("packaging/completions").join(name), contents: buf });
    }
    out
}

/// What each argument's value is, for the completions (clap_complete
/// offers file names for any value it knows nothing about): numbers,
/// durations and globs get no file names, FILE options files, the PATH
/// operands directories. Kept here rather than in `src/cli.rs` because only
/// the completions read it.
fn with_hints(cmd: clap::Command) -> clap::Command {
    use clap::ValueHint;
    let hint = |a: clap::Arg| -> clap::Arg {
        if !a.get_action().takes_values() || a.get_value_hint() != ValueHint::Unknown {
            return a;
        }
        if a.get_possible_values().iter().any(|_| true) {
            return a;
        }
        let value = a.get_value_names().and_then(|v| v.first()).map(|s| s.as_str().to_owned()).unwrap_or_default();
        let h = match value.as_str() {
            "PATH" if a.is_positional() => ValueHint::DirPath,
            "PATH" | "FILE" => ValueHint::FilePath,
            _ => ValueHint::Other,
        };
        a.value_hint(h)
    };
    let ids: Vec<String> = cmd.get_arguments().map(|a| a.get_id().to_string()).collect();
    let mut cmd = cmd;
    for id in ids {
        cmd = cmd.mut_arg(id, hint);
    }
    let subs: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_owned()).collect();
    for sub in subs {
        cmd = cmd.mut_subcommand(sub, with_hints);
    }
    cmd
}

/// dedupscan(1): clap_mangen's sections for what clap knows (name,
/// description, options, version), and hand-written ones for the rest.
pub fn man_page() -> String {
    let cmd = Cli::command();
    let version = cmd.get_version().unwrap_or_default().to_owned();
    let man = clap_mangen::Man::new(cmd);
    // roff's apostrophe preamble, then the title line. Not `render_title`:
    // clap_mangen drops an empty date argument from `.TH`, which shifts the
    // source and manual into the wrong fields. The date is that of the
    // release (the Debian changelog's latest entry), not today's, so the page
    // does not change on every regeneration.
    let mut page = Roff::new().render();
    page.push_str(&format!(".TH DEDUPSCAN 1 \"{}\" \"dedupscan {version}\" \"User Commands\"\n", release_date()));
    push_piece(&mut page, &man, clap_mangen::Man::render_name_section);
    page.push_str(&strip_preamble(synopsis().render()));
    push_piece(&mut page, &man, clap_mangen::Man::render_description_section);
    push_piece(&mut page, &man, clap_mangen::Man::render_options_section);
    page.push_str(&strip_preamble(hand_written().render()));
    push_piece(&mut page, &man, clap_mangen::Man::render_version_section);
    backticks_to_bold(&page)
}

/// The date of the latest entry of `packaging/debian/changelog`, as
/// YYYY-MM-DD (its trailer line reads ` -- NAME <MAIL>  Mon, 23 Nov 2026 ...`).
pub fn release_date() -> String {
    let log = include_str!("../../packaging/debian/changelog");
    let trailer = log.lines().find(|l| l.starts_with(" -- ")).expect("changelog has a trailer line");
    let date = trailer.rsplit("  ").next().expect("trailer has a date");
    let f: Vec<&str> = date.split_whitespace().collect();
    let month = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        .iter()
        .position(|m| *m == f[2])
        .expect("month name")
        + 1;
    format!("{}-{month:02}-{:0>2}", f[3], f[1])
}

/// Doc comments quote commands and names in Markdown backticks; on the page
/// they are bold (a literal backtick renders as a grave accent).
fn backticks_to_bold(page: &str) -> String {
    let mut out = String::with_capacity(page.len());
    for line in page.split_inclusive('\n') {
        let parts: Vec<&str> = line.split('`').collect();
        if parts.len().is_multiple_of(2) {
            out.push_str(line); // unbalanced: leave as is
            continue;
        }
        for (i, part) in parts.iter().enumerate() {
            if i % 2 == 1 {
                out.push_str(&format!("\\fB{part}\\fR"));
            } else {
                out.push_str(part);
            }
        }
    }
    out
}

type Piece = fn(&clap_mangen::Man, &mut dyn std::io::Write) -> std::io::Result<()>;

/// Append one of clap_mangen's sections.
fn push_piece(page: &mut String, man: &clap_mangen::Man, piece: Piece) {
    let mut buf = Vec::new();
    piece(man, &mut buf).expect("rendering to memory");
    page.push_str(&strip_preamble(String::from_utf8(buf).expect("roff is UTF-8")));
}

/// Every rendering starts with roff's apostrophe preamble; the page keeps
/// only the first.
fn strip_preamble(piece: String) -> String {
    let preamble = Roff::new().render();
    piece.strip_prefix(preamble.as_str()).map(str::to_owned).unwrap_or(piece)
}

/// One usage line per command, from clap (clap_mangen's synopsis lists
/// every flag without its value and ends in a bare `[subcommands]`).
fn synopsis() -> Roff {
    let mut r = Roff::new();
    r.control("SH", ["SYNOPSIS"]);
    let mut line = Vec::new();
    for (i, (name, rest)) in usages().into_iter().enumerate() {
        if i > 0 {
            line.push(line_break());
        }
        line.extend([bold(name), roman(format!(" {rest}"))]);
    }
    r.text(line);
    r
}

/// (`dedupscan scan`, `[OPTIONS] [PATH]...`) for the default command and
/// each subcommand.
fn usages() -> Vec<(String, String)> {
    let cmd = Cli::command();
    let mut out = Vec::new();
    let mut default = cmd.clone().disable_help_subcommand(true).subcommand_required(false);
    let u = usage(&mut default);
    // clap adds a second line, `dedupscan <COMMAND>`, for the subcommands.
    let first = u.lines().next().unwrap_or_default();
    out.push(("dedupscan".to_owned(), first.trim_start_matches("dedupscan").trim().to_owned()));
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let name = format!("dedupscan {}", sub.get_name());
        let u = usage(&mut sub.clone().bin_name(&name));
        out.push((name.clone(), u.trim_start_matches(name.as_str()).trim().to_owned()));
    }
    out
}

/// A tagged paragraph: `tag` in bold, then `text`.
fn tagged(r: &mut Roff, tag: impl Into<String>, text: impl Into<Vec<Inline>>) {
    r.control("TP", []).text([bold(tag)]).text(text);
}

/// A literal example block.
fn example(r: &mut Roff, lines: &[&str]) {
    r.control("PP", []).control("RS", ["4"]).control("nf", []);
    for l in lines {
        r.text([roman(*l)]);
    }
    r.control("fi", []).control("RE", []);
}

fn hand_written() -> Roff {
    let mut r = Roff::new();

    // The commands, from clap's summaries.
    r.control("SH", ["COMMANDS"]);
    tagged(
        &mut r,
        "dedupscan PATH...",
        [
            roman("Scan the paths, then share the duplicate ranges found (or, with "),
            bold("--dry-run"),
            roman(", only show and verify them)."),
        ],
    );
    for sub in Cli::command().get_subcommands().filter(|s| s.get_name() != "help") {
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        let tag = format!("dedupscan {}", sub.get_name());
        tagged(&mut r, tag, [roman(format!("{about}."))]);
    }
    r.control("PP", []).text([roman(
        "scan takes the options of the default command except --dry-run and --min-range; \
         report takes the options every command takes (--db, --json, --verbose, --quiet, --progress) and --list.",
    )]);

    r.control("SH", ["EXIT STATUS"]);
    for (code, text) in [
        (
            ExitCode::Success,
            "Success: everything done, no errors. Files that other processes deleted, moved, changed or held a lease on \
             while the run went through them are skipped (counted in the report's skipped), not errors: that is the life \
             of a tree being written to; a leased file's ranges are left pending for the next run.",
        ),
        (
            ExitCode::PartialErrors,
            "Finished, but some paths or ranges had errors (unreadable, refused by the kernel, ...): \
             they are counted in the report and the rest of the run went on, and the next run tries them again. A file \
             whose block map is too large to hold (too_large: about 610 GiB of data in one file) is read once and then \
             refused unread while it is unchanged, with this status each run; report lists such files. Also when \
             --metrics-file could not be written.",
        ),
        (
            ExitCode::Usage,
            "Usage error: a bad command line (including a bad or relative --exclude glob), or paths that cannot be used \
             (missing, unreadable, on two filesystems, or leading through a symbolic link another user could have \
             planted). Found before the database is opened: nothing was done.",
        ),
        (ExitCode::Fatal, "Fatal error: could not run at all (e.g. the database cannot be opened, read or migrated, or lies where another user could tamper with it)."),
        (ExitCode::Locked, "Another dedupscan run holds the database's lock; nothing was done."),
        (
            ExitCode::Interrupted,
            "Stopped before finishing: SIGINT, SIGTERM, --max-runtime, or the filesystem stopped during the run (remounted read-only, or forced read-only or shut down after an error; said once). The work done is committed, the run is marked \
             interrupted in the history (report --json: \"interrupted\": true), and the next run carries on. A second \
             signal ends the process at once with status 130; report, which changes nothing, ends at the first.",
        ),
        (
            ExitCode::Unsupported,
            "The paths are not on btrfs or on XFS made with reflink=1 (e.g. ext4, tmpfs), or are on a read-only mount: nothing can be \
             shared there, so the run is refused before any file is read or a database created (on a read-only mount a --dry-run is \
             not refused). dedupscan scan records such a filesystem anyway.",
        ),
    ] {
        tagged(&mut r, code.code().to_string(), [roman(text)]);
    }

    r.control("SH", ["EXCLUDING FILES"]);
    r.text([roman("A file or directory is left out, with everything below it, when it is marked:")]);
    tagged(
        &mut r,
        "user.nodedup",
        [
            roman("an extended attribute of that name on the file or on any directory above it, e.g. "),
            bold("setfattr -n user.nodedup /srv/vm"),
            roman("."),
        ],
    );
    tagged(
        &mut r,
        ".nodedup",
        [
            roman("a file of that name in a directory (its content does not matter), e.g. "),
            bold("touch /srv/vm/.nodedup"),
            roman("."),
        ],
    );
    r.control("PP", []).text([
        roman("Paths matching an "),
        bold("--exclude"),
        roman(
            " glob are left out too. Never touched either: other mounts, symbolic links, special files, \
               immutable and append-only files, nodatacow files on btrfs, swap files, realtime and DAX files on XFS, \
               and dedupscan's own database. The report counts skipped files by reason.",
        ),
    ]);
    r.control("PP", []).text([roman(
        "A directory's marker takes effect when the crawl lists that directory: one added while a run is \
         already past it takes effect at the next run. A file's own user.nodedup is read again when the file \
         is hashed.",
    )]);
    r.control("PP", []).text([roman(
        "A file with more than one hard link is shared only when the run found all of its names below the \
         paths given and left none of them out: a name behind a marker or an --exclude, or outside the paths, \
         keeps the file out of sharing (counted hardlink_outside in the report).",
    )]);

    r.control("SH", ["FILES"]);
    tagged(
        &mut r,
        "/var/lib/dedupscan/<filesystem-uuid>.sqlite",
        [roman("The database of a filesystem, when run as root (mode 0600: it lists every path on the volume). Other users: "), italic("$XDG_STATE_HOME/dedupscan/<filesystem-uuid>.sqlite"), roman(", by default "), italic("~/.local/state/dedupscan/"), roman(". Changed with "), bold("--db"), roman("; a database is refused (exit status 3) in a directory another user can write (sticky or not), below one another user could rename, or when it or its lock is a symbolic link or another user's file.")],
    );
    tagged(
        &mut r,
        "<database>.lock",
        [roman("Lock file next to the database, held while a run uses it, so that two runs (say, the timer and a manual run) never share one database; the second exits with status 4.")],
    );
    tagged(
        &mut r,
        "/lib/systemd/system/dedupscan@.service, dedupscan@.timer",
        [
            roman("Units to run dedupscan on a volume daily; the instance is the volume's path escaped with "),
            bold("systemd-escape --path"),
            roman("."),
        ],
    );

    tagged(
        &mut r,
        "/etc/default/dedupscan, /etc/dedupscan/<instance>.conf",
        [
            roman("Options the units add to every run (DEDUPSCAN_OPTIONS) and to one volume's runs (DEDUPSCAN_VOLUME_OPTIONS); by default "),
            bold("--max-runtime 6h"),
            roman(". Exit statuses 1 and 4 do not mark the unit failed."),
        ],
    );

    r.control("SH", ["ENVIRONMENT"]);
    tagged(
        &mut r,
        "DEDUPSCAN_DB",
        [roman("Database file, as with "), bold("--db"), roman(" (which wins when both are given).")],
    );
    tagged(
        &mut r,
        "DEDUPSCAN_LOG",
        [
            roman("Message level when neither "),
            bold("-v"),
            roman(" nor "),
            bold("-q"),
            roman(" is given: quiet, normal or verbose, as with "),
            bold("--log-level"),
            roman("."),
        ],
    );
    tagged(
        &mut r,
        "DEDUPSCAN_PROGRESS_INTERVAL",
        [roman("Seconds between status lines when stderr is not a terminal (default 10).")],
    );
    tagged(
        &mut r,
        "JOURNAL_STREAM",
        [roman(
            "Set by systemd. When it names stderr, every message line starts with its syslog priority \
             (<3> error, <4> warning, <6> info), so journalctl -p warning lists the warnings.",
        )],
    );
    tagged(
        &mut r,
        "TMPDIR",
        [roman(
            "Where unnamed temporary files go (default /var/tmp; the units give each run a private one): a plan \
             of more than a million ranges, a long --list, and, on volumes of more than 16 GiB of data, the \
             plan's first grouping, 13 bytes a 4 KiB block, at most 3.3 GiB at a time. Where none can be made \
             there, the run goes on, slower or in more memory.",
        )],
    );
    tagged(&mut r, "XDG_STATE_HOME, HOME", [roman("Where the database of a user other than root lives by default.")]);

    r.control("SH", ["EXAMPLES"]);
    r.text([roman("Preview what would be shared on /srv, and how much:")]);
    example(&mut r, &["dedupscan /srv --dry-run"]);
    r.control("PP", [])
        .text([roman("Share, rehashing only what changed since the last run, and export figures for Prometheus:")]);
    example(
        &mut r,
        &["dedupscan /srv --incremental --metrics-file /var/lib/prometheus/node-exporter/dedupscan-srv.prom"],
    );
    r.control("PP", []).text([roman("Run it every day from systemd:")]);
    example(&mut r, &["systemctl enable --now dedupscan@$(systemd-escape --path /srv).timer"]);
    r.control("PP", []).text([roman("Savings and history as JSON:")]);
    example(&mut r, &["dedupscan report /srv --json"]);
    r.control("PP", []).text([roman("The same as a page with charts, to open in a browser or print:")]);
    example(&mut r, &["dedupscan report /srv --html /tmp/dedupscan-srv.html"]);

    r.control("SH", ["SEE ALSO"]);
    let mut refs = Vec::new();
    for (i, (page, section)) in [
        ("ioctl_fideduperange", "2"),
        ("ioctl_ficlonerange", "2"),
        ("ioctl_fiemap", "2"),
        ("statfs", "2"),
        ("btrfs", "5"),
        ("xfs", "5"),
        ("xfs_io", "8"),
        ("compsize", "8"),
        ("duperemove", "8"),
        ("chattr", "1"),
        ("setfattr", "1"),
        ("systemd.service", "5"),
        ("systemd.timer", "5"),
        ("systemd.exec", "5"),
        ("systemd-escape", "1"),
        ("sqlite3", "1"),
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            refs.push(roman(", "));
        }
        refs.push(bold(page));
        refs.push(roman(format!("({section})")));
    }
    r.text(refs);
    r.control("PP", []).text([
        roman("/usr/share/doc/dedupscan/ holds the README, the changelog and the JSON schemas of "),
        bold("--json"),
        roman(" and "),
        bold("report --json"),
        roman("."),
    ]);
    r
}

/// `dedupscan [OPTIONS] [PATH]...` from clap's usage line.
fn usage(cmd: &mut clap::Command) -> String {
    let u = cmd.render_usage().to_string();
    u.strip_prefix("Usage: ").unwrap_or(&u).trim().to_owned()
}
