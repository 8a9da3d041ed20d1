#!/usr/bin/env bash
# Peak memory with 1,000,000 small files (issue: RSS must stay <= 512 MB).
#
#   benches/million.sh [FILES]      default 1000000
#
# Creates a loop-mounted XFS volume under /var/tmp, fills it with FILES small
# files (100 B - 4 KiB, one in five a duplicate) in 1000 directories, then
# runs under /usr/bin/time -v: a full run (scan, plan, share), an
# incremental no-change run, and `report`. Prints wall time and peak RSS of
# each, and the database size. Cleans up on exit. Needs root.
set -euo pipefail
n=${1:-1000000}
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin dedupscan
bin=$PWD/target/release/dedupscan
work=$(mktemp -d /var/tmp/dedupscan-million.XXXXXX)
cleanup() { mountpoint -q "$work/mnt" && umount "$work/mnt"; rm -rf "$work"; }
trap cleanup EXIT
mkdir "$work/mnt"
truncate -s 8G "$work/vol.img"
mkfs.xfs -q -m reflink=1 -i maxpct=50 "$work/vol.img"
mount -o loop "$work/vol.img" "$work/mnt"
echo "creating $n files..."
python3 - "$work/mnt/files" "$n" <<'PY'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
r = random.Random(1)
made = []
for i in range(n):
    d = os.path.join(root, "d%03d" % (i % 1000))
    if i < 1000:
        os.makedirs(d)
    if made and r.random() < 0.2:
        data = made[r.randrange(len(made))]
    else:
        data = r.randbytes(100 + r.randrange(4000))
        if len(made) < 10000:
            made.append(data)
    with open(os.path.join(d, "f%07d" % i), "wb") as f:
        f.write(data)
PY
sync
measure() {
  local label=$1; shift
  sync; echo 3 > /proc/sys/vm/drop_caches
  /usr/bin/time -v "$@" > "$work/out.txt" 2> "$work/time.txt" || true
  local rss wall
  rss=$(awk -F': ' '/Maximum resident/ {print $2}' "$work/time.txt")
  wall=$(awk -F': ' '/Elapsed \(wall/ {print $2}' "$work/time.txt")
  printf '%-28s wall %-10s peak RSS %6d MB\n' "$label" "$wall" $((rss / 1024))
}
db=$work/db.sqlite
measure "full run ($n files)" "$bin" "$work/mnt/files" --db "$db" --progress never -q
measure "incremental, no change" "$bin" "$work/mnt/files" --db "$db" --incremental --progress never -q
measure "report" "$bin" report --db "$db"
printf 'database: %d MB for %d files\n' $(( $(stat -c %s "$db") / 1048576 )) "$n"
