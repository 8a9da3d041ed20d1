//! Free space the rewrites leave (btrfs): never the volume's last.
//!
//! The bookend pass, the pass that rewrites parts found different and the
//! zero pass copy data into fresh extents before the old ones can go
//! ([`super::bookend::copy_out`]). An old extent is released only once
//! nothing references it — for the bookend pass, after the plan's ranges
//! of the batch are shared too — and then at the next transaction commit;
//! until then the volume holds both. Volumes are often deduplicated
//! *because* they are nearly full, and other programs write to them
//! meanwhile: a run that took their last free bytes, even for seconds,
//! would make their writes fail with ENOSPC. So every copy first takes its
//! bytes from a budget: what the volume has available (`statfs`, as an
//! unprivileged writer sees it) above the reserve `--keep-free`. When the
//! budget is spent it is measured again after a commit (`syncfs`: what
//! earlier batches freed is counted by then), at most once a second while
//! that finds too little. A copy refused is not an error: its file waits,
//! whole, for a later run ([`super::Pending::KeepFree`]), as on a full
//! disk; the run itself frees room for it, and tries it again once the
//! batches are shared (`pipeline::rounds`). `--keep-free 0` turns this off
//! (the kernel's ENOSPC is then the only limit).
//!
//! Sharing itself writes no data, so it is not limited.
//!
//! A dry run writes nothing either, but previews the copies against the
//! same budget, so that it says which files would wait: measured once
//! (without a commit: nothing of ours is waiting for one) and never again,
//! since nothing it "copied" took or freed space. What the run's later
//! measurements would find instead is credited to it
//! ([`Headroom::credit`]): after each batch, the bytes its sharing would
//! free, so the preview rewrites in later batches and rounds what the run
//! would (`pipeline::rounds`). The credit counts logical bytes, as the
//! budget does: on compressed extents the run frees less than that.

use std::io;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::display::human;

/// How much of the volume the rewrites leave free (`--keep-free`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeepFree {
    /// At least this many bytes.
    Bytes(u64),
    /// At least this share of the volume's size, in percent.
    Percent(f64),
}

impl KeepFree {
    /// The default: 1% of the volume. On a 10 TB volume that keeps 100 GB
    /// free, so rewrites wait only when it is over 99% full, where the
    /// room other programs need matters more than the pinned bytes (which
    /// the next run with room frees).
    pub const DEFAULT: KeepFree = KeepFree::Percent(1.0);

    /// `--keep-free 0`: no budget, nothing measured.
    pub fn is_off(self) -> bool {
        self == KeepFree::Bytes(0) || self == KeepFree::Percent(0.0)
    }

    /// The reserve in bytes on a volume of `total` bytes.
    pub fn bytes(self, total: u64) -> u64 {
        match self {
            KeepFree::Bytes(n) => n,
            KeepFree::Percent(p) => (total as f64 * p / 100.0).ceil() as u64,
        }
    }
}

/// Measures the volume: `(available, total)` bytes, after a commit.
type Measure = Box<dyn Fn() -> io::Result<(u64, u64)> + Send + Sync>;

/// A copy refused to keep the reserve free (an [`io::Error`] of kind
/// `StorageFull` carries it; see [`kept_free`]).
#[derive(Debug)]
pub struct KeptFree {
    /// The reserve, in bytes.
    pub reserve: u64,
}

impl std::fmt::Display for KeptFree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the volume (or its qgroup limit) would keep less than {} free (--keep-free)", human(self.reserve))
    }
}

impl std::error::Error for KeptFree {}

/// Whether `e` is a copy refused to keep the reserve free.
pub fn kept_free(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<KeptFree>())
}

/// How long a measurement that found too little stands before the next.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The budget of bytes the rewrites may still write (see the module doc).
pub struct Headroom {
    keep: KeepFree,
    measure: Measure,
    /// Measure only the first time (a dry run).
    once: bool,
    state: Mutex<State>,
    /// Whether a refusal was said (once a run is enough: the report
    /// counts the files).
    said: AtomicBool,
}

#[derive(Default)]
struct State {
    /// Bytes that may be written before measuring again.
    left: u64,
    /// The reserve, once the volume's size is known.
    reserve: u64,
    /// After a measurement that found too little: no other before this.
    refused_until: Option<Instant>,
    /// Whether a measurement was made.
    measured: bool,
    /// A dry run's credit ([`Headroom::credit`]) before its measurement.
    credit: u64,
    /// How far below the reserve a dry run's measurement was: its credit
    /// fills that first, as what sharing frees does for the run.
    short: u64,
}

impl Headroom {
    /// The budget on the filesystem of `path` (a starting path: opened
    /// for each measurement, as the run's own measurement does); for a
    /// `dry_run`, measured once.
    pub fn of_volume(path: PathBuf, keep: KeepFree, dry_run: bool) -> Headroom {
        let measure: Measure = Box::new(move || {
            let fs = crate::sys::inode::open_path_readonly(&path)?;
            if !dry_run {
                crate::sys::commit(&fs)?;
            }
            let (available, total) = crate::sys::space(fs.as_fd())?;
            // A qgroup limit on the subvolume bounds the copies as the
            // volume's size does.
            Ok(match crate::sys::qgroup::qgroup_room(fs.as_fd()) {
                Some((room, limit)) => (available.min(room), total.min(limit)),
                None => (available, total),
            })
        });
        Headroom::new(keep, measure, dry_run)
    }

    /// A budget measured by `measure` (tests give their own), only once
    /// when `once`.
    fn new(keep: KeepFree, measure: Measure, once: bool) -> Headroom {
        Headroom { keep, measure, once, state: Mutex::new(State::default()), said: AtomicBool::new(false) }
    }

    /// Take `bytes` for a copy: `Ok` when the volume keeps the reserve
    /// free after it, else an error of kind `StorageFull` carrying
    /// [`KeptFree`] (or the measurement's own error).
    pub fn take(&self, bytes: u64) -> io::Result<()> {
        if self.keep.is_off() {
            return Ok(());
        }
        let mut s = self.lock();
        if s.left < bytes {
            let now = Instant::now();
            if !(self.once && s.measured) && s.refused_until.is_none_or(|t| now >= t) {
                s.measured = true;
                let (available, total) = (self.measure)()?;
                s.reserve = self.keep.bytes(total);
                let have = available + s.credit;
                (s.left, s.short) = (have.saturating_sub(s.reserve), s.reserve.saturating_sub(have));
                s.refused_until = (s.left < bytes).then(|| now + RETRY_AFTER);
            }
            if s.left < bytes {
                return Err(io::Error::new(io::ErrorKind::StorageFull, KeptFree { reserve: s.reserve }));
            }
        }
        s.left -= bytes;
        Ok(())
    }

    /// Measure again at the next copy, however recently a measurement
    /// found too little: for another round over files that waited, after
    /// sharing that freed room (`pipeline::rounds`). A dry run's single
    /// measurement stands.
    pub fn measure_again(&self) {
        if !self.once {
            let mut s = self.lock();
            (s.left, s.refused_until) = (0, None);
        }
    }

    /// A dry run: `bytes` that sharing what it previewed would have freed,
    /// and the run would find at its next measurement (see the module
    /// doc). A real run measures what sharing freed instead.
    pub fn credit(&self, bytes: u64) {
        if self.once {
            let mut s = self.lock();
            if s.measured {
                let paid = bytes.min(s.short);
                s.short -= paid;
                s.left += bytes - paid;
            } else {
                s.credit += bytes;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `true` the first time it is asked: whether to say a refusal.
    pub fn first_refusal(&self) -> bool {
        !self.said.swap(true, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    const M: u64 = 1 << 20;

    /// A budget over a volume of 1000 MiB whose available bytes the test
    /// sets, counting the measurements.
    fn volume(keep: KeepFree) -> (Headroom, Arc<AtomicU64>, Arc<AtomicU64>) {
        volume_measured(keep, false)
    }

    /// [`volume`], measured only once when `once` (a dry run).
    fn volume_measured(keep: KeepFree, once: bool) -> (Headroom, Arc<AtomicU64>, Arc<AtomicU64>) {
        let (avail, calls) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (a, c) = (avail.clone(), calls.clone());
        let room = Headroom::new(
            keep,
            Box::new(move || {
                c.fetch_add(1, Ordering::Relaxed);
                Ok((a.load(Ordering::Relaxed), 1000 * M))
            }),
            once,
        );
        (room, avail, calls)
    }

    #[test]
    fn copies_take_what_is_available_above_the_reserve() {
        let (room, avail, calls) = volume(KeepFree::Percent(1.0));
        avail.store(100 * M, Ordering::Relaxed);
        // 10 MiB reserved (1% of 1000 MiB): 90 MiB to write, measured once.
        for _ in 0..9 {
            room.take(10 * M).unwrap();
        }
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        // Spent: measured again, the copies written and nothing freed.
        avail.store(10 * M + M / 2, Ordering::Relaxed);
        let e = room.take(M).unwrap_err();
        assert!(kept_free(&e) && e.kind() == io::ErrorKind::StorageFull, "{e}");
        assert_eq!(e.to_string(), "the volume (or its qgroup limit) would keep less than 10.0 MiB free (--keep-free)");
        assert_eq!(calls.load(Ordering::Relaxed), 2);
        // Within a second of a refusal: refused without measuring.
        avail.store(500 * M, Ordering::Relaxed);
        assert!(room.take(M).is_err());
        assert_eq!(calls.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_spent_budget_is_measured_again_and_refilled_by_what_commits_freed() {
        let (room, avail, calls) = volume(KeepFree::Bytes(20 * M));
        avail.store(30 * M, Ordering::Relaxed);
        room.take(8 * M).unwrap();
        // The old extents of the first copies were freed at the commit.
        avail.store(40 * M, Ordering::Relaxed);
        room.take(8 * M).unwrap();
        assert_eq!(calls.load(Ordering::Relaxed), 2);
        room.take(12 * M).unwrap();
        assert_eq!(calls.load(Ordering::Relaxed), 2);
        // A copy larger than all there is: refused, even on a fresh measure.
        assert!(room.take(21 * M).is_err());
    }

    #[test]
    fn another_round_measures_at_once_what_the_sharing_freed() {
        let (room, avail, calls) = volume(KeepFree::Bytes(10 * M));
        avail.store(12 * M, Ordering::Relaxed);
        assert!(room.take(4 * M).is_err());
        // Sharing the round freed room; the next round does not wait out
        // the second a refusal stands.
        avail.store(30 * M, Ordering::Relaxed);
        assert!(room.take(4 * M).is_err());
        room.measure_again();
        room.take(4 * M).unwrap();
        assert_eq!(calls.load(Ordering::Relaxed), 2);
        // A dry run's single measurement stands.
        let (room, avail, calls) = volume_measured(KeepFree::Bytes(10 * M), true);
        avail.store(30 * M, Ordering::Relaxed);
        room.take(15 * M).unwrap();
        room.measure_again();
        room.take(5 * M).unwrap();
        assert!(room.take(M).is_err());
        assert_eq!(calls.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_reserve_is_a_size_or_a_share_of_the_volume() {
        assert_eq!(KeepFree::Bytes(5).bytes(1000), 5);
        assert_eq!(KeepFree::Percent(1.0).bytes(1000 * M), 10 * M);
        assert_eq!(KeepFree::Percent(0.0).bytes(1000), 0);
        assert_eq!(KeepFree::DEFAULT, KeepFree::Percent(1.0));
    }

    #[test]
    fn a_dry_run_spends_one_measurement_and_never_measures_again() {
        let (room, avail, calls) = volume_measured(KeepFree::Bytes(10 * M), true);
        avail.store(30 * M, Ordering::Relaxed);
        room.take(15 * M).unwrap();
        // Nothing was written, so measuring again would find the same room
        // and preview more copies than the run could make.
        assert!(kept_free(&room.take(6 * M).unwrap_err()));
        std::thread::sleep(RETRY_AFTER);
        assert!(room.take(6 * M).is_err());
        room.take(5 * M).unwrap();
        assert_eq!(calls.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_dry_run_is_credited_what_its_sharing_would_free() {
        let (room, avail, calls) = volume_measured(KeepFree::Bytes(10 * M), true);
        avail.store(30 * M, Ordering::Relaxed);
        // Credited before the first copy: added to the measurement.
        room.credit(2 * M);
        room.take(22 * M).unwrap();
        assert!(room.take(M).is_err());
        room.credit(3 * M);
        room.take(3 * M).unwrap();
        assert!(room.take(M).is_err());
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        // Measured below the reserve: the credit fills that first.
        let (room, avail, _) = volume_measured(KeepFree::Bytes(10 * M), true);
        avail.store(4 * M, Ordering::Relaxed);
        assert!(room.take(M).is_err());
        room.credit(6 * M);
        assert!(room.take(M).is_err());
        room.credit(2 * M);
        room.take(2 * M).unwrap();
        assert!(room.take(M).is_err());
        // A real run measures instead.
        let (room, avail, _) = volume(KeepFree::Bytes(10 * M));
        avail.store(12 * M, Ordering::Relaxed);
        room.credit(50 * M);
        assert!(room.take(4 * M).is_err());
    }

    #[test]
    fn a_reserve_of_zero_is_off_and_never_measured() {
        for keep in [KeepFree::Bytes(0), KeepFree::Percent(0.0)] {
            let (room, avail, calls) = volume(keep);
            avail.store(0, Ordering::Relaxed);
            room.take(1 << 40).unwrap();
            assert_eq!(calls.load(Ordering::Relaxed), 0);
        }
    }

    #[test]
    fn a_failed_measurement_is_the_copys_error() {
        let room = Headroom::new(KeepFree::DEFAULT, Box::new(|| Err(io::Error::from_raw_os_error(libc::EIO))), false);
        let e = room.take(1).unwrap_err();
        assert!(!kept_free(&e));
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
    }
}
