#!/usr/bin/env bash
# What the weekly run that plans every file again costs (--full-plan-days):
# on a fresh copy of TREE, a full run; a run that finds nothing new; a run
# that plans every file (its settings differ: --rewrite-ratio 1.001, which
# plans the same ranges); one more that finds nothing new. Caches dropped
# before each; wall, peak RSS, ranges planned and submitted, bytes found
# already shared, plan and share times.
#
#   benches/replan.sh TREE [--fs btrfs|xfs] [--bin PATH]
#       e.g. benches/replan.sh /var/tmp/dedupscan-layouts-corpus --fs xfs
#
# Needs root; makes a 10 GiB sparse image under BENCH_WORK (/var/tmp).
set -euo pipefail
TREE= FS=btrfs BIN=
while [ $# -gt 0 ]; do
    case "$1" in
        --fs) FS=$2; shift 2 ;;
        --bin) BIN=$(realpath "$2"); shift 2 ;;
        -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
        -*) echo "unknown argument: $1" >&2; exit 2 ;;
        *) TREE=$(realpath "$1"); shift ;;
    esac
done
[ -n "$TREE" ] || { echo "give the tree to copy" >&2; exit 2; }
cd "$(dirname "$0")/.."
if [ -z "$BIN" ]; then
    cargo build --release -q
    BIN=$PWD/target/release/dedupscan
fi
work=$(mktemp -d "${BENCH_WORK:-/var/tmp}/dedupscan-replan.XXXXXX")
chmod 700 "$work"
mkdir "$work/mnt" "$work/db"
trap 'umount "$work/mnt" 2>/dev/null || true; rm -rf "$work"' EXIT
truncate -s 10G "$work/img"
case "$FS" in
    btrfs) mkfs.btrfs -q -f "$work/img" ;;
    xfs) mkfs.xfs -q -f -m reflink=1 "$work/img" ;;
    *) echo "--fs btrfs or xfs" >&2; exit 2 ;;
esac
mount -o loop "$work/img" "$work/mnt"
cp -a --reflink=never "$TREE" "$work/mnt/c"
step() {
    local name=$1
    shift
    sync
    echo 3 > /proc/sys/vm/drop_caches
    /usr/bin/time -f "%e %M" -o "$work/time" "$BIN" "$work/mnt/c" "$@" --db "$work/db/d.sqlite" \
        --progress never --json > "$work/out.json" 2> "$work/err" || true
    read -r wall rss < "$work/time"
    python3 - "$name" "$wall" "$rss" "$work/out.json" <<'PY'
import json, sys
name, wall, rss, path = sys.argv[1:]
r = json.load(open(path))
t = r["timings"]
print(f"{name:<22} {float(wall):7.2f} s {int(rss):>8} KB  planned {r['ranges_planned']:>7}"
      f"  submitted {r['duplicate_bytes']:>12}  already shared {r['already_shared_bytes']:>12}"
      f"  plan {t['plan_ms'] / 1000:.2f} s  share {t['dedupe_ms'] / 1000:.2f} s")
PY
}
echo "$FS, $(find "$work/mnt/c" -type f | wc -l) files, $BIN"
step "full run"
step "nothing new" --incremental
step "every file planned" --incremental --rewrite-ratio 1.001
step "nothing new again" --incremental --rewrite-ratio 1.001
