//! Who else changes a filesystem while a run measures what it freed.
//!
//! "Freed" is measured, not estimated: free space after the share phase
//! minus free space before it (`statfs`). On a server in use, other
//! processes write, truncate and delete on the same filesystem meanwhile,
//! and the difference holds their changes too: a backup writing 300 MiB
//! during the share phase of a run that freed 847 MiB made the run report
//! 511 MiB, and a larger one makes it negative. Nothing in the figure says
//! so. A [`Watch`] tells: a fanotify mark on the whole filesystem
//! (`FAN_MARK_FILESYSTEM`) reports every write, truncation, `fallocate`,
//! clone, creation and deletion with the process that made it, and the
//! first one made by another process answers the question. The mark is
//! removed then: while it is on, every write to the filesystem queues an
//! event (measured: a million 512-byte writes took 2.2–2.9 s instead of
//! 1.2–1.6 s), a cost a busy server should not pay for the rest of a long
//! share phase, so a watch reports *whether* others changed the
//! filesystem, not how many or how much.
//!
//! Events carry file handles, never open descriptors (`FAN_REPORT_FID`):
//! the kernel opens nothing on our behalf, so a write to a FIFO or a device
//! node in the tree does not make a root process open it. That mode needs a
//! filesystem whose mounted root has the superblock's fsid: XFS always; on
//! btrfs only the top-level subvolume (a mount of another subvolume is
//! refused with `EXDEV`), so a run in a subvolume mounted on its own
//! watches through a mount of the top level where there is one
//! ([`Watch::of_path`]). Where there is none, and without `CAP_SYS_ADMIN`
//! or on kernels before 5.1, nothing is watched and the report says so
//! (`None`). Writes through a shared `mmap` are never reported by
//! fanotify: a watch that saw nobody is not proof that nobody wrote.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::fanotify::{EventFFlags, Fanotify, InitFlags, MarkFlags, MaskFlags};

use super::inode::open_path_readonly;

/// How often the watching thread empties the kernel's queue: its 16,384
/// events would otherwise fill with this run's own (a write to each
/// temporary copy of the bookend pass is one).
const DRAIN_EVERY: Duration = Duration::from_millis(100);

/// A filesystem being watched for changes by other processes.
pub struct Watch {
    stop: Arc<AtomicBool>,
    /// Taken by [`Watch::stop`].
    thread: Option<JoinHandle<bool>>,
}

impl Watch {
    /// Watch the filesystem of the canonical path `path`: through `path`
    /// itself, else (a btrfs subvolume mounted on its own, `EXDEV`) through
    /// a mount of the same filesystem's top level. `None`: it cannot be
    /// watched.
    pub fn of_path(path: &Path) -> Option<Watch> {
        let f = open_path_readonly(path).ok()?;
        match Watch::start(f.as_fd()) {
            Ok(w) => Some(w),
            Err(Errno::EXDEV) => {
                let instance = super::fs_info(f.as_fd()).ok()?.instance;
                super::mounts::roots_of_fs(path).iter().find_map(|root| {
                    let r = open_path_readonly(root).ok()?;
                    let same = super::fs_info(r.as_fd()).ok()?.instance == instance;
                    same.then(|| Watch::start(r.as_fd()).ok()).flatten()
                })
            }
            Err(_) => None,
        }
    }

    /// Watch the filesystem holding the open file or directory `fd`.
    /// `Err`: this filesystem, kernel or process cannot be watched (see the
    /// module documentation).
    pub fn start(fd: BorrowedFd<'_>) -> nix::Result<Watch> {
        let init = InitFlags::FAN_CLASS_NOTIF
            | InitFlags::FAN_CLOEXEC
            | InitFlags::FAN_NONBLOCK
            | InitFlags::from_bits_retain(libc::FAN_REPORT_FID);
        let fan = Fanotify::init(init, EventFFlags::O_RDONLY)?;
        let mask = MaskFlags::FAN_MODIFY | MaskFlags::FAN_CREATE | MaskFlags::FAN_DELETE | MaskFlags::FAN_ONDIR;
        fan.mark(MarkFlags::FAN_MARK_ADD | MarkFlags::FAN_MARK_FILESYSTEM, mask, fd, None::<&std::path::Path>)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("watch".into())
            .spawn(move || until_others(fan, &stopped))
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EAGAIN)))?;
        Ok(Watch { stop, thread: Some(thread) })
    }

    /// Stop watching: whether another process changed the filesystem
    /// since [`Watch::start`]. Changes made before this call are seen:
    /// fanotify queues an event before the system call that caused it
    /// returns.
    pub fn stop(mut self) -> bool {
        self.stop.store(true, Ordering::Relaxed);
        let Some(thread) = self.thread.take() else { return true };
        // Now, not at its next wake-up: every run would end 100 ms later.
        thread.thread().unpark();
        // A panic in the thread: "nobody" would be a lie.
        thread.join().unwrap_or(true)
    }
}

impl Drop for Watch {
    /// Dropped without [`Watch::stop`] (the run failed before measuring
    /// again): the thread ends at its next wake-up, unwaited.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Read events until another process's change shows up (then close the
/// group, which removes the mark) or until `stop`, then once more.
/// A full queue (`FAN_Q_OVERFLOW`) or a failed read counts as a change:
/// who made the lost events is unknown.
fn until_others(fan: Fanotify, stop: &AtomicBool) -> bool {
    let me = std::process::id() as i32;
    loop {
        let last = stop.load(Ordering::Relaxed);
        loop {
            match fan.read_events() {
                Ok(events) if !events.is_empty() => {
                    if events.iter().any(|e| e.mask().contains(MaskFlags::FAN_Q_OVERFLOW) || e.pid() != me) {
                        return true;
                    }
                }
                Err(Errno::EINTR) => {}
                Ok(_) | Err(Errno::EAGAIN) => break,
                Err(_) => return true,
            }
        }
        if last {
            return false;
        }
        // Woken early by [`Watch::stop`].
        std::thread::park_timeout(DRAIN_EVERY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    #[test]
    fn a_write_by_this_process_is_not_counted_and_one_by_another_is() {
        let dir = tempfile::tempdir().unwrap();
        let d = std::fs::File::open(dir.path()).unwrap();
        let Ok(w) = Watch::start(d.as_fd()) else {
            // Not root, or this filesystem cannot be watched (tmpfs can).
            assert!(!root() || std::env::var_os("DEDUPSCAN_REQUIRE_FS_TESTS").is_none(), "cannot watch");
            return;
        };
        std::fs::write(dir.path().join("mine"), b"data").unwrap();
        std::fs::remove_file(dir.path().join("mine")).unwrap();
        assert!(!w.stop(), "our own writes");
        let w = Watch::start(d.as_fd()).unwrap();
        let other = std::process::Command::new("sh")
            .arg("-c")
            .arg("echo data > \"$1\"/theirs")
            .arg("sh")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(other.success());
        assert!(w.stop(), "another process wrote");
    }
}
