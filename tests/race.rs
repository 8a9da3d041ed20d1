//! An unprivileged user racing a root run (issue 12, point 1).
//!
//! The user (uid 65534, a separate process started with `setpriv`) owns
//! `tree/user` inside the scanned tree. At the worst moment it swaps its
//! directory `tree/user/sub` for a symlink (one atomic `renameat2(...,
//! RENAME_EXCHANGE)` with a symlink it made beforehand) pointing at
//!
//! - `../../private/outside`: a root-only (0700) directory on the same
//!   volume, below a `.nodedup` marker the crawl never passes, holding
//!   files with the same names as `sub`'s, or
//! - a directory on another filesystem (a tmpfs), likewise.
//!
//! The moment is chosen with inotify, so the old code (which re-resolved
//! full paths) failed every time, not by luck:
//!
//! - *crawl*: as soon as the crawler opens `sub` to list it. Every later
//!   path-based lookup below `sub` (`lstat` of its entries, descending
//!   into `sub/d`, opening its files to hash them) then went outside.
//! - *share*: as soon as the share phase opens a file of `sub` (its second
//!   open: the first was the hashing pool's), i.e. after the scan recorded
//!   the real files; the other copies are opened after it. Then a `report`
//!   run, which opens the recorded files again.
//!
//! Each test asserts on the real binary under `strace -f -y`: no open of
//! anything outside the tree, nothing outside recorded in the database,
//! no outside extent shared and outside data unchanged (including the
//! `.nodedup`-marked directory), the legitimate duplicates still shared
//! (freed bytes > 0), and the documented exit code.
//!
//! The attacker is `examples/race_attacker.rs` (`cargo test` builds it; with
//! `cargo test --test race` add `--example race_attacker`).
//! `DEDUPSCAN_TEST_BIN=/path/to/dedupscan` runs the tests against another
//! binary (e.g. an older build, to see them fail).

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

use common::*;
use dedupscan::corpus::Rng;

/// The attacker's uid and gid (nobody).
const NOBODY: u32 = 65534;
/// Files in `sub` (and in `sub/d`), and as many of the same names outside.
const FILES: usize = 150;
/// Size of each file of `sub`: large enough that hashing them all takes
/// a while after the crawler found them (the old code opened each by path
/// then), so the attacker's swap always lands before the last of them.
const SUB_SIZE: usize = 256 << 10;
/// Size of each file of `sub/d`.
const SUB_D_SIZE: usize = 8192;
/// Size of each outside file: no file in the tree has it, so a database row
/// of this size was recorded from outside.
const OUTSIDE_SIZE: usize = 12288;

/// When the attacker swaps `sub`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Moment {
    /// When the crawler opens `sub` to list it.
    Crawl,
    /// When the share phase opens the first file of `sub`.
    Share,
    /// When the crawler opens `sub` to list it, `sub` is moved into a
    /// directory the crawl has not listed yet (no symlink).
    Move,
    /// Soon after the share phase opens a file of `sub`, every file of
    /// `sub` gets a second name in a `.nodedup` directory (no symlink).
    Link,
    /// Before the run: a write lease on every file of `sub`, held.
    Lease,
}

/// Where the symlink points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// A root-only directory on the same volume.
    SameVolume,
    /// A directory on another filesystem (tmpfs).
    OtherFs,
}

/// The volume and everything the test checks.
struct Scene {
    vol: Volume,
    tree: PathBuf,
    user: PathBuf,
    /// The directory the symlink points to.
    outside: PathBuf,
    /// Two copies of the same data, root-owned, in the tree: must be shared.
    legit: [PathBuf; 2],
    _tmpfs: Option<Tmpfs>,
}

fn write_set(dir: &Path, size: usize, d_size: usize, seed: u64) {
    std::fs::create_dir_all(dir.join("d")).unwrap();
    // Every file of a set holds the same data: a run that reaches them
    // plans to share them with each other.
    let data = Rng::new(seed).bytes(size.max(d_size));
    for i in 0..FILES {
        std::fs::write(dir.join(format!("f{i:03}")), &data[..size]).unwrap();
        std::fs::write(dir.join(format!("d/g{i:03}")), &data[..d_size]).unwrap();
    }
}

fn chown_r(p: &Path) {
    let st = Command::new("chown").args(["-R", &format!("{NOBODY}:{NOBODY}")]).arg(p).status().unwrap();
    assert!(st.success());
}

/// A test volume of `mib` MiB the attacker can reach: its private parent
/// directory becomes traversable.
fn reachable_volume(fs: Fs, mib: u64) -> Option<Volume> {
    let vol = Volume::new(fs, mib)?;
    std::fs::set_permissions(vol.mnt.parent().unwrap(), std::fs::Permissions::from_mode(0o711)).unwrap();
    Some(vol)
}

/// The directory `dir`, made and marked `.nodedup`.
fn marked_dir(dir: &Path) {
    std::fs::create_dir(dir).unwrap();
    std::fs::write(dir.join(".nodedup"), b"").unwrap();
}

fn scene(fs: Fs, target: Target) -> Option<Scene> {
    let vol = reachable_volume(fs, 512)?;
    let tree = vol.path("tree");
    let legit = [tree.join("a/x"), tree.join("b/x")];
    let data = Rng::new(1).bytes(2 << 20);
    for p in &legit {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, &data).unwrap();
    }
    let user = tree.join("user");
    write_set(&user.join("sub"), SUB_SIZE, SUB_D_SIZE, 2);
    chown_r(&user);
    // `private` is root-only and marked `.nodedup`: nothing below it may
    // be read by the user, or shared by anyone.
    let (private, tmpfs) = match target {
        Target::SameVolume => (vol.path("private"), None),
        Target::OtherFs => {
            let t = Tmpfs::new("size=16m,mode=0700");
            (t.path().join("private"), Some(t))
        }
    };
    let outside = private.join("outside");
    write_set(&outside, OUTSIDE_SIZE, OUTSIDE_SIZE, 3);
    std::fs::write(private.join(".nodedup"), b"").unwrap();
    for d in [&private, &outside] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    // Settle the data on disk, so FIEMAP shows the extents.
    Command::new("sync").status().unwrap();
    Some(Scene { vol, tree, user, outside, legit, _tmpfs: tmpfs })
}

/// The attacker process, ready (its symlink made, its watch set).
struct Attacker {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Attacker {
    fn start(s: &Scene, target: Target, moment: Moment) -> Attacker {
        let link = match target {
            Target::SameVolume => PathBuf::from("../../private/outside"),
            Target::OtherFs => s.outside.clone(),
        };
        Attacker::spawn(&s.user, &link, moment)
    }

    /// The attacker in `user`, with `RACE_LINK` = `link`.
    fn spawn(user: &Path, link: &Path, moment: Moment) -> Attacker {
        let mut child = Command::new("setpriv")
            .args([format!("--reuid={NOBODY}"), format!("--regid={NOBODY}"), "--clear-groups".into(), "--".into()])
            .arg(attacker_program())
            .env("RACE_USER_DIR", user)
            .env("RACE_LINK", link)
            .env("RACE_MOMENT", format!("{moment:?}"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("setpriv");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.starts_with("ready") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "the attacker died before it was ready");
        }
        Attacker { child, out }
    }

    /// Whether the swap happened; the attacker is gone afterwards.
    fn swapped(self) -> bool {
        self.swapped_at().is_some()
    }

    /// What the attacker said after `swapped` (its time, for `Link`), if
    /// it swapped; the attacker is gone afterwards.
    fn swapped_at(mut self) -> Option<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.out, &mut rest);
        rest.lines().find_map(|l| l.strip_prefix("swapped")).map(|t| t.trim().to_owned())
    }
}

/// A test that fails leaves no attacker behind (one holding leases would
/// keep its volume from being unmounted).
impl Drop for Attacker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `examples/race_attacker.rs` as built next to this test binary
/// (`target/<profile>/deps/race-*` → `target/<profile>/examples/`).
fn attacker_program() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().and_then(Path::parent).unwrap().join("examples/race_attacker");
    assert!(
        p.exists(),
        "{} is not built: `cargo test` builds the examples; with `--test race` add `--example race_attacker`",
        p.display()
    );
    p
}

/// Run the binary with `args` under `strace -f -y`: (exit code, stdout,
/// stderr, every traced open line).
fn traced(vol: &Volume, name: &str, args: &[&std::ffi::OsStr]) -> (i32, String, String, Vec<String>) {
    traced_calls(vol, name, &["-y", "-e", "trace=open,openat,openat2,creat"], args)
}

/// `traced` with these strace options (which calls, how shown).
fn traced_calls(
    vol: &Volume,
    name: &str,
    opts: &[&str],
    args: &[&std::ffi::OsStr],
) -> (i32, String, String, Vec<String>) {
    let trace = vol.db().with_extension(format!("{name}.trace"));
    let strace = [&["strace", "-f", "-qq"], opts, &["-o", s(&trace)]].concat();
    let out = dedupscan().under(strace).args(args).run();
    let lines = std::fs::read_to_string(&trace).unwrap().lines().map(str::to_owned).collect();
    if let Some(keep) = std::env::var_os("DEDUPSCAN_RACE_KEEP_TRACE") {
        std::fs::copy(&trace, Path::new(&keep).join(format!("{name}.trace"))).unwrap();
    }
    (out.code, out.stdout, out.stderr, lines)
}

/// Traced opens that name or resolved to anything under `outside` (at most
/// 3, and how many in all).
fn outside_opens(lines: &[String], outside: &Path) -> Vec<String> {
    let needle = outside.display().to_string();
    let bad: Vec<&String> = lines.iter().filter(|l| l.contains(&needle)).collect();
    let mut out: Vec<String> = bad.iter().take(3).map(|l| l.to_string()).collect();
    if !bad.is_empty() {
        out.push(format!("({} opens in all)", bad.len()));
    }
    out
}

/// Inodes and sizes recorded in the database.
fn recorded(db: &Path) -> Vec<(u64, u64)> {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut st = c.prepare("SELECT ino, size FROM files").unwrap();
    let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))).unwrap();
    rows.map(Result::unwrap).collect()
}

fn outside_files(outside: &Path) -> Vec<PathBuf> {
    (0..FILES).flat_map(|i| [outside.join(format!("f{i:03}")), outside.join(format!("d/g{i:03}"))]).collect()
}

/// The race, tried again when the attacker came too late to run it: in
/// the share race on a loaded machine, it may swap `sub` only after the
/// share phase reached all of its files (exit 0, no error), or not before
/// the run ended. Every promise is checked on every try that raced.
fn race(fs: Fs, target: Target, moment: Moment) {
    for attempt in 1..=3 {
        if race_once(fs, target, moment) {
            return;
        }
        eprintln!("try {attempt}: the attacker swapped after the run was through sub, or not at all; again");
    }
    panic!("{fs:?}, {target:?}, {moment:?}: the attacker came too late three times, the race never ran");
}

/// One try of [`race`]: whether the race ran (the swap came in time).
fn race_once(fs: Fs, target: Target, moment: Moment) -> bool {
    let Some(s) = scene(fs, target) else { return true };
    let outside_before = Snapshot::take(&s.outside);
    let legit_before = Snapshot::take(&s.tree.join("a"));
    let outside_inos: HashSet<u64> =
        outside_files(&s.outside).iter().map(|p| std::fs::metadata(p).unwrap().ino()).collect();
    let attacker = Attacker::start(&s, target, moment);
    let db = s.vol.db();
    let (code, stdout, stderr, lines) = traced(
        &s.vol,
        "run",
        &[s.tree.as_os_str(), "--json".as_ref(), "--progress=never".as_ref(), "--db".as_ref(), db.as_os_str()],
    );
    if !attacker.swapped() {
        // Descheduled on a loaded machine (seen once in a full suite), the
        // attacker had not acted on the open it waits for when the run
        // ended: the race did not run, this try proves nothing.
        eprintln!("the attacker never swapped {}/sub: the race did not happen\n{stderr}", s.user.display());
        return false;
    }
    let r: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("no JSON report ({e}), exit {code}: {stderr}"));
    validate_report(&r);
    // Every broken promise is listed, not only the first.
    let mut broken: Vec<String> = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            broken.push(what);
        }
    };
    let opened = outside_opens(&lines, &s.outside);
    check(opened.is_empty(), format!("the run opened files outside the tree, e.g.:\n  {}", opened.join("\n  ")));

    // Nothing from outside in the database.
    let rows = recorded(&db);
    let n = rows.iter().filter(|&&(_, size)| size == OUTSIDE_SIZE as u64).count();
    check(n == 0, format!("{n} outside files recorded in the database"));
    if target == Target::SameVolume {
        let n = rows.iter().filter(|(ino, _)| outside_inos.contains(ino)).count();
        check(n == 0, format!("{n} outside inodes recorded in the database"));
    }
    // Nothing outside shared or changed; the nodedup marker held.
    check(outside_before == Snapshot::take(&s.outside), "outside data changed".into());
    if target == Target::SameVolume {
        let n = outside_files(&s.outside).iter().filter(|p| shared_bytes(p) > 0).count();
        check(n == 0, format!("{n} outside files (below a .nodedup marker) shared"));
    }
    // The legitimate tree was still shared, and is intact.
    check(legit_before == Snapshot::take(&s.tree.join("a")), "the legitimate files changed".into());
    check(
        same_physical(&s.legit[0], 0, &s.legit[1], 0, 2 << 20),
        format!("the legitimate copies were not shared (freed {})", r["freed_bytes"]),
    );
    check(r["freed_bytes"].as_i64().unwrap() > 0, format!("nothing freed: {}", r["freed_bytes"]));
    check(r["sharing_refused"].is_null(), format!("sharing stopped for the whole tree: {}", r["sharing_refused"]));
    // Files of `sub` the run reached after the swap are skipped
    // (`vanished`): by the hashers in the crawl race (some may have been
    // hashed before it: the attacker is a separate process, it may be
    // scheduled late), by the share phase in the share race. A file gone
    // is the life of a busy tree, not an error: exit 0 (it was 1 when the
    // share phase found it, until session 39).
    let kinds: Vec<&String> = r["error_kinds"].as_object().map(|o| o.keys().collect()).unwrap_or_default();
    check(kinds.is_empty() && code == 0, format!("exit code {code}, errors {}", r["error_kinds"]));
    let gone = r["skipped"]["vanished"].as_u64().unwrap_or(0);
    if let Moment::Move | Moment::Link | Moment::Lease = moment {
        unreachable!("tested by moved_directory(), linked_during_share() and leased_file()")
    }
    let late = moment == Moment::Share && gone == 0;

    if moment == Moment::Share {
        // `report` opens every recorded file again, through the swapped path.
        let (code, _, stderr, lines) =
            traced(&s.vol, "report", &["report".as_ref(), "--json".as_ref(), "--db".as_ref(), db.as_os_str()]);
        check(code == 0, format!("report exited {code}: {stderr}"));
        let opened = outside_opens(&lines, &s.outside);
        check(opened.is_empty(), format!("report opened files outside the tree, e.g.:\n  {}", opened.join("\n  ")));
    }
    assert!(broken.is_empty(), "{fs:?}, {target:?}, {moment:?}:\n- {}\n{stderr}", broken.join("\n- "));
    !late
}

#[test]
fn btrfs_crawl_race_into_a_root_only_directory() {
    race(Fs::Btrfs, Target::SameVolume, Moment::Crawl);
}

#[test]
fn xfs_crawl_race_into_a_root_only_directory() {
    race(Fs::Xfs, Target::SameVolume, Moment::Crawl);
}

#[test]
fn btrfs_crawl_race_into_another_filesystem() {
    race(Fs::Btrfs, Target::OtherFs, Moment::Crawl);
}

#[test]
fn xfs_crawl_race_into_another_filesystem() {
    race(Fs::Xfs, Target::OtherFs, Moment::Crawl);
}

#[test]
fn btrfs_share_race_into_a_root_only_directory() {
    race(Fs::Btrfs, Target::SameVolume, Moment::Share);
}

#[test]
fn xfs_share_race_into_a_root_only_directory() {
    race(Fs::Xfs, Target::SameVolume, Moment::Share);
}

#[test]
fn btrfs_share_race_into_another_filesystem() {
    race(Fs::Btrfs, Target::OtherFs, Moment::Share);
}

#[test]
fn xfs_share_race_into_another_filesystem() {
    race(Fs::Xfs, Target::OtherFs, Moment::Share);
}

/// One destination the kernel refuses (here `EXDEV`: it lies on another
/// filesystem, which only a plan built by hand can name now that opens stay
/// below the starting paths) is counted against that destination; the other
/// destinations of the same request are still shared. On a filesystem that
/// cannot share at all (XFS without reflink) the probe stops the phase.
fn refused_destination(fs: Fs) {
    use dedupscan::dedupe::{execute, Mode};
    use dedupscan::file::{FileFacts, FileId};
    use dedupscan::plan::{Plan, Range};
    use dedupscan::sys::beneath::Tree;
    let Some(vol) = Volume::new(fs, 512) else { return };
    let tmp = Tmpfs::new("size=16m,mode=0700");
    let dir = vol.path("d");
    std::fs::create_dir(&dir).unwrap();
    let data = Rng::new(9).bytes(1 << 20);
    let paths = [dir.join("a"), tmp.path().join("foreign"), dir.join("b")];
    let mut files = std::collections::HashMap::new();
    for (i, p) in paths.iter().enumerate() {
        std::fs::write(p, &data).unwrap();
        // Files are known by volume key (btrfs subvolume id), not st_dev.
        let key = dedupscan::sys::volume_key(std::os::fd::AsFd::as_fd(&std::fs::File::open(p).unwrap())).unwrap();
        files.insert(FileId(i as i64 + 1), FileFacts::from_metadata(p.clone(), key, &std::fs::metadata(p).unwrap()));
    }
    let before = Snapshot::take(&dir);
    let range = |dest| Range { src: FileId(1), src_off: 0, len: 1 << 20, dest: FileId(dest), dest_off: 0 };
    // The foreign destination first, in the same request as `b`.
    let plan = Plan { ranges: vec![range(2), range(3)] };
    let tree = Tree::open(&[dir.clone(), tmp.path().to_owned()]).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let out = execute(
        &plan,
        &files,
        &dedupscan::file::IdSet::new(),
        &tree,
        4096,
        Mode::Share,
        None,
        &dedupscan::progress::Silent,
        &stop,
        dedupscan::dedupe::Sharing::cached(1),
    );
    before.assert_same(&Snapshot::take(&dir));
    if fs == Fs::XfsNoReflink {
        assert!(out.refused.is_some(), "{out:?}");
        assert!(!same_physical(&paths[0], 0, &paths[2], 0, 1 << 20));
        return;
    }
    assert!(out.refused.is_none(), "one refused destination stopped sharing: {out:?}");
    assert_eq!(out.status.errors.get("EXDEV"), Some(&1), "{out:?}");
    assert_eq!(out.deduped_bytes, 1 << 20, "{out:?}");
    assert!(same_physical(&paths[0], 0, &paths[2], 0, 1 << 20), "{out:?}");
}

#[test]
fn btrfs_one_refused_destination_does_not_stop_sharing() {
    refused_destination(Fs::Btrfs);
}

#[test]
fn xfs_one_refused_destination_does_not_stop_sharing() {
    refused_destination(Fs::Xfs);
}

#[test]
fn xfs_without_reflink_still_stops_at_the_first_refusal() {
    refused_destination(Fs::XfsNoReflink);
}

/// A directory moved during the crawl is listed once (`walk::listed::Listed`). The
/// user's file `sub/a` has a second name, `keep/a2`, behind a `.nodedup`
/// marker, and a copy: the hard-link rule keeps it out, since the crawl
/// sees one of its two names. Once the hashers have opened `sub/a`, the
/// attacker moves `sub` (a directory: the file's ctime does not change)
/// into the last directory of a deep chain the crawl has not listed yet,
/// and moves it back when the crawl opens it there. The old crawl listed
/// it twice, counted two names, and shared the file, and with it the
/// protected `keep/a2`: this test failed on it 8 times out of 8.
fn moved_directory(fs: Fs) {
    let Some(vol) = reachable_volume(fs, 320) else { return };
    let tree = vol.path("tree");
    let user = tree.join("user");
    let data = Rng::new(5).bytes(2 << 20);
    let legit = [tree.join("a/x"), tree.join("b/x")];
    for p in legit.iter().chain([&user.join("sub/a"), &user.join("copy")]) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, &data).unwrap();
    }
    marked_dir(&user.join("keep"));
    std::fs::hard_link(user.join("sub/a"), user.join("keep/a2")).unwrap();
    // A deep chain of directories: its last one is listed well after `sub`,
    // and after the hashers have opened `sub/a`: its 16,384 small files
    // (distinct) fill the queues to the hashers, so the crawl waits on them.
    let mut deep = user.clone();
    for level in 0..64u64 {
        deep = deep.join(format!("z{level}"));
        std::fs::create_dir(&deep).unwrap();
        (0..256u64).for_each(|i| std::fs::write(deep.join(format!("e{i}")), (level << 8 | i).to_le_bytes()).unwrap());
    }
    chown_r(&user);
    Command::new("sync").status().unwrap();
    let a2 = user.join("keep/a2");
    let a2_before = (Snapshot::take(&user.join("keep")), physical_blocks(&a2, 0, 2 << 20));
    let attacker = Attacker::spawn(&user, &deep.join("sub"), Moment::Move);
    let r = run_json(&vol, &[s(&tree)]);
    assert!(attacker.swapped(), "the attacker never moved sub: the race did not happen");
    assert_eq!(shared_bytes(&a2), 0, "the file behind .nodedup was shared through its moved name: {r:#}");
    assert_eq!((Snapshot::take(&user.join("keep")), physical_blocks(&a2, 0, 2 << 20)), a2_before);
    assert_eq!(r["skipped_dirs"]["moved_during_crawl"], 1, "{r:#}");
    // `sub/a` was met once (one of its two names): kept out.
    assert_eq!(r["skipped"]["hardlink_outside"], 1, "{r:#}");
    assert_eq!(num(&r, "errors"), 0, "{r:#}");
    assert!(same_physical(&legit[0], 0, &legit[1], 0, 2 << 20), "the legitimate copies were not shared: {r:#}");
}

#[test]
fn btrfs_a_directory_moved_during_the_crawl_is_listed_once() {
    moved_directory(Fs::Btrfs);
}

#[test]
fn xfs_a_directory_moved_during_the_crawl_is_listed_once() {
    moved_directory(Fs::Xfs);
}

/// A name added while a large file is shared. The user's two copies of
/// 512 MiB take 32 requests of 16 MiB; 20 ms after the share phase opens
/// one, the attacker links both into `keep/`, marked `.nodedup`, and says
/// when `link` returned. The link changes the ctime, and each destination
/// is checked before every request: no share worker may start a request
/// after the link but one (checked just before it landed; with two
/// workers, two such requests were seen in 1 run of 4, old and new build
/// alike). Before, only the open was checked and the rest of the range was
/// shared (an strace of the requests, by thread, and the attacker's clock
/// tell which came after).
fn linked_during_share(fs: Fs) {
    // The attacker's timing is the kernel's: in 1 run of 20 the link came
    // after the last request (nothing to stop; the run rightly saw no
    // change). That proves nothing either way: try again, on a new volume.
    for _ in 0..3 {
        match link_race(fs) {
            None | Some(true) => return,
            Some(false) => eprintln!("the link came after the last request: again"),
        }
    }
    panic!("the link never came while the file was being shared");
}

/// One try of [`linked_during_share`]: `None` if the machine cannot run it,
/// `Some(false)` if the race did not happen.
fn link_race(fs: Fs) -> Option<bool> {
    let vol = reachable_volume(fs, 1536)?;
    let (tree, user) = (vol.path("tree"), vol.path("tree/user"));
    std::fs::create_dir_all(user.join("sub")).unwrap();
    marked_dir(&user.join("keep"));
    let data = Rng::new(6).bytes(512 << 20);
    std::fs::write(user.join("sub/a"), &data).unwrap();
    std::fs::write(user.join("sub/b"), &data).unwrap();
    drop(data);
    chown_r(&user);
    Command::new("sync").status().unwrap();
    let attacker = Attacker::spawn(&user, &user.join("keep"), Moment::Link);
    let db = vol.db();
    let args = [tree.as_os_str(), "--json".as_ref(), "--db".as_ref(), db.as_os_str()];
    let (_, stdout, stderr, lines) = traced_calls(&vol, "link", &["-ttt", "-e", "trace=ioctl"], &args);
    let linked: f64 = attacker.swapped_at().expect("the attacker never linked").parse().unwrap();
    // Thread and entry time of each dedupe request.
    let starts: Vec<(&str, f64)> = (lines.iter().filter(|l| l.contains("FIDEDUPERANGE")))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?, w.next()?.parse().ok()?))
        })
        .collect();
    let after: Vec<&str> = starts.iter().filter(|s| s.1 > linked).map(|s| s.0).collect();
    assert!(
        starts.len() > after.len(),
        "no request before the link ({after:?} after): the race did not happen\n{stderr}"
    );
    // Each share worker may have checked the file just before the link and
    // then sent its request: one each at most, none after that.
    let mut per_thread = std::collections::HashMap::new();
    for t in &after {
        *per_thread.entry(*t).or_insert(0) += 1;
    }
    assert!(
        per_thread.values().all(|&n| n <= 1),
        "requests started after the link, by thread: {per_thread:?} (of {})\n{stdout}",
        starts.len()
    );
    let r: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(num(&r, "errors"), 0, "{r:#}");
    let changed = r["skipped"]["changed_during_scan"].as_u64().unwrap_or(0);
    if changed == 0 && after.is_empty() {
        return Some(false);
    }
    assert!(changed >= 1, "requests after the link, and no change seen: {r:#}");
    Some(true)
}

#[test]
fn btrfs_a_name_added_while_a_file_is_shared_stops_the_sharing() {
    linked_during_share(Fs::Btrfs);
}

#[test]
fn xfs_a_name_added_while_a_file_is_shared_stops_the_sharing() {
    linked_during_share(Fs::Xfs);
}

/// A lease another process holds on a file (a file server's exclusive
/// oplock, an NFS write delegation; here the user's own, on `sub/b`,
/// never given up): the hashing open (`O_NONBLOCK`) does not wait the
/// `lease-break-time` (45 s) for it. The file is counted `leased`, not
/// `vanished` as before, and is read and shared by the next run once the
/// lease is gone.
fn leased_file(fs: Fs) {
    let Some(vol) = reachable_volume(fs, 300) else { return };
    let user = vol.path("user");
    std::fs::create_dir_all(user.join("sub")).unwrap();
    let data = Rng::new(9).bytes(256 << 10);
    let (a, b) = (user.join("a"), user.join("sub/b"));
    for p in [&a, &b] {
        std::fs::write(p, &data).unwrap();
    }
    chown_r(&user);
    let before = Snapshot::take(&user);
    let attacker = Attacker::spawn(&user, Path::new("unused"), Moment::Lease);
    let t = std::time::Instant::now();
    let r = run_json(&vol, &[s(&user)]);
    assert!(t.elapsed() < std::time::Duration::from_secs(30), "waited for the lease: {:?}", t.elapsed());
    assert_eq!(r["skipped"]["leased"], 1, "{r:#}");
    assert_eq!(num(&r, "errors"), 0, "{r:#}");
    // (The test's own opens of `b` would wait for the lease: after it.)
    let _ = attacker.swapped();
    assert_eq!(shared_bytes(&b), 0, "{r:#}");
    let r = run_json(&vol, &[s(&user)]);
    assert!(same_physical(&a, 0, &b, 0, 256 << 10), "not shared once the lease was gone: {r:#}");
    before.assert_same(&Snapshot::take(&user));
}

/// A lease taken after the scan (here by `scan`, then the user's process
/// leases `sub/b`): the share phase's open does not wait for it either.
/// The pair is left pending (`leased`), not counted an error (exit 0:
/// a file server leases files every day), and the next run shares it
/// although nothing changed: an unchanged pair is planned again only
/// because it is pending. Before, this was error kind `leased` (exit 1),
/// and an `--incremental` run after it shared nothing.
fn leased_at_share_time(fs: Fs) {
    let Some(vol) = reachable_volume(fs, 300) else { return };
    let user = vol.path("user");
    std::fs::create_dir_all(user.join("sub")).unwrap();
    let (data, other) = (Rng::new(10).bytes(256 << 10), Rng::new(11).bytes(192 << 10));
    let (a, b, c, d) = (user.join("a"), user.join("sub/b"), user.join("c"), user.join("d"));
    for (p, data) in [(&a, &data), (&b, &data), (&c, &other), (&d, &other)] {
        std::fs::write(p, data).unwrap();
    }
    chown_r(&user);
    let before = Snapshot::take(&user);
    dedupscan().arg("scan").arg(&user).db(vol.db()).expect(0).run();
    let attacker = Attacker::spawn(&user, Path::new("unused"), Moment::Lease);
    let t = std::time::Instant::now();
    let out = dedupscan().arg(&user).arg("-v").json().db(vol.db()).expect(0).run();
    let r = out.json;
    assert!(t.elapsed() < std::time::Duration::from_secs(30), "waited for the lease: {:?}", t.elapsed());
    validate_report(&r);
    assert_eq!(num(&r, "errors"), 0, "{r:#}");
    assert_eq!(r["skipped"]["leased"], 1, "{r:#}");
    assert_eq!((r["pending"]["leased"]["files"].as_u64(), num(&r, "pending_bytes")), (Some(1), 256 << 10), "{r:#}");
    assert!(out.stderr.contains("sub/b: not shared: another process holds a lease"), "{}", out.stderr);
    let _ = attacker.swapped();
    assert!(same_physical(&c, 0, &d, 0, 192 << 10), "the pair without a lease was not shared: {r:#}");
    assert_eq!(shared_bytes(&b), 0, "{r:#}");
    let r = run_json(&vol, &["--incremental", s(&user)]);
    assert!(same_physical(&a, 0, &b, 0, 256 << 10), "not shared once the lease was gone: {r:#}");
    assert_eq!(num(&r, "pending_bytes"), 0, "{r:#}");
    before.assert_same(&Snapshot::take(&user));
}

/// The same for the zero pass: a thick file (data, then written zeros)
/// leased after the scan is not waited for; its zeros are left pending
/// (`zeros_leased`), not an error, and the next incremental run, nothing
/// changed, turns them into holes. Before, the file was only counted
/// `leased`, and an incremental run left its zeros to the weekly full
/// plan.
fn zeros_leased_at_punch_time(fs: Fs) {
    let Some(vol) = reachable_volume(fs, 300) else { return };
    let user = vol.path("user");
    std::fs::create_dir_all(user.join("sub")).unwrap();
    let b = user.join("sub/b");
    let mut bytes = Rng::new(12).bytes(64 << 10);
    bytes.resize(4 << 20, 0);
    std::fs::write(&b, &bytes).unwrap();
    chown_r(&user);
    let before = Snapshot::take(&user);
    dedupscan().arg("scan").arg(&user).db(vol.db()).expect(0).run();
    let attacker = Attacker::spawn(&user, Path::new("unused"), Moment::Lease);
    let t = std::time::Instant::now();
    let r = dedupscan().arg(&user).json().db(vol.db()).expect(0).run().json;
    assert!(t.elapsed() < std::time::Duration::from_secs(30), "waited for the lease: {:?}", t.elapsed());
    validate_report(&r);
    assert_eq!((num(&r, "errors"), num(&r, "zeros_to_holes_files")), (0, 0), "{r:#}");
    assert_eq!(r["skipped"]["leased"], 1, "{r:#}");
    let left = (r["pending"]["zeros_leased"]["files"].as_u64(), num(&r, "pending_bytes"));
    assert_eq!(left, (Some(1), (4 << 20) - (64 << 10)), "{r:#}");
    let _ = attacker.swapped();
    let r = run_json(&vol, &["--incremental", s(&user)]);
    assert_eq!((num(&r, "zeros_to_holes_files"), num(&r, "pending_bytes")), (1, 0), "{r:#}");
    assert!(physical_blocks(&b, 1 << 20, 4096)[0].is_none(), "zeros still mapped: {r:#}");
    before.assert_same(&Snapshot::take(&user));
}

#[test]
fn btrfs_zeros_of_a_file_leased_after_the_scan_wait_pending() {
    zeros_leased_at_punch_time(Fs::Btrfs);
}

#[test]
fn xfs_zeros_of_a_file_leased_after_the_scan_wait_pending() {
    zeros_leased_at_punch_time(Fs::Xfs);
}

#[test]
fn btrfs_a_file_leased_after_the_scan_waits_pending() {
    leased_at_share_time(Fs::Btrfs);
}

#[test]
fn xfs_a_file_leased_after_the_scan_waits_pending() {
    leased_at_share_time(Fs::Xfs);
}

#[test]
fn btrfs_a_leased_file_is_left_for_the_next_run_without_waiting() {
    leased_file(Fs::Btrfs);
}

#[test]
fn xfs_a_leased_file_is_left_for_the_next_run_without_waiting() {
    leased_file(Fs::Xfs);
}
