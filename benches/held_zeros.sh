#!/usr/bin/env bash
# Zeros a read-only snapshot holds, nights in a row (btrfs): an image store
# (N images written in one pass, 1 MiB of data then 1 MiB of zeros, each
# with a reflinked clone) in a subvolume, snapshotted read-only as snapper
# would, the snapshots rotated. Nothing can be freed while a snapshot
# holds the images' extents; once the last one holding them is deleted,
# the space is the zeros'. Per build, on a fresh volume of the same bytes:
#
#   full run, s1 holds  ->  two incremental nights, nothing changed
#   ->  s2 taken, s1 deleted  ->  a night  ->  a night
#   ->  s2 deleted  ->  a night  ->  a night
#
# each with its wall time, freed by the run (statfs), the volume's used
# space after it (statfs: the deletions before it included), zeros turned
# into holes and the pending work the report lists. Every file's SHA-256 is
# checked at the end.
#
#   benches/held_zeros.sh [--images N] [--size MIB] [--share-snapshotted]
#                         [--bin PATH]...
#       defaults: 20 images of 64 MiB; the release build of this tree.
#       --share-snapshotted: every run is given it.
# Needs root, btrfs-progs, python3.
set -euo pipefail
N=20 MIB=64 BINS=() OPTS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --images) N=$2; shift 2 ;;
        --size) MIB=$2; shift 2 ;;
        --share-snapshotted) OPTS+=(--share-snapshotted); shift ;;
        --bin) BINS+=("$(realpath "$2")"); shift 2 ;;
        -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=benches/lib.sh
. "$HERE/lib.sh"
default_bins "$HERE/.."
WORK=$(mktemp -d "${BENCH_WORK:-/var/tmp}/held-zeros.XXXXXX")
MNT=$WORK/mnt LOOP=
mkdir -p "$MNT"
cleanup() { umount_vol; rm -rf "$WORK"; }
trap cleanup EXIT

fresh_volume() {
    umount_vol
    rm -f "$WORK/vol.img"
    truncate -s $((N * MIB * 3 + 2048))M "$WORK/vol.img"
    mkfs.btrfs -q -f "$WORK/vol.img" >/dev/null
    mount_vol btrfs "$WORK/vol.img"
    btrfs -q subvolume create "$MNT/vol"
    python3 - "$MNT/vol" "$N" "$MIB" <<'PY'
import random, sys
d, n, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
M = 1 << 20
for i in range(n):
    r = random.Random(i)
    with open(f"{d}/img{i}", "wb") as f:
        for _ in range(mib // 2):
            f.write(r.randbytes(M))
            f.write(bytes(M))
PY
    local i
    for i in $(seq 0 $((N - 1))); do cp --reflink=always "$MNT/vol/img$i" "$MNT/vol/clone$i"; done
    sync
}

snap() { btrfs -q subvolume snapshot -r "$MNT/vol" "$MNT/$1"; }
del() { btrfs -q subvolume delete "$MNT/$1"; btrfs subvolume sync "$MNT" >/dev/null; }

night() { # LABEL ARGS...
    local label=$1; shift
    local f0 t0 t1 f1 total bsize
    f0=$(free_bytes btrfs)
    t0=$(date +%s.%N)
    "$BIN" --db "$WORK/db" --json "${OPTS[@]}" "$@" "$MNT/vol" >"$WORK/r.json" 2>"$WORK/err" || [ $? -eq 1 ]
    t1=$(date +%s.%N)
    f1=$(free_bytes btrfs)
    read -r total bsize < <(stat -f -c '%b %S' "$MNT")
    python3 - "$label" "$WORK/r.json" "$t0" "$t1" "$f0" "$f1" $((total * bsize - f1)) <<'PY'
import json, sys
label, path, t0, t1, f0, f1, used = sys.argv[1:]
r = json.load(open(path))
pending = ", ".join(f"{k} {v['files']} files {v['bytes'] / 2**20:.1f} MiB" for k, v in r["pending"].items())
print(f"  {label:30} {float(t1) - float(t0):6.2f} s  freed {(int(f1) - int(f0)) / 2**20:7.1f} MiB  "
      f"used {int(used) / 2**20:7.1f} MiB  "
      f"zeros to holes {r['zeros_to_holes_bytes'] / 2**20:7.1f} MiB  pending: {pending or 'none'}")
PY
}

for BIN in "${BINS[@]}"; do
    echo "== $BIN ($("$BIN" --version))"
    fresh_volume
    manifest=$(cd "$MNT/vol" && sha256sum ./* | sort)
    rm -f "$WORK"/db*
    snap s1
    night "full run, s1 holds"
    night "night 1, nothing changed" --incremental
    night "night 2, nothing changed" --incremental
    snap s2
    del s1
    night "night 3, s2 taken, s1 deleted" --incremental
    night "night 4, nothing changed" --incremental
    del s2
    night "night 5, s2 deleted" --incremental
    night "night 6, nothing changed" --incremental
    [ "$(cd "$MNT/vol" && sha256sum ./* | sort)" = "$manifest" ] || { echo "contents changed" >&2; exit 1; }
done
