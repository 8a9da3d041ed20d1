//! The crawl's work queue: directories to read, shared by the crawler
//! threads, with the count of directories being read so the threads know
//! when the crawl is over.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};

/// A directory to read.
pub(super) enum Job {
    /// An entry of an open parent, opened by the thread that reads it (so
    /// only directories being read, and parents with entries still queued,
    /// hold a descriptor: a directory of 100,000 subdirectories costs one
    /// descriptor, not 100,000).
    Open { parent: Arc<OwnedFd>, name: CString, path: PathBuf },
    /// The rest of a directory (`id` its `(st_dev, st_ino)`) whose listing
    /// stopped after [`super::MAX_SUBDIRS`] subdirectories, from the
    /// directory offset `cookie` on. Taken only when no other directory
    /// waits, so the subdirectories found so far are read first and the
    /// queue holds a few thousand jobs, not one per subdirectory of a
    /// directory a user filled with millions.
    Rest { dir: Arc<OwnedFd>, id: (u64, u64), path: PathBuf, cookie: u64 },
}

/// What the queue holds.
struct State {
    /// Directories to read, the last found first.
    jobs: Vec<Job>,
    /// Rests of directories, read when `jobs` is empty.
    rests: Vec<Job>,
    /// Directories being read.
    busy: usize,
}

/// The crawl's shared queue: directories to read, and how many threads are
/// reading one (the crawl is over when both are zero).
pub(super) struct Queue {
    state: Mutex<State>,
    wake: Condvar,
}

impl Queue {
    /// A queue whose one directory being read is the starting one (its
    /// thread calls [`Queue::done`] with what it found).
    pub(super) fn starting() -> Queue {
        Queue { state: Mutex::new(State { jobs: Vec::new(), rests: Vec::new(), busy: 1 }), wake: Condvar::new() }
    }

    /// The next directory, or `None` when the crawl is over.
    pub(super) fn take(&self) -> Option<Job> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(job) = st.jobs.pop().or_else(|| st.rests.pop()) {
                st.busy += 1;
                return Some(job);
            }
            if st.busy == 0 {
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
        st.jobs.append(jobs);
        drop(st);
        self.woken(n, false);
    }

    /// A thread finished a directory, or stopped listing it (`rest`), and
    /// found `jobs` below it.
    pub(super) fn done(&self, jobs: Vec<Job>, rest: Option<Job>) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.busy -= 1;
        let n = jobs.len() + usize::from(rest.is_some());
        st.jobs.extend(jobs);
        st.rests.extend(rest);
        let over = st.busy == 0 && st.jobs.is_empty() && st.rests.is_empty();
        drop(st);
        self.woken(n, over);
    }

    /// Wake the threads `n` new directories (or the end of the crawl) need.
    fn woken(&self, n: usize, over: bool) {
        if n > 1 || over {
            self.wake.notify_all();
        } else if n == 1 {
            self.wake.notify_one();
        }
    }
}
