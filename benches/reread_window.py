#!/usr/bin/env python3
"""benches/reread_window.py TREE [--order walk|size]

How far apart the two copies of each duplicate block are read, in bytes
read between them: what a share phase that shares each range right after
hashing it, while the earlier copy is still in the page cache, would save
(issue 14; docs/BENCHMARKS.md, session 47).

Reads every regular file of TREE (depth-first, in readdir order, as the
scan walks; or, with --order size, largest file first, files of one size
side by side, as a size-ordered scan would), hashes its 4 KiB blocks, and
for each block seen before (zeros left out: they become holes, never
shared) records the bytes read since its latest earlier copy. Prints, for
windows of 64 MiB to 2 GiB, the share of duplicate bytes whose earlier copy
was read at most that long before, and how much of it lies in whole-file
copies. A window must fit in the page cache the run may hold (under a 1
GiB memory cgroup: a few hundred MiB beside the run's own memory).

Needs only python3; reads the whole tree once (about 15 s for the 4.3 GiB
FULL corpus on a loop device).
"""
import hashlib
import os
import sys

BLOCK = 4096
WINDOWS = (64 << 20, 256 << 20, 512 << 20, 768 << 20, 1 << 30, 2 << 30)


def walk(d):
    """Regular files below `d`, depth-first, in readdir order."""
    try:
        entries = list(os.scandir(d))
    except OSError:
        return
    for e in entries:
        if e.is_file(follow_symlinks=False):
            yield e.path
        elif e.is_dir(follow_symlinks=False):
            yield from walk(e.path)


def main():
    args = sys.argv[1:]
    order = "walk"
    if "--order" in args:
        i = args.index("--order")
        order = args[i + 1]
        del args[i : i + 2]
    if len(args) != 1 or order not in ("walk", "size"):
        sys.exit(__doc__.split("\n\n")[0])
    files = list(walk(args[0]))
    if order == "size":
        files.sort(key=lambda p: -os.lstat(p).st_size)
    zero = hashlib.sha1(bytes(BLOCK)).digest()
    latest = {}  # block digest -> where its latest copy was read
    whole_seen = set()  # digests of whole files read
    dist = []  # (bytes read since the earlier copy, in a whole-file copy)
    pos = 0
    for p in files:
        try:
            with open(p, "rb") as f:
                data = f.read()
        except OSError:
            continue
        digest = hashlib.sha1(data).digest()
        whole = len(data) >= BLOCK and digest in whole_seen
        whole_seen.add(digest)
        for o in range(0, len(data) - BLOCK + 1, BLOCK):
            h = hashlib.sha1(data[o : o + BLOCK]).digest()
            if h == zero:
                continue
            if h in latest:
                dist.append((pos + o - latest[h], whole))
            latest[h] = pos + o
        pos += len(data)
    total = len(dist) * BLOCK or 1
    whole_total = sum(w for _, w in dist) * BLOCK
    print(f"{args[0]} ({order} order): read {pos / 2**30:.2f} GiB, duplicate blocks "
          f"{total / 2**20:.0f} MiB ({whole_total / 2**20:.0f} MiB in whole-file copies)")
    for w in WINDOWS:
        near = sum(1 for d, _ in dist if d <= w) * BLOCK
        near_whole = sum(1 for d, wh in dist if d <= w and wh) * BLOCK
        print(f"  earlier copy within {w >> 20:5d} MiB: {near / 2**20:7.0f} MiB = "
              f"{100 * near / total:5.1f}% (whole-file copies {near_whole / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
