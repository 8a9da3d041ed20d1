//! The attacker of `tests/race.rs`: an unprivileged process racing a root
//! run. Not a test and not for users: the race tests start it (as uid
//! 65534, with `setpriv`) from `target/<profile>/examples/`, which
//! `cargo test` builds.
//!
//! Inside `RACE_USER_DIR` it makes the symlink `link` → `RACE_LINK`, watches
//! `sub` with inotify, prints `ready`, and at the moment `RACE_MOMENT` names
//! swaps `sub` and `link` in one `renameat2(RENAME_EXCHANGE)`, prints
//! `swapped` and exits:
//!
//! - `Crawl`: when `sub` itself is opened (the crawler is about to list it);
//! - `Share`: when a file of `sub` is opened a second time (the hashing
//!   pool opens each file once, so the second open is the share phase's).
//!
//! With `RACE_MOMENT=Move` it makes no symlink and moves `sub` (see
//! [`move_twice`]); with `Link`, it links files (see [`link_during_share`]);
//! with `Lease`, it holds leases (see [`hold_leases`]).

use std::collections::HashSet;
use std::io::Write;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};

use rustix::fs::inotify::{self, ReadFlags, WatchFlags};

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: this program is started by tests/race.rs"))
}

fn main() {
    let user = PathBuf::from(var("RACE_USER_DIR"));
    let (sub, link) = (user.join("sub"), user.join("link"));
    let share = match var("RACE_MOMENT").as_str() {
        "Crawl" => false,
        "Share" => true,
        "Move" => return move_twice(&sub, &PathBuf::from(var("RACE_LINK"))),
        "Link" => return link_during_share(&sub, &PathBuf::from(var("RACE_LINK"))),
        "Lease" => return hold_leases(&sub),
        other => panic!("RACE_MOMENT={other}: want Crawl, Share, Move, Link or Lease"),
    };
    std::os::unix::fs::symlink(var("RACE_LINK"), &link).unwrap();
    let mut opened: HashSet<Vec<u8>> = HashSet::new();
    until_open(&sub, |name, is_dir| match name {
        None => !share,
        Some(name) => share && !is_dir && !opened.insert(name.to_vec()),
    });
    rustix::fs::renameat_with(rustix::fs::CWD, &sub, rustix::fs::CWD, &link, rustix::fs::RenameFlags::EXCHANGE)
        .unwrap();
    swapped();
}

/// `RACE_MOMENT=Move`: once a file of `sub` has been opened (the hashers
/// got its first name), move `sub` to `to` (inside a directory the crawl
/// has not listed yet), so the crawl meets the directory a second time;
/// when it is opened there, move it back, so the first names are valid
/// again for the share phase.
fn move_twice(sub: &Path, to: &Path) {
    let mut moved = false;
    until_open(sub, |name, is_dir| {
        if !moved && name.is_some() && !is_dir {
            std::fs::rename(sub, to).unwrap();
            moved = true;
        }
        moved && name.is_none()
    });
    std::fs::rename(to, sub).unwrap();
    swapped();
}

/// `RACE_MOMENT=Link`: 20 ms after a file of `sub` is opened a second
/// time (the share phase has started on it), give every file of `sub` a
/// second name in `to` (a directory marked `.nodedup`), then print
/// `swapped` and the time the last link returned (seconds since the
/// epoch, as `strace -ttt` prints them).
fn link_during_share(sub: &Path, to: &Path) {
    let mut opened: HashSet<Vec<u8>> = HashSet::new();
    until_open(sub, |name, is_dir| name.is_some_and(|n| !is_dir && !opened.insert(n.to_vec())));
    std::thread::sleep(std::time::Duration::from_millis(20));
    for e in std::fs::read_dir(sub).unwrap() {
        let e = e.unwrap();
        std::fs::hard_link(e.path(), to.join(e.file_name())).unwrap();
    }
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    println!("swapped {}.{:06}", t.as_secs(), t.subsec_micros());
    std::io::stdout().flush().unwrap();
}

/// `RACE_MOMENT=Lease`: take a write lease on every file of `sub`, as a
/// file server does for a client's exclusive oplock, ignore the signal that
/// asks to give it up, print `ready` and hold the leases until killed.
fn hold_leases(sub: &Path) {
    // SAFETY: setting a signal's disposition to "ignore".
    unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
    let mut held = Vec::new();
    for e in std::fs::read_dir(sub).unwrap() {
        let f = std::fs::File::open(e.unwrap().path()).unwrap();
        // SAFETY: fcntl on a descriptor we hold.
        let rc = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&f), libc::F_SETLEASE, libc::F_WRLCK) };
        assert_eq!(rc, 0, "F_SETLEASE: {}", std::io::Error::last_os_error());
        held.push(f);
    }
    println!("ready");
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::park();
    }
}

fn swapped() {
    println!("swapped");
    std::io::stdout().flush().unwrap();
}

/// Watch `dir` (inotify follows the directory itself, wherever it is
/// moved), print `ready`, and call `at` with each open in it: the name
/// opened (None: the directory itself) and whether it is a directory,
/// until `at` says true.
fn until_open(dir: &Path, mut at: impl FnMut(Option<&[u8]>, bool) -> bool) {
    let fd = inotify::init(inotify::CreateFlags::CLOEXEC).unwrap();
    inotify::add_watch(&fd, dir, WatchFlags::OPEN).unwrap();
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut buf = [MaybeUninit::uninit(); 8192];
    let mut reader = inotify::Reader::new(&fd, &mut buf);
    loop {
        let ev = reader.next().unwrap();
        if ev.events().contains(ReadFlags::OPEN)
            && at(ev.file_name().map(|n| n.to_bytes()), ev.events().contains(ReadFlags::ISDIR))
        {
            return;
        }
    }
}
