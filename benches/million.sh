#!/usr/bin/env bash
# Memory and time with millions of small files (issue 14: peak RSS <= 256 MB
# for the full run, the no-change --incremental run and `report`; the
# no-change --incremental run <= 0.8x a cold `find`; database <= 60 bytes per
# file plus the block data).
#
#   benches/million.sh [FILES] [--fs xfs|btrfs] [--bin PATH]... [--keep | --reuse DIR]
#                      [--max-file BYTES] [--xfs-block BYTES] [--hardlinks K]
#                       FILES default 1000000; 10M / 10000000 for the big run.
#                       --max-file: files of 100 B up to about BYTES (4K);
#                       --xfs-block: the XFS block size (4K). 10M files with
#                       `--max-file 1K --xfs-block 1K` need ~16 GB of disk
#                       instead of ~45 GB.
#                       --hardlinks K: a backup target made by rsnapshot:
#                       K hard-linked copies of the tree (cp -al, made once,
#                       kept with the volume), every file K+1 names; then
#                       measures instead a scan of every name, a scan of
#                       one copy (each file kept out of the plan: one name
#                       seen) and `report` of that.
#                       --bin (repeatable): measure these binaries instead of
#                       this tree's release build, one after the other on
#                       the same files, each with a database of its own (A/B;
#                       a later full run finds the files already shared).
#                       --keep: leave the volume (image and mount) in place
#                       and print its directory; --reuse DIR: measure on such
#                       a kept volume instead of creating one (10M files take
#                       20+ minutes to create; binaries built later can be
#                       measured on the same files).
#
# Creates a loop-mounted volume under /var/tmp (BENCH_WORK), fills it with
# FILES small files (100 B - 4 KiB, a third of them a copy of an earlier
# one) in directories of 1000, then runs under /usr/bin/time -v, page cache
# dropped before each: a cold `find` of size/mtime/ctime/inode, a full run
# (scan, plan, share), an incremental no-change run, and `report`. Prints
# wall time and peak RSS of each, the incremental/find ratio and the
# database size per file. Cleans up on exit. Needs root, python3.
#
# Disk: every file takes a 4 KiB block on XFS (10M files: ~45 GB of the
# sparse image is written); btrfs keeps files under 2 KiB inline in its
# metadata (10M files: ~15 GB). Creating 10M files takes 10-20 minutes.
set -euo pipefail
n=1000000 fs=xfs bins=() keep=0 reuse= max_file=4096 xfs_block=4096 hardlinks=0
while [ $# -gt 0 ]; do
  case $1 in
    --fs) fs=${2:?}; shift ;;
    --bin) bins+=("$(realpath "${2:?}")"); shift ;;
    --keep) keep=1 ;;
    --max-file) max_file=$(numfmt --from=iec "${2:?}"); shift ;;
    --xfs-block) xfs_block=$(numfmt --from=iec "${2:?}"); shift ;;
    --reuse) reuse=$(realpath "${2:?}"); shift ;;
    --hardlinks) hardlinks=${2:?}; shift ;;
    -h | --help) sed -n '2,40p' "$0"; exit 0 ;;
    *) n=$(numfmt --from=si "$1") ;;
  esac
  shift
done
case $fs in xfs | btrfs) ;; *) echo "million.sh: --fs xfs or btrfs" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
if [ ${#bins[@]} -eq 0 ]; then
  cargo build --release --quiet --bin dedupscan
  bins=("$PWD/target/release/dedupscan")
fi
if [ -n "$reuse" ]; then
  work=$reuse
  n=$(cat "$work/files.count")
  fs=$(cat "$work/fs")
  mountpoint -q "$work/mnt" || mount -o loop "$work/vol.img" "$work/mnt"
  trap 'echo "volume kept: --reuse $work"' EXIT
else
  work=$(mktemp -d "${BENCH_WORK:-/var/tmp}/dedupscan-million.XXXXXX")
  cleanup() { mountpoint -q "$work/mnt" && umount "$work/mnt"; rm -rf "$work"; }
  if [ "$keep" = 1 ]; then
    trap 'echo "volume kept: --reuse $work"' EXIT
  else
    trap cleanup EXIT
  fi
  mkdir "$work/mnt"
  # Room for every file's block (XFS) or inline item (btrfs), and the inodes.
  per_file_kib=$(( (max_file + xfs_block - 1) / xfs_block * xfs_block / 1024 + 2 ))
  [ "$fs" = btrfs ] && per_file_kib=3
  truncate -s $((n * per_file_kib / 1024 + 2048))M "$work/vol.img"
  case $fs in
    xfs) mkfs.xfs -q -m reflink=1 -i maxpct=50 -b size="$xfs_block" "$work/vol.img" ;;
    btrfs) mkfs.btrfs -q "$work/vol.img" >/dev/null ;;
  esac
  mount -o loop "$work/vol.img" "$work/mnt"
  echo "creating $n files on $fs..."
  python3 - "$work/mnt/files" "$n" "$max_file" <<'PY'
import os, random, sys
root, n, max_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(1)
made = []
for i in range(n):
    d = os.path.join(root, "d%05d" % (i // 1000))
    if i % 1000 == 0:
        os.makedirs(d)
    if made and r.random() < 1 / 3:
        data = made[r.randrange(len(made))]
    else:
        data = r.randbytes(100 + r.randrange(max_file - 96))
        if len(made) < 10000:
            made.append(data)
    with open(os.path.join(d, "f%08d" % i), "wb") as f:
        f.write(data)
PY
  echo "$n" > "$work/files.count"
  echo "$fs" > "$work/fs"
fi
for k in $(seq 1 "$hardlinks"); do
  [ -d "$work/mnt/snap.$k" ] || { echo "cp -al files snap.$k"; cp -al "$work/mnt/files" "$work/mnt/snap.$k"; }
done
sync
secs() { awk -F': ' '/Elapsed \(wall/ {n = split($2, t, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + t[i]; print s}' "$1"; }
measure() {
  local label=$1; shift
  sync; echo 3 > /proc/sys/vm/drop_caches
  /usr/bin/time -v "$@" > "$work/out.txt" 2> "$work/time.txt" || echo "($label: exit status $?)"
  local rss
  rss=$(awk -F': ' '/Maximum resident/ {print $2}' "$work/time.txt")
  last=$(secs "$work/time.txt")
  printf '%-30s wall %8.2f s   peak RSS %6d MB\n' "$label" "$last" $((rss / 1024))
}
measure "cold find ($n files)" sh -c 'find "$1" -type f -printf "%s %T@ %C@ %i\n" > /dev/null' sh "$work/mnt/files"
find_s=$last
if [ "$hardlinks" -gt 0 ]; then
  for bin in "${bins[@]}"; do
    echo "== $bin ($n files, $((hardlinks + 1)) names each)"
    db=$work/db-$RANDOM.sqlite
    measure "scan, every name" "$bin" scan "$work/mnt" --db "$db" --progress never -q
    rm -f "$db"*
    measure "scan, one copy" "$bin" scan "$work/mnt/files" --db "$db" --progress never -q
    measure "report" "$bin" report --db "$db"
    rm -f "$db"*
  done
  exit 0
fi
for bin in "${bins[@]}"; do
  echo "== $bin"
  db=$work/db-$RANDOM.sqlite
  measure "full run" "$bin" "$work/mnt/files" --db "$db" --progress never -q
  measure "incremental, no change" "$bin" "$work/mnt/files" --db "$db" --incremental --progress never -q
  awk -v a="$last" -v b="$find_s" 'BEGIN {printf "incremental / cold find: %.2fx\n", a / b}'
  measure "report" "$bin" report --db "$db"
  bytes=$(( $(stat -c %s "$db") + $(stat -c %s "$db-wal" 2>/dev/null || echo 0) ))
  printf 'database: %d MB for %d files, %d bytes per file\n' $((bytes / 1048576)) "$n" $((bytes / n))
  # The criterion is per file *plus the block data*: the maps' own bytes
  # (6 a block since schema v11), read with Python's sqlite3 if present.
  if command -v python3 >/dev/null; then
    python3 - "$db" "$bytes" "$n" <<'PY'
import sqlite3, sys
db, total, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
maps = c.execute("SELECT coalesce(sum(length(blocks)), 0) FROM files WHERE typeof(blocks) = 'blob'").fetchone()[0]
print(f"block data: {maps} bytes ({maps / n:.1f} per file); the rest: {(total - maps) / n:.1f} bytes per file")
PY
  fi
done
