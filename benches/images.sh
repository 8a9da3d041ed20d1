#!/usr/bin/env bash
# A VM image store: N near-copies of one disk image, each a copy of the
# golden image with 1% of its 4 KiB blocks rewritten (clones that diverged;
# not reflinked, so every block is stored N times). One planning component
# of N × SIZE / 4 KiB blocks: the shape that sets the plan's memory.
#
#   benches/images.sh [--copies N] [--size BYTES] [--fs btrfs|xfs]
#                     [--duperemove] [--bin PATH]...
#       defaults: 4 copies of 1 GiB (1 Mi blocks) on btrfs
#       e.g. --copies 5 --size $((4 << 30))   (5 Mi blocks, ~21 GB of disk)
#   DUPEREMOVE_ARGS="--dedupe-options=partial" adds duperemove flags (by
#   default it compares whole extents: these copies share none).
#
# The golden image is random data, cached in BENCH_WORK (/var/tmp by
# default); the copies are made again, the same bytes each time (seeded),
# on a fresh volume for each binary (and duperemove with --duperemove).
# Prints wall time, peak RSS, dedupscan's phases, freed (statfs)
# against the yardstick (ideal-dup.py), and checks every file's SHA-256.
# Needs root, python3.
set -euo pipefail
COPIES=4 SIZE=$((1 << 30)) FS=btrfs DUPEREMOVE=0 BINS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --copies) COPIES=$2; shift 2 ;;
        --size) SIZE=$2; shift 2 ;;
        --fs) FS=$2; shift 2 ;;
        --duperemove) DUPEREMOVE=1; shift ;;
        --bin) BINS+=("$(realpath "$2")"); shift 2 ;;
        -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=benches/lib.sh
. "$HERE/lib.sh"
default_bins "$HERE/.."
TOOLS=${DEDUPSCAN_TOOLS:-$HERE/../../shared/tools}
BASE=${BENCH_WORK:-/var/tmp}
GOLDEN=$BASE/dedupscan-images-golden-$SIZE.img
if [ ! -e "$GOLDEN.complete" ]; then
    head -c "$SIZE" /dev/urandom >"$GOLDEN"
    touch "$GOLDEN.complete"
fi
WORK=$(mktemp -d "$BASE/dedupscan-images.XXXXXX")
MNT=$WORK/mnt
mkdir "$MNT"
cleanup() { mountpoint -q "$MNT" && umount "$MNT"; rm -rf "$WORK"; }
trap cleanup EXIT
fresh_volume() {
    mountpoint -q "$MNT" && umount "$MNT"
    rm -f "$WORK/vol.img"
    truncate -s $((COPIES * SIZE * 11 / 10 + (1 << 30))) "$WORK/vol.img"
    if [ "$FS" = btrfs ]; then
        mkfs.btrfs -q -f "$WORK/vol.img" >/dev/null
    else
        mkfs.xfs -q -f -m reflink=1 "$WORK/vol.img"
    fi
    mount -o loop "$WORK/vol.img" "$MNT"
    mkdir "$MNT/images"
    for i in $(seq 0 $((COPIES - 1))); do
        cp --reflink=never "$GOLDEN" "$MNT/images/vm$i.img"
        [ "$i" -eq 0 ] && continue
        python3 - "$MNT/images/vm$i.img" "$i" "$SIZE" <<'PY'
import random, sys
path, seed, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(seed)
blocks = size // 4096
with open(path, 'r+b') as f:
    for b in sorted(r.sample(range(blocks), blocks // 100)):
        f.seek(b * 4096)
        f.write(r.randbytes(4096))
PY
    done
    sync
}
one() { # LABEL CMD...
    local label=$1; shift
    fresh_volume
    (cd "$MNT/images" && sha256sum ./*) >"$WORK/manifest"
    [ -n "${IDEAL:-}" ] || IDEAL=$(python3 "$TOOLS/ideal-dup.py" "$MNT/images" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["dup_block_bytes_4k"])')
    local f0 f1
    f0=$(free_bytes "$FS")
    echo 3 >/proc/sys/vm/drop_caches
    /usr/bin/time -f '%e %M' -o "$WORK/time" "$@" >"$WORK/out" 2>"$WORK/err" || echo "  ($label: exit status $?)"
    sleep 2
    f1=$(free_bytes "$FS")
    read -r wall rss <"$WORK/time"
    (cd "$MNT/images" && sha256sum --quiet -c "$WORK/manifest") || echo "  ($label: CONTENTS CHANGED)"
    local phases=-
    if [ "${label%% *}" = dedupscan ]; then
        phases=$(python3 -c 'import json,sys; t = json.load(open(sys.argv[1]))["timings"]
print("%.2f/%.2f/%.2f" % (t["hash_ms"] / 1e3, t["plan_ms"] / 1e3, t["dedupe_ms"] / 1e3))' "$WORK/out")
    fi
    awk -v l="$label" -v w="$wall" -v r="$rss" -v p="$phases" -v f=$((f1 - f0)) -v i="$IDEAL" 'BEGIN {
        printf "%-24s wall %7.2f s (hash/plan/share %s)  peak RSS %7.1f MiB  freed %8.1f MiB = %5.1f%% of ideal\n",
            l, w, p, r / 1024, f / 1048576, 100 * f / i }'
}
echo "$COPIES near-copies of a $((SIZE >> 20)) MiB image ($((COPIES * SIZE / 4096)) blocks), $FS"
for bin in "${BINS[@]}"; do
    one "dedupscan $(basename "$bin")" "$bin" "$MNT/images" --db "$WORK/db.sqlite" -q --json
    rm -f "$WORK"/db.sqlite*
done
if [ "$DUPEREMOVE" = 1 ]; then
    one "duperemove $(duperemove --version 2>&1 | awk '{print $2; exit}')" \
        duperemove -dr --hashfile="$WORK/dr.hash" ${DUPEREMOVE_ARGS:-} "$MNT/images"
fi
echo "ideal: $((IDEAL / 1048576)) MiB"
