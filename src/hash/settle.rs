//! Times that can be trusted: a file is read only once its ctime lies in a
//! clock tick already past.
//!
//! Change detection trusts a file whose size, mtime and ctime are as
//! recorded. The kernel stamps those times from a clock that moves once per
//! tick (1–10 ms); before Linux 6.13 (multigrain timestamps), a write in
//! the same tick as the file's last change leaves both times as they were.
//! So a file read in the tick of its last change could be written again
//! right after, in that tick, and look unchanged for good: its fingerprints
//! would stay those of the old contents. (Git calls such index entries
//! "racily clean".) Reading the coarse clock *before* the `fstat` whose
//! facts are recorded, and reading only when it is already past the ctime,
//! closes this: any later write is stamped with a later tick. A file
//! changed in the current tick costs a wait of at most one tick.

use std::time::Duration;

/// How long to wait before taking the facts of a file with inode change
/// time `ctime` (nanoseconds since the epoch) when the coarse clock read
/// just before its `fstat` said `now`: `None` when the clock is past it.
/// A ctime more than [`MAX_AHEAD`] ahead is not waited for: the clock was
/// set back, and a write now is stamped with a time before it, so changes.
pub fn wait_for(ctime: i128, now: i128) -> Option<Duration> {
    let ahead = ctime - now;
    (0..=MAX_AHEAD).contains(&ahead).then(|| Duration::from_nanos(ahead as u64 + 1_000_000))
}

/// How far ahead of the coarse clock a ctime can be when the clock was not
/// set back, in nanoseconds: a tick is at most 10 ms, and a multigrain
/// kernel stamps at most a tick ahead of it. Bounds any one wait.
const MAX_AHEAD: i128 = 100_000_000;

/// `fstat` of `file` taken in a tick past its ctime (see the module
/// documentation); after 50 waits (a clock that does not move), the last
/// one as it is.
pub fn settled_metadata(file: &std::fs::File) -> std::io::Result<std::fs::Metadata> {
    let mut tries = 0;
    loop {
        let now = crate::sys::inode::coarse_clock_ns();
        let m = file.metadata()?;
        match wait_for(ctime_ns(&m), now) {
            Some(d) if tries < 50 => std::thread::sleep(d),
            _ => return Ok(m),
        }
        tries += 1;
    }
}

/// The inode change time of `m`, in nanoseconds since the epoch.
fn ctime_ns(m: &std::fs::Metadata) -> i128 {
    use std::os::unix::fs::MetadataExt;
    i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i128 = 1_000_000_000;

    #[test]
    fn only_a_ctime_in_the_current_tick_or_just_ahead_is_waited_for() {
        let now = 1_700_000_000 * S + 500;
        assert_eq!(wait_for(now - 1, now), None, "a past tick");
        assert_eq!(wait_for(now - 5 * S, now), None);
        assert_eq!(wait_for(now, now), Some(Duration::from_millis(1)), "the current tick");
        // A multigrain kernel stamps finer than its coarse clock.
        assert_eq!(wait_for(now + 300_000, now), Some(Duration::from_nanos(1_300_000)));
        assert_eq!(wait_for(now + MAX_AHEAD, now), Some(Duration::from_millis(101)));
        assert_eq!(wait_for(now + MAX_AHEAD + 1, now), None, "a clock set back is not waited out");
        assert_eq!(wait_for(now + S, now), None);
    }

    #[test]
    fn a_file_changed_now_is_taken_in_a_later_tick() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"x").unwrap();
        let f = std::fs::File::open(&p).unwrap();
        let m = settled_metadata(&f).unwrap();
        assert!(crate::sys::inode::coarse_clock_ns() > ctime_ns(&m), "read in the tick of its change");
    }
}
