#!/usr/bin/env bash
# Planning a component too large for memory (issue 14, hold less): an image
# and N near-copies of it written out in full (not reflinked: VM clones
# copied with qemu-img or cp, backups of one image), each with 1% of its
# 4 KiB blocks rewritten. One component of (N + 1) × image blocks; past
# plan::COMPONENT_BLOCKS it is planned in parts (docs/ARCHITECTURE.md).
#
#   benches/near_copies.sh [--copies N] [--image-gib G] [--fs xfs|btrfs]
#                          [--chain] [--budget BLOCKS] [--bin PATH]...
#       defaults: 5 copies of a 3 GiB image on XFS, a star (every copy from
#       the image); --chain: each copy from the one before (blocks the image
#       never held are carried from copy to copy). --budget sets
#       DEDUPSCAN_TEST_COMPONENT_BLOCKS (can only lower the budget).
#       --bin (repeatable): these builds one after the other, each on a
#       fresh volume (the same data: the same seeds), caches dropped.
#
# Per build: a full run under /usr/bin/time (wall time, peak RSS), its
# plan and share times, ranges, freed (statfs), and the ideal
# (../shared/tools/ideal-dup.py when present). Needs root and
# (N + 1) × G + 4 GiB of disk under BENCH_WORK (default /var/tmp); the
# volume is removed on exit.
set -euo pipefail
COPIES=5 GIB=3 FS=xfs CHAIN= BUDGET= BINS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --copies) COPIES=$2; shift 2 ;;
        --image-gib) GIB=$2; shift 2 ;;
        --fs) FS=$2; shift 2 ;;
        --chain) CHAIN=1; shift ;;
        --budget) BUDGET=$2; shift 2 ;;
        --bin) BINS+=("$(realpath "$2")"); shift 2 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
if [ ${#BINS[@]} -eq 0 ]; then
    (cd "$HERE/.." && cargo build --release --quiet)
    BINS=("$(realpath "$HERE/../target/release/dedupscan")")
fi
WORK=$(mktemp -d "${BENCH_WORK:-/var/tmp}/near-copies.XXXXXX")
MNT=$WORK/mnt
cleanup() { umount "$MNT" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
mkdir -p "$MNT"

# Rewrite 1% of the blocks of copy $1 (seeded by its number).
rewrite() {
    python3 - "$GIB" "$1" "$MNT/v/copy$1.img" <<'PY'
import os, random, sys
gib, i, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
blocks = gib << 18
r = random.Random(i)
fd = os.open(path, os.O_WRONLY)
for _ in range(blocks // 100):
    os.pwrite(fd, r.randbytes(4096), r.randrange(blocks) * 4096)
os.close(fd)
PY
}

# A fresh volume with the image and its copies.
volume() {
    umount "$MNT" 2>/dev/null || true
    rm -f "$WORK/vol.img"
    truncate -s $((GIB * (COPIES + 1) + 4))G "$WORK/vol.img"
    case "$FS" in
        xfs) mkfs.xfs -q -f "$WORK/vol.img" ;;
        btrfs) mkfs.btrfs -q -f "$WORK/vol.img" >/dev/null ;;
        *) echo "unknown filesystem: $FS" >&2; exit 2 ;;
    esac
    mount -o loop "$WORK/vol.img" "$MNT"
    mkdir "$MNT/v"
    python3 -c "
import random, sys
r = random.Random(0)
with open('$MNT/v/image.img', 'wb') as f:
    for _ in range($GIB * 256):
        f.write(r.randbytes(4 << 20))"
    local prev=image.img
    for i in $(seq 1 "$COPIES"); do
        cp --reflink=never "$MNT/v/$prev" "$MNT/v/copy$i.img"
        rewrite "$i"
        if [ -n "$CHAIN" ]; then prev=copy$i.img; fi
    done
    sync
    echo 3 > /proc/sys/vm/drop_caches
}

SHAPE=star
[ -n "$CHAIN" ] && SHAPE=chain
IDEAL=$HERE/../../shared/tools/ideal-dup.py
for bin in "${BINS[@]}"; do
    volume
    ideal=
    [ -f "$IDEAL" ] && ideal=$(python3 "$IDEAL" "$MNT/v" | python3 -c 'import json,sys; print(json.load(sys.stdin)["dup_block_bytes_4k"])')
    echo 3 > /proc/sys/vm/drop_caches
    out=$(env ${BUDGET:+DEDUPSCAN_TEST_COMPONENT_BLOCKS=$BUDGET} /usr/bin/time -f "TIME %e %M" \
        "$bin" -v --json --db "$WORK/db.sqlite" "$MNT/v" 2>"$WORK/err") || { cat "$WORK/err" >&2; exit 1; }
    read -r wall rss < <(grep '^TIME' "$WORK/err" | cut -d' ' -f2-)
    echo "$out" | python3 -c "
import json, sys
r = json.load(sys.stdin)
ph = r['timings']
print(f'$bin: $FS, ${COPIES} copies of ${GIB} GiB, $SHAPE, budget ${BUDGET:-default}:',
      f'wall $wall s, peak RSS {$rss / 1000:.1f} MB, plan {ph[\"plan_ms\"] / 1000:.1f} s,',
      f'share {ph[\"dedupe_ms\"] / 1000:.1f} s, {r[\"ranges_planned\"]} ranges,',
      f'freed {r[\"freed_bytes\"] / 2**30:.3f} GiB', '(ideal ${ideal:-?} B)')"
    grep -q "planned in parts" "$WORK/err" && echo "  (planned in parts)"
    rm -f "$WORK"/db.sqlite*
done
