//! Test harness: real loop-mounted btrfs and XFS volumes, the real binary,
//! and the checks every dedupe test makes.
//!
//! - [`dedupscan`] runs the binary (the one way every test does: a [`Cmd`]
//!   builder, see `cmd.rs`); [`run_json`] and [`db_report`] are the two
//!   runs most tests make.
//! - [`Volume`] creates a sparse image, makes a filesystem, loop-mounts it in
//!   a temporary directory and unmounts and deletes it on drop (also when the
//!   test panics).
//! - [`Snapshot`] records SHA-256, size, mode and mtime of every file, so a
//!   test proves nothing changed but sharing.
//! - [`free_bytes`], [`shared_bytes`] and [`same_physical`] read statfs and
//!   FIEMAP to prove the claims a run makes.
//!
//! Where the machine cannot run a test (not root, no loop devices, a tool
//! missing), the test calls [`skip`]: it says so past libtest's capture and
//! in the summary `scripts/test.sh` prints, unless
//! `DEDUPSCAN_REQUIRE_FS_TESTS=1` makes that a failure.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write as _};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

pub mod bounded;
mod cmd;
#[allow(unused_imports)] // each test binary uses its own part
pub use cmd::{bin, dedupscan, Cmd, Out};

/// Filesystems the tests run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fs {
    Btrfs,
    /// XFS with reflink=1.
    Xfs,
    /// XFS with reflink=0: sharing must be refused.
    XfsNoReflink,
    /// XFS with reflink=1 and 1 KiB blocks (small-file servers).
    Xfs1k,
    /// XFS with reflink=1 and 64 KiB blocks (kernel 6.12 and later).
    Xfs64k,
    /// ext4: not a sharing filesystem.
    Ext4,
}

/// A mounted loop volume that cleans up after itself.
pub struct Volume {
    pub fs: Fs,
    pub mnt: PathBuf,
    /// Holds the image and the mount point; removed after unmounting.
    dir: tempfile::TempDir,
    mounted: bool,
}

/// Whether a missing prerequisite fails the test instead of skipping it.
pub fn require() -> bool {
    std::env::var("DEDUPSCAN_REQUIRE_FS_TESTS").is_ok_and(|v| v == "1")
}

/// Skip the calling test because `why` (a prerequisite this machine
/// lacks), or fail it when `DEDUPSCAN_REQUIRE_FS_TESTS=1`. The caller
/// returns right after.
///
/// A skip must be seen: the line goes straight to stderr (`eprintln!` is
/// captured by libtest and shown only for a failing test, and a skipped
/// test passes), and is appended to the file `DEDUPSCAN_SKIP_LOG` names,
/// whose lines `scripts/test.sh` prints at the end of the suite.
pub fn skip(why: &str) {
    // One line, whatever a tool's message held.
    let why = why.split_whitespace().collect::<Vec<_>>().join(" ");
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    if require() {
        panic!("{test}: {why}, and DEDUPSCAN_REQUIRE_FS_TESTS=1 forbids skipping");
    }
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED {test}: {why}; set DEDUPSCAN_REQUIRE_FS_TESTS=1 to fail instead ***\n"
    );
    if let Some(log) = std::env::var_os("DEDUPSCAN_SKIP_LOG") {
        // One short line per write, with O_APPEND: parallel tests do not
        // interleave within a line.
        let line = format!("{test}: {why}\n");
        let _ = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(log)
            .and_then(|mut f| f.write_all(line.as_bytes()));
    }
}

fn run_quiet(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

impl Volume {
    /// A fresh volume of `size_mb` MiB, or `None` (after [`skip`]) where
    /// this machine cannot mount one. Panics instead when
    /// `DEDUPSCAN_REQUIRE_FS_TESTS=1`.
    pub fn new(fs: Fs, size_mb: u64) -> Option<Volume> {
        match Self::try_new(fs, size_mb) {
            Ok(v) => Some(v),
            Err(e) => {
                skip(&format!("cannot create a {fs:?} loop volume ({e}); run as root with loop devices"));
                None
            }
        }
    }

    /// [`Volume::new`] without the skip: why it could not be made.
    pub fn try_new(fs: Fs, size_mb: u64) -> Result<Volume, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("not root".into());
        }
        let base = std::env::var_os("DEDUPSCAN_TEST_TMP").map(PathBuf::from).unwrap_or_else(|| "/var/tmp".into());
        let dir = tempfile::Builder::new().prefix("dedupscan-test-").tempdir_in(base).map_err(|e| e.to_string())?;
        let img = dir.path().join("volume.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).map_err(|e| e.to_string())?;
        File::create(&img).and_then(|f| f.set_len(size_mb << 20)).map_err(|e| e.to_string())?;
        let mut mkfs = match fs {
            Fs::Btrfs => {
                let mut c = Command::new("mkfs.btrfs");
                c.args(["-f", "-q"]);
                c
            }
            Fs::Xfs | Fs::XfsNoReflink | Fs::Xfs1k | Fs::Xfs64k => {
                let mut c = Command::new("mkfs.xfs");
                c.args(["-f", "-q", "-m", if fs == Fs::XfsNoReflink { "reflink=0" } else { "reflink=1" }]);
                match fs {
                    Fs::Xfs1k => c.args(["-b", "size=1024"]),
                    Fs::Xfs64k => c.args(["-b", "size=65536"]),
                    _ => &mut c,
                };
                c
            }
            Fs::Ext4 => {
                let mut c = Command::new("mkfs.ext4");
                c.args(["-F", "-q"]);
                c
            }
        };
        run_quiet(mkfs.arg(&img))?;
        run_quiet(Command::new("mount").args(["-o", "loop"]).arg(&img).arg(&mnt))?;
        Ok(Volume { fs, mnt, dir, mounted: true })
    }

    /// Path of `rel` inside the volume.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// A database path outside the volume (so the run's own writes do not
    /// disturb the volume's free-space measurements).
    pub fn db(&self) -> PathBuf {
        self.dir.path().join("db.sqlite")
    }

    /// `mount -o remount,<options>`: change mount options in place.
    pub fn remount_with(&self, options: &str) {
        sh(Command::new("mount").args(["-o", &format!("remount,{options}")]).arg(&self.mnt));
    }

    /// Unmount and mount again: drops cached state, like a reboot.
    pub fn remount(&self) {
        self.remount_after(|_| {});
    }

    /// [`Volume::remount`], calling `between` with the image's path while
    /// it is unmounted (to damage a block, as a failing disk would).
    pub fn remount_after(&self, between: impl FnOnce(&Path)) {
        // A just-written volume can be busy for a moment (seen once on a
        // loaded machine, right after writing 500 files, no run started
        // yet): try again for a few seconds before calling it a failure.
        let mut tries = 0;
        while let Err(e) = run_quiet(Command::new("umount").arg(&self.mnt)) {
            tries += 1;
            assert!(tries < 50 && e.contains("busy"), "{e}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let img = self.dir.path().join("volume.img");
        between(&img);
        run_quiet(Command::new("mount").args(["-o", "loop"]).arg(&img).arg(&self.mnt)).unwrap();
    }
}

impl Volume {
    /// A clone of this volume's device (its image copied while unmounted,
    /// as `dd` or an LVM snapshot would), mounted beside it at the returned
    /// path: the same UUID, another filesystem (XFS needs `nouuid`; btrfs
    /// gives whichever is mounted second a temporary fsid). The guard
    /// unmounts it.
    pub fn clone_beside(&self) -> (PathBuf, Unmount) {
        let clone = self.dir.path().join("clone.img");
        self.remount_after(|img| sh(Command::new("cp").arg("--sparse=always").arg(img).arg(&clone)));
        let mnt = self.dir.path().join("clone-mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        self.mount_clone(&mnt);
        (mnt.clone(), Unmount(mnt))
    }

    /// Mount the image of [`Volume::clone_beside`] at `mnt` again.
    pub fn mount_clone(&self, mnt: &Path) {
        let options = if self.fs == Fs::Btrfs { "loop" } else { "loop,nouuid" };
        let img = self.dir.path().join("clone.img");
        sh(Command::new("mount").args(["-o", options]).arg(img).arg(mnt));
    }
}

/// Unmounts its path when dropped (lazily if busy: a panicking test may
/// still hold a file).
pub struct Unmount(pub PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let ok = Command::new("umount").arg(&self.0).status().is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        if self.mounted {
            let ok = Command::new("umount").arg(&self.mnt).status().is_ok_and(|s| s.success());
            if !ok {
                // Busy (a panicking test may still hold a file): detach lazily.
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            }
        }
    }
}

/// What must not change about a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileState {
    pub sha256: String,
    pub size: u64,
    pub mode: u32,
    pub mtime_ns: i64,
}

/// Every regular file under a root (and every directory's mode), by path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot(pub BTreeMap<PathBuf, FileState>);

/// SHA-256 of a file's bytes, in hex.
pub fn sha256_hex(path: &Path) -> String {
    let mut h = Sha256::new();
    let mut f = File::open(path).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

impl Snapshot {
    pub fn take(root: &Path) -> Snapshot {
        let mut map = BTreeMap::new();
        for e in walkdir::WalkDir::new(root).follow_links(false) {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            let sha256 = if m.is_file() && (m.permissions().mode() & 0o444 != 0 || nix::unistd::geteuid().is_root()) {
                sha256_hex(e.path())
            } else {
                String::new()
            };
            map.insert(
                e.path().to_owned(),
                FileState {
                    sha256,
                    size: m.size(),
                    mode: m.mode(),
                    mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
                },
            );
        }
        Snapshot(map)
    }

    /// Panic with the first difference, readably.
    pub fn assert_same(&self, after: &Snapshot) {
        assert_eq!(self.0.len(), after.0.len(), "number of files changed");
        for (p, before) in &self.0 {
            let now = after.0.get(p).unwrap_or_else(|| panic!("{} disappeared", p.display()));
            assert_eq!(before, now, "{} changed", p.display());
        }
    }
}

/// The access times of every file and directory under a root, set to a
/// time before their changes, so that reading a file or listing a
/// directory would set them anew (`relatime`).
pub struct AccessTimes(Vec<PathBuf>);

/// 2020-01-01, in seconds.
const AGED: i64 = 1_577_836_800;

impl AccessTimes {
    /// List `root` (which sets the directories' access times), then age
    /// every access time under it.
    pub fn aged(root: &Path) -> AccessTimes {
        let paths: Vec<PathBuf> =
            walkdir::WalkDir::new(root).follow_links(false).into_iter().map(|e| e.unwrap().into_path()).collect();
        for chunk in paths.chunks(500) {
            sh(Command::new("touch").args(["-a", "-h", "-d", &format!("@{AGED}")]).args(chunk));
        }
        AccessTimes(paths)
    }

    /// Panic naming the first path whose access time `what` changed
    /// (`lstat` only: nothing here reads or lists).
    pub fn assert_unchanged(&self, what: &str) {
        for p in &self.0 {
            let atime = std::fs::symlink_metadata(p).unwrap().atime();
            assert_eq!(atime, AGED, "{what} changed the access time of {}", p.display());
        }
    }
}

/// The bytes of an image written in one pass: `pairs` times 1 MiB of data
/// (seeded from `seed` up), then 1 MiB of zeros (on btrfs, written at
/// once, data and zeros land in the same extents).
pub fn one_pass_image(pairs: u64, seed: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    for i in 0..pairs {
        bytes.extend(dedupscan::corpus::Rng::new(seed + i).bytes(1 << 20));
        bytes.resize(bytes.len() + (1 << 20), 0);
    }
    bytes
}

/// Free bytes on the filesystem of `path`, after flushing it.
pub fn free_bytes(path: &Path) -> u64 {
    let f = File::open(path).unwrap();
    for _ in 0..2 {
        dedupscan::sys::syncfs(&f).unwrap();
    }
    dedupscan::sys::fs_info(f.as_fd()).unwrap().free_bytes
}

/// Bytes of `path` in extents the kernel flags as shared.
pub fn shared_bytes(path: &Path) -> u64 {
    let f = File::open(path).unwrap();
    let len = f.metadata().unwrap().len();
    dedupscan::sys::fiemap(f.as_fd(), 0, len).unwrap().iter().filter(|e| e.is_shared()).map(|e| e.length).sum()
}

/// How many extents FIEMAP reports for the whole of `path`.
pub fn extents(path: &Path) -> usize {
    let f = File::open(path).unwrap();
    let len = f.metadata().unwrap().len();
    dedupscan::sys::fiemap(f.as_fd(), 0, len).unwrap().len()
}

/// Physical address of every 4 KiB block of a range.
pub fn physical_blocks(path: &Path, off: u64, len: u64) -> Vec<Option<u64>> {
    let f = File::open(path).unwrap();
    let ext = dedupscan::sys::fiemap(f.as_fd(), off, len).unwrap();
    dedupscan::sys::fiemap::physical_map(&ext, off, len, 4096)
}

/// Bytes zstd compresses to about half (8 letters, random): written on a
/// `compress-force` btrfs, 128 KiB compressed extents.
pub fn compressible(seed: u64, len: usize) -> Vec<u8> {
    dedupscan::corpus::Rng::new(seed).bytes(len).iter().map(|b| b"abcdefgh"[(b & 7) as usize]).collect()
}

/// Whether two ranges share the same physical blocks, every one of them.
pub fn same_physical(a: &Path, a_off: u64, b: &Path, b_off: u64, len: u64) -> bool {
    let (pa, pb) = (physical_blocks(a, a_off, len), physical_blocks(b, b_off, len));
    pa.iter().zip(&pb).all(|(x, y)| x.is_some() && x == y)
}

/// The yardstick of `shared/tools/ideal-dup.py`: for every distinct content
/// of a full 4 KiB block at an aligned offset (holes and zero blocks apart),
/// every occurrence after the first, in bytes. Hard links count once.
pub fn ideal_dup_bytes(root: &Path) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut inodes = std::collections::HashSet::new();
    let mut dup = 0;
    let zero = Sha256::digest([0u8; 4096]);
    for e in walkdir::WalkDir::new(root).follow_links(false).sort_by_file_name() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        if !m.is_file() || m.size() == 0 || !inodes.insert((m.dev(), m.ino())) {
            continue;
        }
        let mut data = Vec::new();
        File::open(e.path()).unwrap().read_to_end(&mut data).unwrap();
        for blk in data.chunks_exact(4096) {
            let d = Sha256::digest(blk);
            if d == zero {
                continue;
            }
            if !seen.insert(d) {
                dup += 4096;
            }
        }
    }
    dup
}

/// Validate a run report against `schema/report.schema.json`.
pub fn validate_report(v: &serde_json::Value) {
    validate(v, include_str!("../../schema/report.schema.json"));
}

/// Validate `report --json` output against `schema/db-report.schema.json`.
pub fn validate_db_report(v: &serde_json::Value) {
    validate(v, include_str!("../../schema/db-report.schema.json"));
}

fn validate(v: &serde_json::Value, schema: &str) {
    let schema: serde_json::Value = serde_json::from_str(schema).expect("schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let errors: Vec<String> = validator.iter_errors(v).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    assert!(errors.is_empty(), "report does not match its schema: {errors:#?}\n{v:#}");
}

/// Run with `args --json --db <vol db>`, assert it finished (exit 0, or 1
/// for per-file errors) with a valid report on plain stderr, and return
/// the report.
pub fn run_json(vol: &Volume, args: &[&str]) -> serde_json::Value {
    let out = dedupscan().args(args).json().db(vol.db()).expect(0).expect(1).run();
    // stderr is a pipe here, as under systemd: plain lines, no bar drawing.
    let err = &out.stderr;
    assert!(!err.contains('\x1b') && !err.contains('\r'), "control characters on a non-terminal: {err:?}");
    validate_report(&out.json);
    out.json
}

/// `report[key]` as u64.
pub fn num(report: &serde_json::Value, key: &str) -> u64 {
    report[key].as_u64().unwrap_or_else(|| panic!("{key} missing or not a number in {report:#}"))
}

/// `dedupscan report --json` on the volume's database, validated against
/// its schema.
pub fn db_report(vol: &Volume) -> serde_json::Value {
    let out = dedupscan().arg("report").json().db(vol.db()).expect(0).run();
    validate_db_report(&out.json);
    out.json
}

/// A path as `&str` (test paths are UTF-8), for argument lists.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Run `cmd` (a helper tool: mount, chattr, ...), panicking with its
/// output unless it succeeds.
pub fn sh(cmd: &mut Command) {
    if let Err(e) = run_quiet(cmd) {
        panic!("{e}");
    }
}

/// `btrfs <args> <path>` (btrfs-progs: subvolumes, snapshots, sync).
pub fn btrfs(args: &[&str], path: &Path) {
    sh(Command::new("btrfs").args(args).arg(path));
}

/// Mark `p` `user.nodedup` (the policy's extended attribute).
pub fn set_nodedup(p: &Path) {
    sh(Command::new("setfattr").args(["-n", "user.nodedup", "-v", "1"]).arg(p));
}

/// `PRAGMA integrity_check` of a database is "ok".
pub fn integrity_ok(db: &Path) {
    let c = rusqlite::Connection::open(db).unwrap();
    let ok: String = c.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    assert_eq!(ok, "ok", "database {} damaged", db.display());
}

/// A tmpfs mounted in a fresh directory under /var/tmp with `options`
/// (e.g. `size=16m`), unmounted (lazily: a failing test may hold a file)
/// and removed on drop. Make one only after a [`Volume`]: that decides
/// whether this machine can mount at all.
pub struct Tmpfs(pub tempfile::TempDir);

impl Tmpfs {
    pub fn new(options: &str) -> Tmpfs {
        let dir = tempfile::Builder::new().prefix("dedupscan-tmpfs-").tempdir_in("/var/tmp").unwrap();
        sh(Command::new("mount").args(["-t", "tmpfs", "-o", options, "tmpfs"]).arg(dir.path()));
        Tmpfs(dir)
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// Assert that every file of `files` holds `len` bytes from its start in
/// the blocks `image` holds at `at` (shared into, or shared from).
pub fn assert_in_image(image: &Path, at: u64, files: &[PathBuf], len: u64, report: &serde_json::Value) {
    for f in files {
        assert!(
            same_physical(image, at, f, 0, len),
            "{} lies in {}'s blocks: {report:#}",
            f.display(),
            image.display()
        );
    }
}

/// A whole-file clone of `from` at `to` (`cp --reflink=always`): one
/// extent, two holders.
pub fn reflink(from: &Path, to: &Path) {
    let ok = Command::new("cp").arg("--reflink=always").arg(from).arg(to).status().unwrap();
    assert!(ok.success(), "cp --reflink=always {}", to.display());
}

/// Clone `len` bytes of `src` from `off` into `dst` at `at`
/// (`FICLONERANGE`): a stretch of one extent held by another file, as a
/// user makes them with `cp --reflink` of a part, or `xfs_io reflink`.
pub fn clone_range(src: &File, off: u64, len: u64, dst: &File, at: u64) {
    /// `struct file_clone_range`.
    #[repr(C)]
    struct Args {
        src_fd: i64,
        src_offset: u64,
        src_length: u64,
        dest_offset: u64,
    }
    const FICLONERANGE: libc::c_ulong = 0x4020_940d;
    let fd = std::os::fd::AsRawFd::as_raw_fd(src);
    let a = Args { src_fd: i64::from(fd), src_offset: off, src_length: len, dest_offset: at };
    // SAFETY: `a` is a valid `file_clone_range` the kernel only reads.
    let rc = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(dst), FICLONERANGE, &a) };
    assert_eq!(rc, 0, "FICLONERANGE: {}", std::io::Error::last_os_error());
}

/// Drop `p`'s pages from the page cache (clean pages: written and synced).
pub fn drop_pages(p: &Path) {
    let f = std::fs::File::open(p).unwrap();
    f.sync_all().unwrap();
    // SAFETY: a plain advisory call on an open descriptor.
    let rc = unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise");
    assert_eq!(resident(p), 0, "{}: pages still cached", p.display());
}

/// Pages of `p` in the page cache.
pub fn resident(p: &Path) -> usize {
    let f = std::fs::File::open(p).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    // SAFETY: a shared read-only mapping of a file we hold open, unmapped
    // before return; `mincore` writes one byte per page into `vec`.
    unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        );
        assert_ne!(map, libc::MAP_FAILED, "mmap");
        let page = libc::sysconf(libc::_SC_PAGESIZE) as usize;
        let mut vec = vec![0u8; len.div_ceil(page)];
        assert_eq!(libc::mincore(map, len, vec.as_mut_ptr()), 0, "mincore");
        libc::munmap(map, len);
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }
}
