//! The shape rules of the source tree (issue 17), checked on every test run.
//!
//! Reads `src/**/*.rs` as text (no root, no build of anything but this file)
//! and collects every violation of:
//!
//! - no file over [`MAX_FILE_LINES`] lines, no `fn` over [`MAX_FN_LINES`]
//!   (tests included: a `#[cfg(test)]` module's fns count too);
//! - no module imports a module above it in [`LAYERS`] (`use crate::x`,
//!   `crate::x::` paths and `use crate::{x, ..}` groups; `super::` is local);
//! - no FIEMAP flag bit (`FIEMAP_EXTENT_*`) outside `src/sys/`;
//! - nothing in `src/db/` exposes the rusqlite `Connection` (`Db` owns it).
//!
//! Violations listed in `tests/layout-allow.txt` (one key a line, as printed
//! by this test; `#` starts a comment) are tolerated: the baseline of the
//! tree before the restructuring, to be emptied once it lands. Any other
//! violation fails the test, with the full list. The checks read code with
//! comments and string and char literals blanked, so a path in a doc comment
//! or a message is not an import.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Longest source file, in lines.
const MAX_FILE_LINES: usize = 600;
/// Longest function, from its `fn` line to its closing brace.
const MAX_FN_LINES: usize = 80;

/// The layer order, bottom first: a module may import its own layer and the
/// ones below it, never one above. Names are those of the target layout;
/// the old names map to the layer of their successor (`run` → `pipeline`,
/// `history` → `summary`, `types` → `file`, `bookend` → `dedupe`), and a
/// module that does not exist yet is simply absent from the tree.
const LAYERS: &[(&str, &[&str])] = &[
    // Vocabulary anyone may import; imports only each other (`sys/` holds
    // all unsafe code and every ioctl).
    (
        "base",
        &["sys", "batched", "exit", "display", "errors", "file", "types", "blockmap", "progress", "policy", "corpus"],
    ),
    // The pipeline stages, in the order data flows.
    ("walk", &["walk"]),
    ("hash", &["hash"]),
    ("changes", &["changes"]),
    ("db", &["db"]),
    ("plan", &["plan"]),
    ("dedupe", &["dedupe", "bookend"]),
    ("report", &["report", "summary", "history", "html", "metrics"]),
    // Drives the stages; nothing imports it.
    ("top", &["pipeline", "run", "config", "cli", "main"]),
];

/// One broken rule: `key` identifies it in the baseline (stable across
/// edits that only move lines), `detail` says where and by how much.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Violation {
    key: String,
    detail: String,
}

fn v(key: String, detail: String) -> Violation {
    Violation { key, detail }
}

#[test]
fn source_layout_rules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for path in rust_files(&root.join("src")) {
        let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
        found.extend(check_file(&rel, &text));
    }
    let allow_path = root.join("tests/layout-allow.txt");
    let allowed: BTreeSet<String> = std::fs::read_to_string(&allow_path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split('#').next().unwrap().trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    let new: Vec<&Violation> = found.iter().filter(|f| !allowed.contains(&f.key)).collect();
    let keys: BTreeSet<&str> = found.iter().map(|f| f.key.as_str()).collect();
    let stale: Vec<&String> = allowed.iter().filter(|a| !keys.contains(a.as_str())).collect();
    if !stale.is_empty() {
        // Fixed since the baseline was written: worth deleting from it.
        eprintln!("layout: {} baseline entries no longer occur:", stale.len());
        for s in &stale {
            eprintln!("  {s}");
        }
    }
    let list = |vs: &[&Violation]| vs.iter().map(|f| format!("  {}\n      {}\n", f.key, f.detail)).collect::<String>();
    assert!(
        new.is_empty(),
        "{} layout violation(s) not in tests/layout-allow.txt (the rules: tests/layout.rs):\n{}",
        new.len(),
        list(&new)
    );
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in walkdir::WalkDir::new(dir).sort_by_file_name() {
        let e = e.unwrap();
        if e.file_type().is_file() && e.path().extension().is_some_and(|x| x == "rs") {
            out.push(e.into_path());
        }
    }
    out
}

/// All violations of one file; `rel` is its path from the crate root.
fn check_file(rel: &str, text: &str) -> Vec<Violation> {
    let mut out = Vec::new();
    let lines = text.lines().count();
    if lines > MAX_FILE_LINES {
        out.push(v(format!("file-lines {rel}"), format!("{rel}: {lines} lines (max {MAX_FILE_LINES})")));
    }
    let code = blank(text);
    if code.matches('{').count() != code.matches('}').count() {
        // The blanking misread a literal or comment: the fn lengths of this
        // file cannot be trusted, so say so rather than guess.
        out.push(v(format!("unbalanced {rel}"), format!("{rel}: braces do not balance once literals are blanked")));
    }
    for (name, line, len) in functions(&code) {
        if len > MAX_FN_LINES {
            out.push(v(
                format!("fn-lines {rel} {name}"),
                format!("{rel}:{line}: fn {name} is {len} lines (max {MAX_FN_LINES})"),
            ));
        }
    }
    out.extend(check_imports(rel, &code));
    if !rel.starts_with("src/sys/") {
        if let Some(at) = code.find("FIEMAP_EXTENT_") {
            out.push(v(
                format!("fiemap-bit {rel}"),
                format!("{rel}:{}: FIEMAP flag bits belong in src/sys/", line_of(&code, at)),
            ));
        }
    }
    if rel.starts_with("src/db/") {
        out.extend(check_connection(rel, &code));
    }
    out
}

/// 1-based line number of byte offset `at`.
fn line_of(code: &str, at: usize) -> usize {
    code[..at].matches('\n').count() + 1
}

/// `text` with comments and the contents of string and char literals
/// replaced by spaces (newlines kept), so byte offsets and line numbers are
/// those of the original and braces, `crate::` and `fn` only match code.
fn blank(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    // Pushes `ch` as itself (keep) or as blanks of the same UTF-8 length.
    let put = |out: &mut String, ch: char, keep: bool| {
        if keep || ch == '\n' {
            out.push(ch);
        } else {
            out.extend(std::iter::repeat_n(' ', ch.len_utf8()));
        }
    };
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(k).copied().unwrap_or('\0');
        if c[i] == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                put(&mut out, c[i], false);
                i += 1;
            }
        } else if c[i] == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            loop {
                if i >= c.len() {
                    break;
                }
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    put(&mut out, c[i], false);
                    put(&mut out, c[i + 1], false);
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    put(&mut out, c[i], false);
                    put(&mut out, c[i + 1], false);
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    put(&mut out, c[i], false);
                    i += 1;
                }
            }
        } else if (c[i] == 'r' || (c[i] == 'b' || c[i] == 'c') && at(i + 1) == 'r') && (i == 0 || !ident(c[i - 1])) && {
            let s = if c[i] == 'r' { i + 1 } else { i + 2 };
            let mut k = s;
            while at(k) == '#' {
                k += 1;
            }
            at(k) == '"'
        } {
            // Raw string: r"..", r#".."#, br"..", cr"..".
            let s = if c[i] == 'r' { i + 1 } else { i + 2 };
            let mut k = s;
            while at(k) == '#' {
                k += 1;
            }
            let hashes = k - s;
            for &ch in &c[i..=k] {
                put(&mut out, ch, true);
            }
            i = k + 1;
            while i < c.len() {
                if c[i] == '"' && (1..=hashes).all(|h| at(i + h) == '#') {
                    for &ch in &c[i..=i + hashes] {
                        put(&mut out, ch, true);
                    }
                    i += hashes + 1;
                    break;
                }
                put(&mut out, c[i], false);
                i += 1;
            }
        } else if c[i] == '"' {
            put(&mut out, '"', true);
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' && i + 1 < c.len() {
                    put(&mut out, c[i], false);
                    i += 1;
                }
                put(&mut out, c[i], false);
                i += 1;
            }
            if i < c.len() {
                put(&mut out, '"', true);
                i += 1;
            }
        } else if c[i] == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            // A char literal ('x', '\n', '\u{..}'); otherwise a lifetime.
            put(&mut out, '\'', true);
            i += 1;
            while i < c.len() && c[i] != '\'' {
                if c[i] == '\\' {
                    put(&mut out, c[i], false);
                    i += 1;
                }
                put(&mut out, c[i], false);
                i += 1;
            }
            if i < c.len() {
                put(&mut out, '\'', true);
                i += 1;
            }
        } else if ident(c[i]) {
            // A whole identifier, so the `r` of `for` is not a raw string.
            while i < c.len() && ident(c[i]) {
                put(&mut out, c[i], true);
                i += 1;
            }
        } else {
            put(&mut out, c[i], true);
            i += 1;
        }
    }
    out
}

/// Identifier starting at byte `at` of `code` (ASCII identifiers).
fn ident_at(code: &str, at: usize) -> &str {
    let rest = &code[at..];
    let end = rest.find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_')).unwrap_or(rest.len());
    &rest[..end]
}

/// Whether the word at `at` stands alone (not part of a longer identifier).
fn word_at(code: &str, at: usize, word: &str) -> bool {
    let b = code.as_bytes();
    let is_id = |x: u8| x.is_ascii_alphanumeric() || x == b'_';
    code[at..].starts_with(word) && (at == 0 || !is_id(b[at - 1])) && b.get(at + word.len()).is_none_or(|&x| !is_id(x))
}

/// Every `fn` with a body in blanked `code`: (name, first line, length in
/// lines from the `fn` line to the closing brace).
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(off) = code[at..].find("fn") {
        let start = at + off;
        at = start + 2;
        if !word_at(code, start, "fn") {
            continue;
        }
        let mut k = start + 2;
        while k < b.len() && b[k].is_ascii_whitespace() {
            k += 1;
        }
        let name = ident_at(code, k);
        if name.is_empty() {
            continue; // `fn(u8) -> u8`, a pointer type
        }
        // The body opens at the first `{` outside parentheses and brackets;
        // a `;` there first means a declaration without a body.
        let mut depth = 0i32;
        let mut open = None;
        while k < b.len() {
            match b[k] {
                b'(' | b'[' => depth += 1,
                b')' | b']' => depth -= 1,
                b';' if depth == 0 => break,
                b'{' if depth == 0 => {
                    open = Some(k);
                    break;
                }
                _ => {}
            }
            k += 1;
        }
        let Some(open) = open else { continue };
        let mut braces = 0i32;
        let mut close = b.len() - 1;
        for (j, &x) in b.iter().enumerate().skip(open) {
            match x {
                b'{' => braces += 1,
                b'}' => {
                    braces -= 1;
                    if braces == 0 {
                        close = j;
                        break;
                    }
                }
                _ => {}
            }
        }
        let first = line_of(code, start);
        out.push((name.to_owned(), first, line_of(code, close) - first + 1));
    }
    out
}

/// Layer index of a top-level module name, if the table knows it.
fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, names)| names.contains(&module))
}

/// The top-level module a file of `src/` belongs to (`src/db/writer.rs` →
/// `db`); `None` for the crate root `src/lib.rs`.
fn module_of(rel: &str) -> Option<&str> {
    let rest = rel.strip_prefix("src/")?;
    if rest == "lib.rs" {
        return None;
    }
    let first = rest.split('/').next().unwrap();
    Some(first.strip_suffix(".rs").unwrap_or(first))
}

/// Imports of a module above the file's own, and modules missing from
/// [`LAYERS`] (the table must name every module to check it).
fn check_imports(rel: &str, code: &str) -> Vec<Violation> {
    let Some(me) = module_of(rel) else { return Vec::new() };
    let Some(my_layer) = layer(me) else {
        return vec![v(
            format!("unknown-module {me}"),
            format!("{rel}: module `{me}` is not in LAYERS (tests/layout.rs)"),
        )];
    };
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (target, at) in crate_paths(code) {
        if target == me || !seen.insert(target.clone()) {
            continue;
        }
        let line = line_of(code, at);
        match layer(&target) {
            None => out.push(v(
                format!("unknown-module {target}"),
                format!("{rel}:{line}: imports `crate::{target}`, which is not in LAYERS (tests/layout.rs)"),
            )),
            Some(l) if l > my_layer => out.push(v(
                format!("layer {rel} -> {target}"),
                format!(
                    "{rel}:{line}: `{me}` ({} layer) imports `{target}` ({} layer, above it)",
                    LAYERS[my_layer].0, LAYERS[l].0
                ),
            )),
            Some(_) => {}
        }
    }
    out
}

/// Every top-level module named after `crate::` (or `$crate::`), with the
/// offset of the path: `crate::a::b` gives `a`, `crate::{a, b::c}` gives `a`
/// and `b`.
fn crate_paths(code: &str) -> Vec<(String, usize)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(off) = code[at..].find("crate") {
        let start = at + off;
        at = start + 5;
        let after_dollar = start > 0 && b[start - 1] == b'$';
        if !(word_at(code, start, "crate") || after_dollar && code[start..].starts_with("crate")) {
            continue;
        }
        let mut k = start + 5;
        while k < b.len() && b[k].is_ascii_whitespace() {
            k += 1;
        }
        if !code[k..].starts_with("::") {
            continue; // `pub(crate)`
        }
        k += 2;
        while k < b.len() && b[k].is_ascii_whitespace() {
            k += 1;
        }
        if b.get(k) == Some(&b'{') {
            // A group: the first identifier of each top-level item.
            let mut depth = 0;
            let mut expect = true;
            for (j, &x) in b.iter().enumerate().skip(k) {
                match x {
                    b'{' => {
                        depth += 1;
                        if depth == 1 {
                            expect = true;
                        }
                    }
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    b',' if depth == 1 => expect = true,
                    x if expect && depth == 1 && (x.is_ascii_alphabetic() || x == b'_') => {
                        let name = ident_at(code, j);
                        if name != "self" {
                            out.push((name.to_owned(), j));
                        }
                        expect = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident_at(code, k);
            if !name.is_empty() {
                out.push((name.to_owned(), start));
            }
        }
    }
    out
}

/// Items of `src/db/` visible outside their module that hand out the
/// connection: a `pub conn`, a pub field, alias or re-export whose type
/// names `Connection` or `Transaction`, a pub fn returning one.
/// `pub(super)` in a file below `db/mod.rs` stays inside `db` and is fine.
fn check_connection(rel: &str, code: &str) -> Vec<Violation> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut at = 0;
    let names_conn =
        |s: &str| ["Connection", "Transaction"].iter().any(|w| s.match_indices(w).any(|(i, _)| word_at(s, i, w)));
    while let Some(off) = code[at..].find("pub") {
        let start = at + off;
        at = start + 3;
        if !word_at(code, start, "pub") {
            continue;
        }
        let mut k = start + 3;
        let skip_ws = |k: &mut usize| {
            while *k < b.len() && b[*k].is_ascii_whitespace() {
                *k += 1;
            }
        };
        skip_ws(&mut k);
        if b.get(k) == Some(&b'(') {
            let close = k + code[k..].find(')').unwrap_or(0);
            let scope = code[k + 1..close].trim();
            if scope == "self" || scope == "super" && rel != "src/db/mod.rs" {
                continue;
            }
            k = close + 1;
            skip_ws(&mut k);
        }
        let word = ident_at(code, k);
        // The item's header: a fn's signature up to its body, anything
        // else up to the end of the field or statement.
        let mut depth = 0i32;
        let mut end = k;
        while end < b.len() {
            let prev = if end > 0 { b[end - 1] } else { b' ' };
            let next = b.get(end + 1).copied().unwrap_or(b' ');
            // `<` opens generics after a name or `::` (not `8 << 2`, `a <= b`).
            let generic =
                (prev.is_ascii_alphanumeric() || prev == b'_' || prev == b':') && next != b'<' && next != b'=';
            match b[end] {
                b'(' | b'[' => depth += 1,
                b'<' if generic => depth += 1,
                // Not the `>` of `->` or `=>`.
                b'>' if depth > 0 && prev != b'-' && prev != b'=' => depth -= 1,
                b')' | b']' if depth > 0 => depth -= 1,
                b'{' if word == "fn" || depth == 0 => break,
                b';' if depth == 0 => break,
                b',' | b'}' | b')' if depth == 0 && word != "fn" => break,
                _ => {}
            }
            end += 1;
        }
        let header = &code[k..end];
        let exposes = match word {
            "conn" => true,
            "fn" => header.split_once("->").is_some_and(|(_, ret)| names_conn(ret)),
            "struct" | "enum" | "mod" | "trait" | "impl" => false,
            _ => names_conn(header),
        };
        if exposes {
            let item = header.split_whitespace().collect::<Vec<_>>().join(" ");
            let name = if word == "fn" { ident_at(header[2..].trim_start(), 0) } else { word };
            out.push(v(
                format!("db-conn {rel} {name}"),
                format!("{rel}:{}: `pub {item}` exposes the database connection", line_of(code, start)),
            ));
        }
    }
    out
}

#[cfg(test)]
mod self_tests {
    use super::*;

    #[test]
    fn blank_hides_comments_strings_and_chars() {
        let src = "let a = \"crate::x {\"; // crate::y {\n/* a /* nested */ { */ let c = '{'; let l: &'a str = r#\"}\"#; fn f() {}";
        let code = blank(src);
        assert_eq!(code.len(), src.len());
        assert!(!code.contains("crate"), "{code}");
        assert_eq!(code.matches('{').count(), 1, "{code}");
        assert_eq!(code.matches('}').count(), 1, "{code}");
        assert!(code.contains("&'a str"), "a lifetime is not a char literal: {code}");
    }

    #[test]
    fn fn_lengths_and_declarations() {
        let code = blank("trait T { fn d(&self); }\nfn a(x: [u8; 2]) -> u8 {\n  let s = \"}\";\n  x[0]\n}\nfn p(f: fn(u8) -> u8) {}\n");
        assert_eq!(
            functions(&code),
            vec![("a".to_owned(), 2, 4), ("p".to_owned(), 6, 1)],
            "a declaration has no body; `fn(u8)` is a type"
        );
    }

    #[test]
    fn imports_by_path_group_and_use() {
        let code = blank("use crate::{db::Db, plan::{self, Fp}, walk};\nfn f() { crate::report::human(1); }\npub(crate) fn g() {}\nuse super::x;\n");
        let names: Vec<String> = crate_paths(&code).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["db", "plan", "walk", "report"]);
        let found = check_imports("src/walk.rs", &code);
        let keys: Vec<&str> = found.iter().map(|f| f.key.as_str()).collect();
        assert_eq!(keys, ["layer src/walk.rs -> db", "layer src/walk.rs -> plan", "layer src/walk.rs -> report"]);
        assert!(check_imports("src/run.rs", &code).is_empty(), "the top layer imports anything");
    }

    #[test]
    fn connection_exposure() {
        let src = "pub struct Db {\n    pub conn: Connection,\n    inner: Connection,\n}\n\
                   pub fn open(p: &Path) -> Result<Connection, E> { todo!() }\n\
                   pub fn take(c: &Connection) -> u8 { 0 }\npub(super) fn t() -> Transaction<'_> { todo!() }\n";
        let keys = |rel| check_connection(rel, &blank(src)).into_iter().map(|f| f.key).collect::<Vec<_>>();
        assert_eq!(keys("src/db/writer.rs"), ["db-conn src/db/writer.rs conn", "db-conn src/db/writer.rs open"]);
        assert_eq!(keys("src/db/mod.rs").len(), 3, "pub(super) in db/mod.rs reaches the whole crate");
    }

    #[test]
    fn fiemap_bits_outside_sys() {
        let src = "const X: u32 = libc::FIEMAP_EXTENT_SHARED; // FIEMAP_EXTENT_LAST\n";
        assert_eq!(check_file("src/hash.rs", src).len(), 1);
        assert!(check_file("src/sys/fiemap.rs", src).is_empty());
        assert!(check_file("src/hash.rs", "// FIEMAP_EXTENT_LAST\n").is_empty(), "comments may name them");
    }
}
