#!/usr/bin/env bash
# Freed space on a corpus laid out unlike FULL's (benches/layouts.py: backup
# generations, rotated logs, pages repeated inside a database, shifted layers,
# many copies of one file, scattered single blocks, reordered blocks, a block
# vocabulary, truncated copies), on setups FULL does not
# use: different XFS block sizes, btrfs with compress-force.
#
#   benches/layouts.sh [--fs btrfs|xfs] [--mkfs-opts "..."] [--mount-opts "..."]
#                      [--duperemove] [--bin PATH]... [--corpus DIR]
#                      [--memory-limit SIZE]
#       e.g. --fs xfs --mkfs-opts "-b size=65536"   (XFS with 64 KiB blocks)
#            --fs btrfs --mount-opts compress-force=zstd
#
# Builds the corpus once (cached in BENCH_WORK, /var/tmp by default), or
# takes --corpus DIR (another tree, e.g. benches/farm.py's), prints the
# yardstick per part (ideal-dup.py), then for each binary (and duperemove
# with --duperemove) on a fresh volume: wall time, peak RSS, freed (statfs)
# and freed / ideal, and what is left stored twice (remaining-dup.py). Each
# run's contents are checked against the corpus (SHA-256 of every file).
# With --memory-limit (such as 1G) a cold raw read of the corpus (cat, 16
# readers) is timed first, and every timed step runs in a memory cgroup of
# that size (v2 or v1; page cache is charged to it), as compare.sh's.
# Needs root, python3; ~6 GB of sparse image, ~2 GB written per run.
set -euo pipefail
FS=btrfs MKFS_OPTS= MOUNT_OPTS= DUPEREMOVE=0 BINS=() CORPUS= LIMIT=
while [ $# -gt 0 ]; do
    case "$1" in
        --fs) FS=$2; shift 2 ;;
        --mkfs-opts) MKFS_OPTS=$2; shift 2 ;;
        --mount-opts) MOUNT_OPTS=$2; shift 2 ;;
        --duperemove) DUPEREMOVE=1; shift ;;
        --bin) BINS+=("$(realpath "$2")"); shift 2 ;;
        --corpus) CORPUS=$(realpath "$2"); shift 2 ;;
        --memory-limit) LIMIT=$2; shift 2 ;;
        -h | --help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=benches/lib.sh
. "$HERE/lib.sh"
default_bins "$HERE/.."
TOOLS=${DEDUPSCAN_TOOLS:-$HERE/../../shared/tools}
if [ -n "$CORPUS" ]; then TREE=$CORPUS; else layouts_corpus; fi
scratch_dir layouts
LOOP=
log() { echo "layouts.sh: $*" >&2; }
die() { log "$@"; exit 1; }
limit_memory "$LIMIT"
trap 'umount_vol; cgroup_remove; rm -rf "$WORK"' EXIT
(cd "$TREE" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$WORK/manifest"
echo "yardstick (ideal-dup.py, 4 KiB):"
for part in "$TREE"/*/; do
    printf '  %-10s %s\n' "$(basename "$part")" "$(python3 "$TOOLS/ideal-dup.py" "$part")"
done
ideal=$(python3 "$TOOLS/ideal-dup.py" "$TREE" | python3 -c 'import json,sys; print(json.load(sys.stdin)["dup_block_bytes_4k"])')
one() { # LABEL CMD...
    local label=$1; shift
    umount_vol
    rm -f "$WORK/vol.img"
    truncate -s 6G "$WORK/vol.img"
    if [ "$FS" = btrfs ]; then
        mkfs.btrfs -q -f $MKFS_OPTS "$WORK/vol.img" >/dev/null
    else
        mkfs.xfs -q -f -m reflink=1 $MKFS_OPTS "$WORK/vol.img"
    fi
    # A loop device with direct I/O, as compare.sh's: read through the
    # host's page cache, 16 readers at once took 1.2-1.4 times as long as
    # 4 (benches/farm.py's corpus), which is the loop driver's, not a disk's.
    attach "$WORK/vol.img"
    mount ${MOUNT_OPTS:+-o "$MOUNT_OPTS"} "$LOOP" "$MNT"
    cp -a --reflink=never "$TREE" "$MNT/data"
    local f0 f1
    # Settle the fresh copy first: its writeback must not land in the run.
    sync
    f0=$(free_bytes "$FS")
    echo 3 >/proc/sys/vm/drop_caches
    /usr/bin/time -f '%e %M' -o "$WORK/time" "${IN_CG[@]}" "$@" >"$WORK/out" 2>"$WORK/err" || echo "  ($label: exit status $?)"
    sleep 2
    f1=$(free_bytes "$FS")
    read -r wall rss <"$WORK/time"
    (cd "$MNT/data" && sha256sum --quiet -c "$WORK/manifest") || echo "  ($label: CONTENTS CHANGED)"
    local left
    left=$(python3 "$TOOLS/remaining-dup.py" "$MNT/data" | python3 -c 'import json,sys; print(json.load(sys.stdin)["remaining_dup_bytes"])')
    awk -v l="$label" -v w="$wall" -v r="$rss" -v f=$((f1 - f0)) -v i="$ideal" -v left="$left" 'BEGIN {
        printf "%-28s wall %7.2f s  peak RSS %6.1f MiB  freed %8.1f MiB = %5.1f%% of ideal  still twice %7.1f MiB\n",
            l, w, r / 1024, f / 1048576, 100 * f / i, left / 1048576 }'
}
echo "ideal: $((ideal / 1048576)) MiB; $FS${MKFS_OPTS:+ (mkfs $MKFS_OPTS)}${MOUNT_OPTS:+ (mount $MOUNT_OPTS)}${LIMIT:+ (memory cgroup $LIMIT)}"
if [ -n "$LIMIT" ]; then
    one "raw read (cat, 16 readers)" sh -c 'cd "$1" && find . -type f -print0 | xargs -0 -n 32 -P 16 cat >/dev/null' raw "$MNT/data"
fi
for bin in "${BINS[@]}"; do
    one "dedupscan $(basename "$bin")" "$bin" "$MNT/data" --db "$WORK/db.sqlite" -q
    rm -f "$WORK"/db.sqlite*
done
if [ "$DUPEREMOVE" = 1 ]; then
    one "duperemove $(duperemove --version 2>&1 | awk '{print $2; exit}')" \
        duperemove -dr --hashfile="$WORK/dr.hash" "$MNT/data"
fi
