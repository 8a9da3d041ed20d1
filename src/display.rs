//! How numbers and names are shown to people: paths escaped losslessly,
//! sizes in binary units, durations and dates. Base vocabulary: the report,
//! the progress lines and every warning use it, so a path or a size reads
//! the same everywhere.

use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A path as shown in messages and JSON: valid UTF-8 as is, a backslash as
/// `\\`, and as `\xNN` every byte that is not valid UTF-8 or belongs to a
/// control character (C0, DEL, C1), a line or paragraph separator or a
/// bidirectional formatting character, so the form is lossless (it can be
/// turned back into the original bytes) and a name cannot start a line of
/// its own in a log or the journal (`\n<3>` would forge an error there),
/// send escape sequences to a terminal, nor reorder what follows it on the
/// line (U+202E shows `/srv/a/\u{202e}gol.txt` as `/srv/a/txt.log`: the
/// "Trojan Source" trick, CVE-2021-42574).
pub fn display_path(p: &Path) -> String {
    escape_bytes(p.as_os_str().as_bytes())
}

/// [`display_path`] of a path that may be tens of KiB long (a tree nested
/// by a user): its first and last [`SHOWN_EACH_END`] characters around
/// how many were left out, so one warning stays one readable line.
pub fn display_long_path(p: &Path) -> String {
    let full = display_path(p);
    let n = full.chars().count();
    if n <= 2 * SHOWN_EACH_END + 40 {
        return full;
    }
    let head: String = full.chars().take(SHOWN_EACH_END).collect();
    let tail: String = full.chars().skip(n - SHOWN_EACH_END).collect();
    format!("{head}[… {} characters …]{tail}", n - 2 * SHOWN_EACH_END)
}

/// Characters of each end of a long path shown ([`display_long_path`]).
const SHOWN_EACH_END: usize = 120;

/// See [`display_path`].
pub fn escape_bytes(mut b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    loop {
        match std::str::from_utf8(b) {
            Ok(s) => {
                push_escaped(&mut out, s);
                return out;
            }
            Err(e) => {
                let (good, rest) = b.split_at(e.valid_up_to());
                push_escaped(&mut out, std::str::from_utf8(good).expect("valid prefix"));
                let bad = e.error_len().unwrap_or(rest.len());
                for byte in &rest[..bad] {
                    let _ = write!(out, "\\x{byte:02x}");
                }
                b = &rest[bad..];
            }
        }
    }
}

fn push_escaped(out: &mut String, s: &str) {
    for c in s.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') || is_bidi_control(c) {
            for byte in c.encode_utf8(&mut [0; 4]).bytes() {
                let _ = write!(out, "\\x{byte:02x}");
            }
        } else {
            out.push(c);
        }
    }
}

/// The characters that change the display order of the text around them
/// (Unicode's Bidi_Control property).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Bytes in binary units, e.g. `1.5 GiB`.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Signed bytes in binary units, e.g. `-2.0 KiB` (space freed can be
/// negative: a run can cost space).
pub fn human_signed(n: i64) -> String {
    if n < 0 {
        format!("-{}", human(n.unsigned_abs()))
    } else {
        human(n as u64)
    }
}

/// A duration in milliseconds: tenths of seconds below 10 s (`4.2s`), then
/// whole seconds as `1h 2m 3s`.
pub fn human_duration_ms(ms: u64) -> String {
    if ms < 10_000 {
        return format!("{:.1}s", ms as f64 / 1e3);
    }
    humantime::format_duration(std::time::Duration::from_secs(ms / 1000)).to_string()
}

/// Unix seconds as an ISO 8601 date and time in UTC, e.g.
/// `2026-11-23T15:04:05Z` (UTC: the same on every machine and in the
/// journal, and it sorts).
pub fn iso_time(unix: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn long_paths_show_both_ends_and_what_was_left_out() {
        assert_eq!(display_long_path(Path::new("/srv/a/b")), "/srv/a/b");
        let long = format!("/srv/{}é\n", "d/".repeat(1000));
        let shown = display_long_path(Path::new(&long));
        // Escaped first (the newline is 4 characters), then shortened.
        let left = long.chars().count() + 3 - 2 * SHOWN_EACH_END;
        let cut = format!("[… {left} characters …]");
        assert!(shown.starts_with("/srv/d/d/") && shown.ends_with("d/é\\x0a"), "{shown}");
        assert!(shown.contains(&cut), "{shown}");
        assert_eq!(shown.chars().count(), 2 * SHOWN_EACH_END + cut.chars().count());
    }

    #[test]
    fn escapes_non_utf8_losslessly() {
        let p = Path::new(OsStr::from_bytes(b"/a/\xffb\\c/\xc3\xa9"));
        assert_eq!(display_path(p), "/a/\\xffb\\\\c/é");
    }

    #[test]
    fn escapes_control_characters_losslessly() {
        let p = Path::new(OsStr::from_bytes("/a\n<3>b\x1b[31m\t\u{85}\u{2028}é".as_bytes()));
        assert_eq!(display_path(p), r"/a\x0a<3>b\x1b[31m\x09\xc2\x85\xe2\x80\xa8é");
    }

    #[test]
    fn escapes_bidirectional_controls_losslessly() {
        let p = Path::new(OsStr::from_bytes("/srv/a/\u{202e}gol.txt\u{2066}x\u{061c}\u{200f}".as_bytes()));
        assert_eq!(display_path(p), r"/srv/a/\xe2\x80\xaegol.txt\xe2\x81\xa6x\xd8\x9c\xe2\x80\x8f");
        // Other non-ASCII text is shown as it is.
        assert_eq!(display_path(Path::new("/srv/日本/العربية")), "/srv/日本/العربية");
    }

    #[test]
    fn human_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
        assert_eq!(human_signed(-2048), "-2.0 KiB");
    }

    #[test]
    fn iso_dates() {
        assert_eq!(iso_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso_time(1_795_000_000), "2026-11-18T11:06:40Z");
    }
}
