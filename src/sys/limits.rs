//! Process resource limits: open files, and the memory the page cache can
//! hold for this process.

use std::path::Path;

/// Raise the soft limit on open file descriptors to the hard limit.
///
/// The share phase keeps up to a request's destinations (127) and its
/// source open on each of its workers (up to eight, see
/// `dedupe::sharing`), the hashing pool one file per thread (up to
/// 1024 threads): near or past the soft limit of 1024 that systemd and most
/// shells give a process, while the hard limit is usually far higher. A
/// file that cannot be opened (`EMFILE`) would be counted as an error and
/// left alone, so the run asks for what it may have instead. Returns the
/// soft limit in effect afterwards; failures leave the limit as it was.
pub fn raise_fd_limit() -> u64 {
    let Some(lim) = nofile() else { return 0 };
    if lim.rlim_cur < lim.rlim_max {
        let want = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: `want` is a valid rlimit; setrlimit only reads it.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            return want.rlim_cur;
        }
    }
    lim.rlim_cur
}

/// Ask glibc to keep the heap small: one malloc arena for the whole
/// process, and blocks of 128 KiB or more always mapped on their own (so
/// freeing one returns it to the system). Each is left to the
/// administrator when set in the environment (`MALLOC_ARENA_MAX`,
/// `MALLOC_MMAP_THRESHOLD_`). Call before any thread starts.
///
/// glibc gives threads that allocate at the same time arenas of their own
/// (up to eight per core), and memory freed in one arena is never reused
/// by another: the crawl, hashing, writer and share threads each left
/// their own high-water mark. And its mmap threshold grows to the size of
/// the last large block freed, after which the planner's per-batch arrays
/// (megabytes, made and dropped batch after batch) came from the heap,
/// where a small block allocated above them kept the pages. Measured
/// (2 vCPUs): FULL's first full run peaked at 63–65 MB RSS with glibc's
/// defaults, 49.5 MB with one arena (54 MB with two), 44.6 MB with both
/// settings; `report` on a million files 56–60 MB with the defaults or
/// one arena alone, 40 MB with both; run times unchanged. Small
/// allocations are served from glibc's per-thread cache (tcache) without
/// the arena's lock, and the threads allocate a few times per file, not
/// per block, so one arena is no point of contention.
pub fn lean_malloc() {
    #[cfg(target_env = "gnu")]
    {
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            // SAFETY: mallopt only sets an allocator parameter; called
            // before other threads exist.
            unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
        }
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            // SAFETY: as above.
            unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10) };
        }
    }
}

/// Hand the heap's free pages back to the system between phases: what the
/// crawl, hashing and database threads freed lies scattered below blocks
/// still in use, where glibc never returns it on its own, and the plan
/// that follows peaks on top of it.
pub fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory of the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The current soft limit on open file descriptors (0 if unknown).
pub fn fd_limit() -> u64 {
    nofile().map_or(0, |lim| lim.rlim_cur)
}

/// The open-file limits, soft and hard.
fn nofile() -> Option<libc::rlimit> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid, writable rlimit for the kernel to fill.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0).then_some(lim)
}

/// The most memory this process's page cache can hold: the machine's RAM,
/// or less where a memory cgroup (v2 `memory.max` or `memory.high`, as the
/// systemd unit's `MemoryHigh=`; v1 `memory.limit_in_bytes`) of this
/// process or one of its ancestors sets a lower limit. `None` if neither
/// can be read. Only an estimate for choosing how to work, never a bound
/// anything relies on.
pub fn memory_limit() -> Option<u64> {
    let ram = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| mem_total(&t));
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| cgroup_limit(&t, Path::new("/sys/fs/cgroup"), |p| std::fs::read_to_string(p).ok()));
    [ram, cgroup].into_iter().flatten().min()
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The lowest memory limit on the path of this process's cgroup (the text
/// of `/proc/self/cgroup`), from its own cgroup up to the root of the
/// hierarchy mounted at `root`; `read` reads a control file. cgroup v2 (the
/// `0::` line) and v1 (the `memory` controller's line) are both read. An
/// unlimited v2 file says `max`; an unlimited v1 file a number near 2^63,
/// which loses against RAM anyway.
fn cgroup_limit(cgroups: &str, root: &Path, read: impl Fn(&Path) -> Option<String>) -> Option<u64> {
    let mut best: Option<u64> = None;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let (dir, files): (_, &[&str]) = if id == "0" && controllers.is_empty() {
            (root.to_path_buf(), &["memory.max", "memory.high"])
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), &["memory.limit_in_bytes"])
        } else {
            continue;
        };
        let mut cg = Some(Path::new(path.trim_start_matches('/')));
        while let Some(rel) = cg {
            for f in files {
                let limit = read(&dir.join(rel).join(f)).and_then(|t| t.trim().parse::<u64>().ok());
                best = best.into_iter().chain(limit).min();
            }
            cg = rel.parent();
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::PathBuf;

    #[test]
    fn meminfo_total_in_bytes() {
        assert_eq!(mem_total("MemTotal:       24572908 kB\nMemFree: 1 kB\n"), Some(24572908 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn cgroup_limits_lowest_on_the_path_v1_and_v2() {
        let files: HashMap<PathBuf, &str> = [
            ("/cg/system.slice/memory.max", "max\n"),
            ("/cg/system.slice/dedupscan.service/memory.max", "max\n"),
            ("/cg/system.slice/dedupscan.service/memory.high", "1073741824\n"),
            ("/cg/memory.max", "max\n"),
            ("/cg/memory/bench/memory.limit_in_bytes", "536870912\n"),
            ("/cg/memory/memory.limit_in_bytes", "9223372036854771712\n"),
        ]
        .into_iter()
        .map(|(p, t)| (PathBuf::from(p), t))
        .collect();
        let read = |p: &Path| files.get(p).map(|t| t.to_string());
        let root = Path::new("/cg");
        assert_eq!(cgroup_limit("0::/system.slice/dedupscan.service\n", root, read), Some(1 << 30));
        assert_eq!(cgroup_limit("0::/system.slice\n", root, read), None, "max everywhere: no limit");
        assert_eq!(cgroup_limit("7:memory:/bench\n1:name=systemd:/x\n0::/\n", root, read), Some(512 << 20));
        // A parent's limit binds its children.
        assert_eq!(cgroup_limit("7:cpu,memory:/bench/child\n", root, read), Some(512 << 20));
        assert_eq!(cgroup_limit("garbage\n", root, read), None);
    }

    #[test]
    fn memory_limit_is_at_most_ram() {
        let ram = mem_total(&std::fs::read_to_string("/proc/meminfo").unwrap()).unwrap();
        assert!(memory_limit().is_some_and(|m| m <= ram));
    }

    #[test]
    fn the_soft_limit_ends_at_the_hard_limit() {
        let got = super::raise_fd_limit();
        assert_eq!(fd_limit(), got);
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
        assert_eq!(got, lim.rlim_cur);
    }
}
