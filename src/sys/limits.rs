//! Process resource limits.

/// Raise the soft limit on open file descriptors to the hard limit.
///
/// The share phase keeps up to a request's destinations (127) and its
/// source open on each of up to four workers, the hashing pool one file per
/// thread (up to 1024 threads): near or past the soft limit of 1024 that
/// systemd and most shells give a process, while the hard limit is usually
/// far higher. A file that
/// cannot be opened (`EMFILE`) would be counted as an error and left alone,
/// so the run asks for what it may have instead. Returns the soft limit in
/// effect afterwards; failures leave the limit as it was.
pub fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid, writable rlimit for the kernel to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    if lim.rlim_cur < lim.rlim_max {
        let want = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: `want` is a valid rlimit; setrlimit only reads it.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            return want.rlim_cur;
        }
    }
    lim.rlim_cur
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_soft_limit_ends_at_the_hard_limit() {
        let got = super::raise_fd_limit();
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
        assert_eq!(got, lim.rlim_cur);
    }
}
