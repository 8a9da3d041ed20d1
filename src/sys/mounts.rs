//! The mount table (`/proc/self/mountinfo`) and `/proc/swaps`: which
//! directories are mount points, where a path lies within its filesystem,
//! what the filesystem is mounted with, which files are swap.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Every mount point on this machine, from `/proc/self/mountinfo`.
pub fn mount_points() -> HashSet<PathBuf> {
    let text = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
    text.split(|&b| b == b'\n')
        .filter_map(|line| line.split(|&b| b == b' ').nth(4))
        .map(|p| PathBuf::from(OsStr::from_bytes(&unescape_octal(p))))
        .collect()
}

/// One line of `/proc/self/mountinfo`: the filesystem's device
/// (`major:minor`, the same for every mount of one filesystem, btrfs
/// subvolumes included), the directory of it the mount shows (`/` for a
/// plain mount, the bound directory for a bind mount, with the subvolume's
/// path on btrfs), where it is mounted, and the filesystem's own options
/// (the same for every mount of it: `compress-force=zstd:3`, …).
struct Mount {
    dev: Vec<u8>,
    root: PathBuf,
    at: PathBuf,
    fstype: Vec<u8>,
    options: Vec<u8>,
}

fn mounts() -> Vec<Mount> {
    parse_mountinfo(&std::fs::read("/proc/self/mountinfo").unwrap_or_default())
}

fn parse_mountinfo(text: &[u8]) -> Vec<Mount> {
    text.split(|&b| b == b'\n')
        .filter_map(|line| {
            let mut f = line.split(|&b| b == b' ').skip(2);
            let (dev, root, at) = (f.next()?, f.next()?, f.next()?);
            // Then the mount's options and optional fields up to "-", the
            // type, the source, and the filesystem's options.
            let mut tail = f.skip_while(|&x| x != b"-").skip(1);
            let fstype = tail.next().unwrap_or_default().to_vec();
            let options = tail.nth(1).unwrap_or_default().to_vec();
            let path = |p: &[u8]| PathBuf::from(OsStr::from_bytes(&unescape_octal(p)));
            Some(Mount { dev: dev.to_vec(), root: path(root), at: path(at), fstype, options })
        })
        .collect()
}

/// Where each filesystem of type `fstype` is mounted, one mount point per
/// device (`major:minor`), its first in the table.
pub fn mounted(fstype: &str) -> Vec<((u32, u32), PathBuf)> {
    let mut seen = HashSet::new();
    mounts()
        .into_iter()
        .filter(|m| m.fstype == fstype.as_bytes() && seen.insert(m.dev.clone()))
        .filter_map(|m| {
            let (major, minor) = std::str::from_utf8(&m.dev).ok()?.split_once(':')?;
            Some(((major.parse().ok()?, minor.parse().ok()?), m.at))
        })
        .collect()
}

/// Other mounts of the filesystem holding the canonical path `p` that show
/// its root (`/`): on btrfs, where the top-level subvolume is mounted while
/// `p` is in a subvolume mounted on its own (`subvol=@`). The caller checks
/// what it opens there is the same filesystem.
pub fn roots_of_fs(p: &Path) -> Vec<PathBuf> {
    let all = mounts();
    let Some(here) = holding(&all, p) else { return Vec::new() };
    all.iter().filter(|m| m.dev == here.dev && m.root == Path::new("/")).map(|m| m.at.clone()).collect()
}

/// Whether the btrfs filesystem holding the canonical path `p` is mounted
/// with `compress-force`: then every write of more than one block is
/// compressed, a copy of compressed data included. (With `compress` a
/// heuristic decides, and data compressed by `btrfs filesystem defragment
/// -c` or a directory's `+c` is written plain by a file elsewhere.)
pub fn compression_forced(p: &Path) -> bool {
    forced_in(&mounts(), p)
}

fn forced_in(mounts: &[Mount], p: &Path) -> bool {
    with_option(mounts, p, |o| o.starts_with(b"compress-force"))
}

/// Whether the btrfs filesystem holding the canonical path `p` is mounted
/// `nodatasum` or `nodatacow`: files made there now keep no data checksums
/// (see `sys::btrfs_tree`).
pub fn checksums_off(p: &Path) -> bool {
    checksums_off_in(&mounts(), p)
}

fn checksums_off_in(mounts: &[Mount], p: &Path) -> bool {
    with_option(mounts, p, |o| o == b"nodatasum" || o == b"nodatacow")
}

/// Whether the mount holding `p` has an option `is` accepts.
fn with_option(mounts: &[Mount], p: &Path, is: impl Fn(&[u8]) -> bool) -> bool {
    holding(mounts, p).is_some_and(|m| m.options.split(|&b| b == b',').any(is))
}

/// The mount holding the canonical path `p`: the deepest mount point above
/// it; of equal ones the last listed, mounted over the others.
fn holding<'m>(mounts: &'m [Mount], p: &Path) -> Option<&'m Mount> {
    mounts.iter().filter(|m| p.starts_with(&m.at)).max_by_key(|m| m.at.as_os_str().len())
}

/// Where each of `paths` (canonical) lies within its filesystem: the root
/// of the mount holding it joined with the rest of the path below that
/// mount point. Two paths of one filesystem that lead to the same
/// directory, a bind mount of it included, give the same answer, which
/// their own paths do not. A path under no listed mount is returned as it
/// is.
pub fn paths_in_fs(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mounts = mounts();
    paths
        .iter()
        .map(|p| match holding(&mounts, p) {
            Some(m) => m.root.join(p.strip_prefix(&m.at).unwrap_or(p)),
            None => p.clone(),
        })
        .collect()
}

/// The directories above the canonical path `p` that its own path does
/// not pass through: when the mount holding `p` shows only part of its
/// filesystem (a bind mount of a directory, a btrfs subvolume), the
/// directories above that part, each where another mount of the same
/// filesystem shows it (the first listed that does). A `.nodedup` marker
/// there covers `p` as much as one on its own path. Directories no mount
/// shows cannot be looked at and are left out.
pub fn hidden_ancestors(p: &Path) -> Vec<PathBuf> {
    hidden_in(&mounts(), p)
}

/// [`hidden_ancestors`] with these mounts.
fn hidden_in(mounts: &[Mount], p: &Path) -> Vec<PathBuf> {
    let Some(m) = holding(mounts, p) else { return Vec::new() };
    let visible = |dir: &Path| {
        mounts
            .iter()
            .filter(|o| o.dev == m.dev)
            .find_map(|o| dir.strip_prefix(&o.root).ok().map(|rest| o.at.join(rest)))
    };
    m.root.ancestors().skip(1).filter_map(visible).collect()
}

/// Files in use as swap, from `/proc/swaps` (never to be touched).
pub fn swap_files() -> Vec<PathBuf> {
    let text = std::fs::read("/proc/swaps").unwrap_or_default();
    text.split(|&b| b == b'\n')
        .skip(1)
        .filter_map(|line| line.split(|b| b.is_ascii_whitespace()).next())
        .filter(|p| !p.is_empty())
        .map(|p| PathBuf::from(OsStr::from_bytes(&unescape_octal(p))))
        .collect()
}

/// The kernel writes spaces, tabs, newlines and backslashes in paths as `\ooo`.
fn unescape_octal(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\' && i + 3 < s.len() && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((s[i + 1] - b'0') * 64 + (s[i + 2] - b'0') * 8 + (s[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_whether_compression_is_forced() {
        let text = b"29 1 0:25 / / rw,relatime shared:1 - ext4 /dev/vda rw\n\
            40 29 0:40 /sub /srv/z rw,noatime shared:9 - btrfs /dev/loop0 rw,compress-force=zstd:3,space_cache=v2\n\
            41 29 0:41 / /srv/c rw - btrfs /dev/loop1 rw,compress=zstd:3\n";
        let m = parse_mountinfo(text);
        assert_eq!(m[1].options, b"rw,compress-force=zstd:3,space_cache=v2".to_vec());
        assert_eq!((m[0].fstype.as_slice(), m[1].fstype.as_slice()), (&b"ext4"[..], &b"btrfs"[..]));
        assert!(forced_in(&m, Path::new("/srv/z/a/b")));
        assert!(!forced_in(&m, Path::new("/srv/c/a")));
        assert!(!forced_in(&m, Path::new("/home")));
        assert!(!checksums_off_in(&m, Path::new("/srv/z/a/b")));
    }

    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(unescape_octal(br"/mnt/a\040b"), b"/mnt/a b".to_vec());
        assert_eq!(unescape_octal(br"/plain"), b"/plain".to_vec());
        assert_eq!(unescape_octal(br"/x\134"), b"/x\\".to_vec());
    }

    /// The directories above a bound one, or above a btrfs subvolume
    /// mounted on its own, are found through another mount of the same
    /// filesystem; a plain mount has none; a directory no mount shows is
    /// left out.
    #[test]
    fn hidden_ancestors_are_seen_through_another_mount_of_the_filesystem() {
        let m = |dev: &str, root: &str, at: &str| Mount {
            dev: dev.into(),
            root: root.into(),
            at: at.into(),
            fstype: b"xfs".to_vec(),
            options: vec![],
        };
        let mounts = [
            m("0:1", "/", "/"),
            m("8:1", "/", "/srv"),
            m("8:1", "/private/data", "/mnt/data"),
            m("0:40", "/@home", "/home"),
            m("0:40", "/@snap/x", "/mnt/x"),
            m("0:40", "/", "/top"),
            m("9:1", "/a/b", "/mnt/lone"),
        ];
        let hidden = |p: &str| hidden_in(&mounts, Path::new(p));
        assert_eq!(hidden("/srv/private/data"), Vec::<PathBuf>::new());
        assert_eq!(hidden("/mnt/data/sub"), [PathBuf::from("/srv/private"), "/srv".into()]);
        assert_eq!(hidden("/home/u"), [PathBuf::from("/top")]);
        assert_eq!(hidden("/mnt/x"), [PathBuf::from("/top/@snap"), "/top".into()]);
        assert_eq!(hidden("/mnt/lone/f"), Vec::<PathBuf>::new());
    }

    /// `/proc` rather than `/`: in a chroot (scripts/fresh-chroot.sh) the
    /// root is no mount point of the process's view, `/proc` is.
    #[test]
    fn proc_is_a_mount_point() {
        assert!(mount_points().contains(Path::new("/proc")));
    }
}
