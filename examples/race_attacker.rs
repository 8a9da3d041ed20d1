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

use std::collections::HashSet;
use std::io::Write;
use std::mem::MaybeUninit;
use std::path::PathBuf;

use rustix::fs::inotify::{self, ReadFlags, WatchFlags};

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: this program is started by tests/race.rs"))
}

fn main() {
    let user = PathBuf::from(var("RACE_USER_DIR"));
    let (sub, link) = (user.join("sub"), user.join("link"));
    std::os::unix::fs::symlink(var("RACE_LINK"), &link).unwrap();
    let share = match var("RACE_MOMENT").as_str() {
        "Crawl" => false,
        "Share" => true,
        other => panic!("RACE_MOMENT={other}: want Crawl or Share"),
    };
    let fd = inotify::init(inotify::CreateFlags::CLOEXEC).unwrap();
    inotify::add_watch(&fd, &sub, WatchFlags::OPEN).unwrap();
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut buf = [MaybeUninit::uninit(); 8192];
    let mut reader = inotify::Reader::new(&fd, &mut buf);
    let mut opened: HashSet<Vec<u8>> = HashSet::new();
    loop {
        let ev = reader.next().unwrap();
        let go = match ev.file_name() {
            None => !share && ev.events().contains(ReadFlags::OPEN),
            Some(name) if share && !ev.events().contains(ReadFlags::ISDIR) => !opened.insert(name.to_bytes().to_vec()),
            Some(_) => false,
        };
        if go {
            rustix::fs::renameat_with(rustix::fs::CWD, &sub, rustix::fs::CWD, &link, rustix::fs::RenameFlags::EXCHANGE)
                .unwrap();
            println!("swapped");
            std::io::stdout().flush().unwrap();
            return;
        }
    }
}
