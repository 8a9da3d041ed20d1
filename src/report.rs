//! The run's report: one value, rendered as text for people or as one JSON
//! document (`--json`) for scripts. Its JSON form is described by
//! `schema/report.schema.json`.
//!
//! Every figure called "freed" is measured with `statfs` before and after
//! sharing; nothing here is estimated.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde::Serialize;

use crate::policy::SkipReason;

/// Version of the report's JSON layout; bumped on incompatible changes.
pub const REPORT_VERSION: u32 = 1;

/// Time spent per phase, in milliseconds.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Timings {
    pub walk_ms: u64,
    pub hash_ms: u64,
    pub plan_ms: u64,
    pub dedupe_ms: u64,
    pub total_ms: u64,
}

/// How the kernel (or, in a dry run, our own compare) answered.
#[derive(Debug, Default, Clone, Serialize)]
pub struct DedupeStatuses {
    /// Destinations whose bytes were equal.
    pub same: u64,
    /// Destinations whose bytes differed: nothing shared.
    pub differs: u64,
    /// Destinations refused with an errno, by errno name.
    pub errors: BTreeMap<String, u64>,
}

/// Work left for a later run, for one reason.
#[derive(Debug, Default, Clone, Serialize)]
pub struct PendingWork {
    /// Destination files.
    pub files: u64,
    /// Duplicate bytes planned into them.
    pub bytes: u64,
}

/// Everything one run did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Report {
    pub report_version: u32,
    pub dedupscan_version: String,
    /// `run` (scan and share) or `scan` (hash only).
    pub command: String,
    pub dry_run: bool,
    pub incremental: bool,
    /// Starting paths, escaped (see [`display_path`]).
    pub paths: Vec<String>,
    pub filesystem: String,
    pub filesystem_uuid: String,
    pub database: String,
    pub block_size: u64,
    /// Regular files considered (after skips).
    pub files_scanned: u64,
    /// Files read and hashed in this run.
    pub files_hashed: u64,
    pub bytes_hashed: u64,
    /// Known files whose size and times had not changed: not reopened.
    pub files_unchanged: u64,
    pub files_renamed: u64,
    pub files_removed: u64,
    /// Sum of the sizes of the files considered.
    pub logical_bytes: u64,
    /// Duplicate ranges the plan found.
    pub ranges_planned: u64,
    /// Bytes found duplicate and verified: byte for byte by our own compare
    /// in a dry run, submitted to the kernel in a real run.
    pub duplicate_bytes: u64,
    /// Bytes the kernel confirmed as shared (0 in a dry run).
    pub deduped_bytes: u64,
    /// Bytes skipped because they already share the source's extents.
    pub already_shared_bytes: u64,
    /// Bytes copied into fresh extents so that partly shared extents could
    /// be freed (btrfs); in a dry run, what would be copied.
    pub rewritten_bytes: u64,
    /// Whole-file groups shared from a copy far less fragmented than the
    /// planned source, so no copy ends up as fragmented as the source was.
    pub sources_swapped: u64,
    /// Free space after minus free space before, from statfs (0 in a dry run).
    pub freed_bytes: i64,
    pub dedupe_status: DedupeStatuses,
    /// Paths not considered, by reason.
    pub skipped: BTreeMap<String, u64>,
    /// Total problems with individual paths or ranges.
    pub errors: u64,
    /// The same problems by kind.
    pub error_kinds: BTreeMap<String, u64>,
    /// Duplicate bytes left for a later run after this one, by reason
    /// (`no_space_rewrite`, `no_space_share`: the volume was full;
    /// `referenced_outside_run`: a read-only snapshot or another file not
    /// in the run keeps the destination's extent, so sharing would free
    /// nothing): the next run, incremental or not, tries them again.
    pub pending: BTreeMap<String, PendingWork>,
    /// Sum of `pending` bytes.
    pub pending_bytes: u64,
    /// Why sharing was not attempted, when it was not (e.g. unsupported filesystem).
    pub sharing_refused: Option<String>,
    /// Whether the run stopped before the end (signal or time budget).
    pub interrupted: bool,
    pub timings: Timings,
}

impl Report {
    pub fn skip(&mut self, r: SkipReason, n: u64) {
        if n == 0 {
            return;
        }
        *self.skipped.entry(r.name().to_owned()).or_default() += n;
    }

    pub fn error(&mut self, kind: &str, n: u64) {
        if n > 0 {
            *self.error_kinds.entry(kind.to_owned()).or_default() += n;
            self.errors += n;
        }
    }

    /// The report as a few lines of text.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let mode = if self.dry_run { " (dry run: nothing changed)" } else { "" };
        let _ = writeln!(s, "dedupscan {}{mode} on {} [{}]", self.command, self.paths.join(", "), self.filesystem);
        let _ = writeln!(
            s,
            "  files: {} considered ({}), {} hashed ({}), {} unchanged, {} renamed, {} removed",
            self.files_scanned,
            human(self.logical_bytes),
            self.files_hashed,
            human(self.bytes_hashed),
            self.files_unchanged,
            self.files_renamed,
            self.files_removed
        );
        if self.command == "run" {
            let verb = if self.dry_run { "would share (verified)" } else { "submitted" };
            let _ = writeln!(
                s,
                "  duplicates: {} in {} ranges {verb}; {} already shared",
                human(self.duplicate_bytes),
                self.ranges_planned,
                human(self.already_shared_bytes)
            );
            if !self.dry_run {
                let _ = writeln!(
                    s,
                    "  shared: {} confirmed by the kernel; rewritten: {}; freed (statfs): {}",
                    human(self.deduped_bytes),
                    human(self.rewritten_bytes),
                    human_signed(self.freed_bytes)
                );
            }
        }
        if self.dry_run && self.rewritten_bytes > 0 {
            let _ = writeln!(
                s,
                "  would rewrite {} of partly shared extents into fresh ones, so the old extents are freed",
                human(self.rewritten_bytes)
            );
        }
        if let Some(why) = &self.sharing_refused {
            let _ = writeln!(s, "  sharing refused: {why}");
        }
        if self.pending_bytes > 0 {
            let list: Vec<String> =
                self.pending.iter().map(|(k, w)| format!("{k}: {} in {} files", human(w.bytes), w.files)).collect();
            let _ = writeln!(s, "  pending: {} left for the next run ({})", human(self.pending_bytes), list.join(", "));
        }
        if !self.skipped.is_empty() {
            let list: Vec<String> = self.skipped.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = writeln!(s, "  skipped: {}", list.join(", "));
        }
        if self.errors > 0 {
            let list: Vec<String> = self.error_kinds.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = writeln!(s, "  errors: {} ({})", self.errors, list.join(", "));
        }
        if self.interrupted {
            let _ = writeln!(s, "  interrupted: the next run carries on");
        }
        let t = &self.timings;
        let _ = writeln!(
            s,
            "  time: {:.1}s (walk {:.1}s, hash {:.1}s, plan {:.1}s, share {:.1}s)",
            t.total_ms as f64 / 1e3,
            t.walk_ms as f64 / 1e3,
            t.hash_ms as f64 / 1e3,
            t.plan_ms as f64 / 1e3,
            t.dedupe_ms as f64 / 1e3
        );
        s
    }
}

/// A path as shown in messages and JSON: valid UTF-8 as is, every other
/// byte as `\xNN`, and a backslash as `\\`, so the form is lossless and can
/// be turned back into the original bytes.
pub fn display_path(p: &Path) -> String {
    escape_bytes(p.as_os_str().as_bytes())
}

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
        } else {
            out.push(c);
        }
    }
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

fn human_signed(n: i64) -> String {
    if n < 0 {
        format!("-{}", human(n.unsigned_abs()))
    } else {
        human(n as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn escapes_non_utf8_losslessly() {
        let p = Path::new(OsStr::from_bytes(b"/a/\xffb\\c/\xc3\xa9"));
        assert_eq!(display_path(p), "/a/\\xffb\\\\c/é");
    }

    #[test]
    fn human_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
        assert_eq!(human_signed(-2048), "-2.0 KiB");
    }

    #[test]
    fn json_has_the_documented_keys() {
        let v = serde_json::to_value(Report::default()).unwrap();
        for k in [
            "dry_run",
            "files_scanned",
            "files_hashed",
            "bytes_hashed",
            "duplicate_bytes",
            "deduped_bytes",
            "freed_bytes",
            "skipped",
            "errors",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
    }
}
