//! The bound on block maps held in memory between the hashers and the
//! database ([`MapBytes`]).

use std::sync::{Condvar, Mutex};

use crate::blockmap::FP_BYTES;

/// Block-map bytes in memory at most, from the moment a file starts being
/// hashed until its map is committed (on the hashing threads, in the
/// writer's channel and in its open transaction), see [`MapBytes`]. 32 MiB
/// of maps describe about 21 GiB of data: larger images are hashed one at a
/// time (a sequential read each, at the disk's pace), and `tests/clones.rs`
/// holds a scan of 400 reflinked clones under 80 MB with this bound.
pub const MAP_BYTES_CAP: u64 = 32 << 20;

/// Block-map bytes being built, queued or written and not yet committed.
///
/// A map is 6 bytes a block, 1.5 MB for a 1 GiB file, and it grows in
/// memory while the file is hashed: sixteen hashing threads on sixteen
/// 100 GiB VM images hold 2.4 GB of maps (a store of large images, all
/// changed since the last night, is the usual case). The writer's channel
/// bounds files, not bytes, and files whose extents were hashed before
/// (reflinked clones, snapshots) come out of the hashers with no read at
/// all, faster than the writer commits them: 256 queued and 512 in a
/// transaction of 1 GiB clones held 140 MB for 101 clones, 50 GB for
/// 10,000. So a hasher reserves a file's map, estimated from its allocated
/// size ([`map_estimate`]), before it reads it ([`MapBytes::reserve`]),
/// waiting while [`MAP_BYTES_CAP`] bytes are held (a map larger than that
/// goes alone), keeps what the map came to, and the writer gives it back
/// as it commits.
#[derive(Debug, Default)]
pub struct MapBytes {
    /// Bytes held, and whether the writer is gone (then nobody waits).
    used: Mutex<(u64, bool)>,
    freed: Condvar,
}

/// Bytes reserved for one file's map; given back when dropped, unless
/// [`Reserved::keep`] hands them on to the writer.
#[derive(Debug)]
pub struct Reserved<'a> {
    bytes: &'a MapBytes,
    n: u64,
}

impl Reserved<'_> {
    /// The map came to `actual` bytes: hold those (until the writer
    /// commits them) instead of the estimate.
    pub fn keep(self, actual: u64) {
        let bytes = self.bytes;
        let n = self.n;
        std::mem::forget(self);
        bytes.adjust(n, actual);
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.bytes.give(self.n);
    }
}

/// An upper bound of the map of a file holding `data` bytes of data in
/// `block`-byte blocks: 6 bytes a block, and a pair for a run of zeros.
pub fn map_estimate(data: u64, block: u64) -> u64 {
    (data.div_ceil(block.max(1)) + 2) * FP_BYTES as u64
}

impl MapBytes {
    /// Wait for room for `n` more bytes, and take them.
    pub fn take(&self, n: u64) {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        while !used.1 && used.0 > 0 && used.0 + n > MAP_BYTES_CAP {
            used = self.freed.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        used.0 += n;
    }

    /// [`MapBytes::take`] `n` bytes for one file's map, given back unless
    /// kept.
    pub fn reserve(&self, n: u64) -> Reserved<'_> {
        self.take(n);
        Reserved { bytes: self, n }
    }

    /// Hold `now` bytes instead of `before` (never waits).
    fn adjust(&self, before: u64, now: u64) {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        used.0 = used.0.saturating_sub(before) + now;
        if now < before {
            self.freed.notify_all();
        }
    }

    /// Give back `n` bytes (committed, or not needed).
    pub fn give(&self, n: u64) {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        used.0 = used.0.saturating_sub(n);
        self.freed.notify_all();
    }

    /// The writer is gone (done, or failed): nobody waits any more.
    pub fn close(&self) {
        self.used.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
        self.freed.notify_all();
    }

    /// Bytes held now.
    #[cfg(test)]
    fn held(&self) -> u64 {
        self.used.lock().unwrap().0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// A hasher waits while the cap is reached, goes on when the writer
    /// commits or is gone; one map larger than the cap goes alone.
    #[test]
    fn map_bytes_bound_what_is_in_flight() {
        let bytes = MapBytes::default();
        bytes.take(MAP_BYTES_CAP + 1); // alone: nothing else in flight
        bytes.give(MAP_BYTES_CAP + 1);
        bytes.take(MAP_BYTES_CAP - 10);
        let went = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                bytes.take(20);
                went.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(50));
            assert!(!went.load(Ordering::SeqCst), "took room beyond the cap");
            bytes.give(MAP_BYTES_CAP - 10);
        });
        assert!(went.load(Ordering::SeqCst));
        // The writer gone: nobody waits (20 bytes in flight, a full cap
        // more would wait otherwise).
        bytes.close();
        bytes.take(MAP_BYTES_CAP);
    }

    /// A reservation holds its estimate while the file is hashed, then
    /// what the map came to (until committed), or nothing if dropped; a
    /// hasher waiting for room goes on when an estimate shrinks.
    #[test]
    fn reservations_hold_the_estimate_then_the_map() {
        let bytes = MapBytes::default();
        let big = bytes.reserve(MAP_BYTES_CAP - 100);
        assert_eq!(bytes.held(), MAP_BYTES_CAP - 100);
        let went = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                drop(bytes.reserve(1000));
                went.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(50));
            assert!(!went.load(Ordering::SeqCst), "reserved beyond the cap");
            big.keep(500); // a sparse file: its map is small
        });
        assert!(went.load(Ordering::SeqCst));
        assert_eq!(bytes.held(), 500, "the kept map, the dropped reservation given back");
        bytes.give(500);
        assert_eq!(bytes.held(), 0);
        assert_eq!(map_estimate(0, 4096), 12);
        assert_eq!(map_estimate(4097, 4096), 24);
    }
}
