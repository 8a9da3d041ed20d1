//! Paths made canonical following only symlinks nobody else could have
//! planted.
//!
//! `std::fs::canonicalize` follows every symlink on the way. A root run
//! resolving a path that goes through a directory another user owns then
//! goes wherever that user's symlink points: a `--db` path through `/tmp`
//! or a user's directory sent the database into any root-owned directory
//! they chose (`db/place.rs`), and a starting path such as
//! `/home/alice/vms`, which alice can replace at any moment with a symlink
//! to `/root`, made the run read, record and share files it was never
//! given (`config.rs`). [`resolve`] walks the path one component at a time
//! and follows a symlink only if root or the user running dedupscan owns
//! it and the directory holding it passes [`check_chain`] (owned by root or
//! that user, writable by nobody else unless sticky, and so every directory
//! above it): nobody else could have put it there or replaced it.

use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Stat};

use crate::display::display_path;

/// Who may own the directories and symlinks a path is resolved through
/// (and the database's files): root, or the user running dedupscan.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Why [`resolve`] stopped.
#[derive(Debug)]
pub enum Resolve {
    /// A component cannot be read, is not a directory, or symlinks loop.
    Io(io::Error),
    /// A symlink on the way that another user could have put there.
    Unsafe(String),
}

/// `dir` made canonical one component at a time, as `canonicalize` does,
/// but a symlink met on the way is followed only if root or the user
/// running dedupscan owns it and the directory holding it passes
/// [`check_chain`] (so nobody else could have put it there or replaced
/// it). `canonicalize` followed any: a symlink a user planted in `/tmp`,
/// or in their own directory, at a name of `--db`'s path sent the database
/// (and the directories still missing) into any root-owned directory they
/// chose, which the checks of the canonical path then accepted; a starting
/// path through a user's directory was theirs to redirect. Returns
/// the longest existing prefix, canonical, and the names below it still
/// missing (innermost first). `file_last`: the last component may be
/// something other than a directory.
pub fn resolve(dir: &Path, file_last: bool) -> Result<(PathBuf, Vec<OsString>), Resolve> {
    /// Components of `p` pushed so that the first is popped first.
    fn push(todo: &mut Vec<OsString>, p: &Path) {
        for c in p.components().rev() {
            match c {
                Component::Normal(n) => todo.push(n.to_owned()),
                Component::ParentDir => todo.push("..".into()),
                _ => {}
            }
        }
    }
    let mut cur = if dir.is_absolute() { PathBuf::from("/") } else { std::env::current_dir().map_err(Resolve::Io)? };
    let (mut todo, mut links) = (Vec::new(), 0);
    push(&mut todo, dir);
    while let Some(name) = todo.pop() {
        if name == ".." {
            cur.pop();
            continue;
        }
        let next = cur.join(&name);
        let st = match rustix::fs::lstat(&next) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) if !todo.iter().any(|n| n == "..") => {
                todo.push(name);
                return Ok((cur, todo));
            }
            Err(e) => return Err(Resolve::Io(e.into())),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => cur = next,
            FileType::Symlink if links >= 40 => return Err(Resolve::Io(io::Error::from_raw_os_error(libc::ELOOP))),
            FileType::Symlink => {
                links += 1;
                if st.st_uid != 0 && st.st_uid != euid() {
                    return Err(Resolve::Unsafe(format!(
                        "{} on the way is a symbolic link owned by uid {}: only root or uid {} may own one",
                        display_path(&next),
                        st.st_uid,
                        euid()
                    )));
                }
                check_chain(&cur, false).map_err(Resolve::Unsafe)?;
                let target = std::fs::read_link(&next).map_err(Resolve::Io)?;
                if target.is_absolute() {
                    cur = PathBuf::from("/");
                }
                push(&mut todo, &target);
            }
            // The last component may be a file where the caller allows
            // it (a starting path that is a file); the caller checks what
            // it is when it opens it.
            _ if file_last && todo.is_empty() => cur = next,
            _ => return Err(Resolve::Io(io::Error::from_raw_os_error(libc::ENOTDIR))),
        }
    }
    Ok((cur, Vec::new()))
}

/// Check the canonical directory `dir` and every directory above it: each
/// owned by root or the user running dedupscan, and writable by nobody
/// else unless it is sticky (otherwise its owner could rename what lies
/// below away and put their own in its place). `last`: `dir` is where the
/// database goes (no write bit for others, sticky or not: they could create
/// its files first); otherwise only a directory on the way. Returns `dir`'s
/// `lstat`, or why it fails.
pub fn check_chain(dir: &Path, last: bool) -> Result<Stat, String> {
    let me = euid();
    let mut out = None;
    for (i, d) in dir.ancestors().enumerate() {
        let st =
            rustix::fs::lstat(d).map_err(|e| format!("cannot check {}: {}", display_path(d), io::Error::from(e)))?;
        let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
        let (others_write, sticky) = (st.st_mode & 0o022 != 0, st.st_mode & 0o1000 != 0);
        let what = if i == 0 && last { "its directory" } else { "a directory above it" };
        if !is_dir {
            return Err(format!("{what}, {}, is not a directory", display_path(d)));
        }
        if st.st_uid != 0 && st.st_uid != me {
            return Err(format!(
                "{what}, {}, is owned by uid {}: only root or uid {me} may own it",
                display_path(d),
                st.st_uid
            ));
        }
        if others_write && (i == 0 && last || !sticky) {
            return Err(format!(
                "{what}, {}, is writable by others (mode {:o}{})",
                display_path(d),
                st.st_mode & 0o7777,
                if sticky {
                    "; the sticky bit does not keep them from creating the database's files first"
                } else {
                    ""
                }
            ));
        }
        if i == 0 {
            out = Some(st);
        }
    }
    out.ok_or_else(|| "no directory".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn unsafe_reason(r: Result<(PathBuf, Vec<OsString>), Resolve>) -> String {
        match r {
            Err(Resolve::Unsafe(why)) => why,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_starting_path_that_is_a_file_resolves_through_our_own_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let top = std::fs::canonicalize(d.path()).unwrap();
        std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::create_dir(top.join("real")).unwrap();
        std::fs::write(top.join("real/f"), b"x").unwrap();
        symlink("real", top.join("link")).unwrap();
        symlink("f", top.join("real/flink")).unwrap();
        let (c, missing) = resolve(&top.join("link/flink"), true).unwrap();
        assert_eq!((c, missing.len()), (top.join("real/f"), 0));
        // A file on the way, or as the last component where only
        // directories are allowed, is not a directory.
        assert!(matches!(resolve(&top.join("real/f"), false), Err(Resolve::Io(_))));
        assert!(matches!(resolve(&top.join("real/f/x"), true), Err(Resolve::Io(_))));
        // Missing names are returned, not followed.
        let (c, missing) = resolve(&top.join("link/none"), true).unwrap();
        assert_eq!((c, missing), (top.join("real"), vec![OsString::from("none")]));
    }

    #[test]
    fn a_symlink_another_user_could_have_planted_is_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let top = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir(top.join("real")).unwrap();
        symlink("real", top.join("link")).unwrap();
        // Ours, in a directory others can write: they could replace it.
        std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o777)).unwrap();
        let why = unsafe_reason(resolve(&top.join("link"), true));
        assert!(why.contains("writable by others"), "{why}");
        std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(resolve(&top.join("link"), true).is_ok());
        if euid() != 0 {
            return;
        }
        // Another user's symlink, in our own directory.
        let uid = Some(rustix::fs::Uid::from_raw(65534));
        rustix::fs::chownat(rustix::fs::CWD, top.join("link"), uid, None, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            .unwrap();
        let why = unsafe_reason(resolve(&top.join("link"), true));
        assert!(why.contains("symbolic link owned by uid 65534"), "{why}");
        // Ours, in a directory another user owns (they could have moved a
        // symlink of root's there from elsewhere).
        std::fs::remove_file(top.join("link")).unwrap();
        std::fs::create_dir(top.join("theirs")).unwrap();
        symlink("../real", top.join("theirs/link")).unwrap();
        rustix::fs::chownat(rustix::fs::CWD, top.join("theirs"), uid, None, rustix::fs::AtFlags::empty()).unwrap();
        let why = unsafe_reason(resolve(&top.join("theirs/link"), true));
        assert!(why.contains("owned by uid 65534"), "{why}");
        // Their directory itself, without a symlink, is fine.
        assert_eq!(resolve(&top.join("theirs"), true).unwrap().0, top.join("theirs"));
    }
}
