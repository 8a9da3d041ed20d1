//! The crawl's work queue: directories to read, shared by the crawler
//! threads, with the count of directories being read so the threads know
//! when the crawl is over.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};

/// A directory to read: an entry of an open parent, opened by the thread
/// that reads it (so only directories being read, and parents with entries
/// still queued, hold a descriptor: a directory of 100,000 subdirectories
/// costs one descriptor, not 100,000).
pub(super) struct Job {
    pub(super) parent: Arc<OwnedFd>,
    pub(super) name: CString,
    pub(super) path: PathBuf,
}

/// The crawl's shared queue: directories to read, and how many threads are
/// reading one (the crawl is over when both are zero).
pub(super) struct Queue {
    /// Directories to read, and how many threads are reading one.
    state: Mutex<(Vec<Job>, usize)>,
    wake: Condvar,
}

impl Queue {
    /// A queue whose one directory being read is the starting one (its
    /// thread calls [`Queue::done`] with what it found).
    pub(super) fn starting() -> Queue {
        Queue { state: Mutex::new((Vec::new(), 1)), wake: Condvar::new() }
    }

    /// The next directory, or `None` when the crawl is over.
    pub(super) fn take(&self) -> Option<Job> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(job) = st.0.pop() {
                st.1 += 1;
                return Some(job);
            }
            if st.1 == 0 {
                self.wake.notify_all();
                return None;
            }
            st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Subdirectories found by a thread still listing its directory: queued
    /// at once, so idle threads start on them while the listing goes on
    /// (cold metadata reads overlap).
    pub(super) fn push(&self, jobs: &mut Vec<Job>) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let n = jobs.len();
        st.0.append(jobs);
        drop(st);
        if n > 1 {
            self.wake.notify_all();
        } else if n == 1 {
            self.wake.notify_one();
        }
    }

    /// A thread finished a directory and found `jobs` below it.
    pub(super) fn done(&self, jobs: Vec<Job>) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.1 -= 1;
        let (n, idle) = (jobs.len(), st.1 == 0);
        st.0.extend(jobs);
        if n > 1 || (idle && st.0.is_empty()) {
            self.wake.notify_all();
        } else if n == 1 {
            self.wake.notify_one();
        }
    }
}
