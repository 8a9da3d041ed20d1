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
use roff::{bold, italic, roman, Inline, Roff};

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
        clap_complete::generate(shell, &mut Cli::command(), "dedupscan", &mut buf);
        out.push(Generated { path: PathBuf::from("packaging/completions").join(name), contents: buf });
    }
    out
}

/// dedupscan(1): clap_mangen's sections for what clap knows (synopsis,
/// description, options, version), and hand-written ones for what it does
/// not (commands, exit status, markers, files, environment, examples).
pub fn man_page() -> String {
    let man = clap_mangen::Man::new(Cli::command()).manual("User Commands");
    let mut page = String::new();
    type Piece = fn(&clap_mangen::Man, &mut dyn std::io::Write) -> std::io::Result<()>;
    let pieces: [Piece; 5] = [
        clap_mangen::Man::render_title,
        clap_mangen::Man::render_name_section,
        clap_mangen::Man::render_synopsis_section,
        clap_mangen::Man::render_description_section,
        clap_mangen::Man::render_options_section,
    ];
    for piece in pieces {
        let mut buf = Vec::new();
        piece(&man, &mut buf).expect("rendering to memory");
        push_piece(&mut page, String::from_utf8(buf).expect("roff is UTF-8"));
    }
    push_piece(&mut page, hand_written().render());
    let mut buf = Vec::new();
    man.render_version_section(&mut buf).expect("rendering to memory");
    push_piece(&mut page, String::from_utf8(buf).expect("roff is UTF-8"));
    page
}

/// Append a rendered piece, keeping roff's apostrophe preamble (which every
/// rendering starts with) only once, at the top.
fn push_piece(page: &mut String, piece: String) {
    let preamble = Roff::new().render();
    if page.is_empty() {
        page.push_str(&piece);
    } else {
        page.push_str(piece.strip_prefix(preamble.as_str()).unwrap_or(&piece));
    }
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

    // The commands, from clap: usage line and summary of each.
    r.control("SH", ["COMMANDS"]);
    let cmd = Cli::command();
    let default_usage = usage(&mut cmd.clone().disable_help_subcommand(true).subcommand_required(false));
    tagged(
        &mut r,
        default_usage.replace(" [COMMAND]", ""),
        [
            roman("Scan the paths, then share the duplicate ranges found (or, with "),
            bold("--dry-run"),
            roman(", only show them)."),
        ],
    );
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let mut sub = sub.clone().bin_name(format!("dedupscan {}", sub.get_name()));
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        tagged(&mut r, usage(&mut sub), [roman(about)]);
    }
    r.control("PP", []).text([roman(
        "scan takes the options of the default command except --dry-run and --min-range; \
         report takes only the options every command takes (--db, --json, --verbose, --quiet, --progress).",
    )]);

    r.control("SH", ["EXIT STATUS"]);
    for (code, text) in [
        (ExitCode::Success, "Success: everything done, no errors."),
        (
            ExitCode::PartialErrors,
            "Finished, but some paths or ranges had errors (unreadable, removed while read, refused by the kernel, ...): \
             they are counted in the report and the rest of the run went on. Also when --metrics-file could not be written.",
        ),
        (ExitCode::Usage, "Usage error: bad command line or paths (e.g. paths on two filesystems)."),
        (ExitCode::Fatal, "Fatal error: could not run at all (database unreadable, path missing, ...)."),
        (ExitCode::Locked, "Another dedupscan run holds the database's lock; nothing was done."),
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

    r.control("SH", ["FILES"]);
    tagged(
        &mut r,
        "/var/lib/dedupscan/<filesystem-uuid>.sqlite",
        [roman("The database of a filesystem, when run as root (mode 0600: it lists every path on the volume). Other users: "), italic("$XDG_STATE_HOME/dedupscan/<filesystem-uuid>.sqlite"), roman(", by default "), italic("~/.local/state/dedupscan/"), roman(". Changed with "), bold("--db"), roman(".")],
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

    r.control("SH", ["ENVIRONMENT"]);
    tagged(
        &mut r,
        "DEDUPSCAN_DB",
        [roman("Database file, as with "), bold("--db"), roman(" (which wins when both are given).")],
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

    r.control("SH", ["SEE ALSO"]);
    r.text([
        bold("ioctl_fideduperange"),
        roman("(2), "),
        bold("btrfs"),
        roman("(5), "),
        bold("xfs"),
        roman("(5), "),
        bold("systemd.timer"),
        roman("(5), "),
        bold("systemd-escape"),
        roman("(1)"),
    ]);
    r
}

/// `dedupscan [OPTIONS] [PATH]...` from clap's usage line.
fn usage(cmd: &mut clap::Command) -> String {
    let u = cmd.render_usage().to_string();
    u.strip_prefix("Usage: ").unwrap_or(&u).trim().to_owned()
}
