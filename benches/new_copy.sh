#!/usr/bin/env bash
# benches/new_copy.sh [--size FULL|SMALL|BYTES] [--fs btrfs|xfs|both] [--work DIR] BIN [BIN...]
#
# A nightly run that meets a new copy of data a first run shared: on a
# fresh copy of one pristine volume per build and filesystem, the corpus's
# vm/ directory is moved aside, a full run shares the rest (the images with
# the trees' files, ...), then the VM image is copied back in as a new file
# (`cp`, not a reflink: a new backup of a changed VM, a re-downloaded
# image) and the next default run shares it. Per build: the first run's and
# the night's wall time, share phase, freed (statfs) and pending bytes.
# The copy differs from the image in 1% of its blocks, so the night should
# free about what the copy has in common with it.
#
# Found with it (session 51): the night freed 36 MiB of 204 on btrfs and
# left 394 MiB pending: it took the new copy as the source and the image,
# whose extent the tree's whole-file copies keep, as a destination.
# Needs root, loop devices, mkfs.btrfs / mkfs.xfs, python3.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
size=FULL fss=both work=/var/tmp/dedupscan-ab
bins=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --size) size=$2; shift 2 ;;
    --fs) fss=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    -*) echo "new_copy.sh: unknown option $1" >&2; exit 2 ;;
    *) bins+=("$(realpath "$1")"); shift ;;
    esac
done
[[ ${#bins[@]} -ge 1 && $EUID -eq 0 ]] || { sed -n '2,3p' "$0" >&2; echo "new_copy.sh: needs root and at least one build" >&2; exit 2; }
[[ $fss == both ]] && fss="btrfs xfs"
MNT=$work/mnt LOOP=
data=$MNT/data
mkdir -p "$MNT"
log() { printf '[new_copy %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf 'new_copy.sh: %s\n' "$*" >&2; exit 1; }
. "$HERE/lib.sh"
trap 'umount_vol' EXIT
# run BIN LABEL: one default run over $data; prints its line.
run() {
    local t0 ms before after
    before=$(free_bytes "$fs")
    t0=$(date +%s%N)
    "$1" "$data" --db "$work/run.db" --progress never --json >"$work/report.json" 2>"$work/stderr" ||
        log "$2: exit $? ($(tail -1 "$work/stderr"))"
    ms=$((($(date +%s%N) - t0) / 1000000))
    after=$(free_bytes "$fs")
    python3 - "$work/report.json" "$2" "$ms" "$((after - before))" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); M = 2**20
pending = sum(v["bytes"] for v in r["pending"].values())
print(f"  {sys.argv[2]:<12} {int(sys.argv[3]) / 1e3:6.2f} s (share {r['timings']['dedupe_ms'] / 1e3:.2f}) "
      f"{r['ranges_planned']:7d} ranges, shared {r['deduped_bytes'] / M:7.1f} MiB, freed {int(sys.argv[4]) / M:7.1f} (statfs), "
      f"pending {pending / M:6.1f}")
PY
}
for fs in $fss; do
    pristine_volume "$fs" "$size" "$work"
    for bin in "${bins[@]}"; do
        echo "$fs, $bin:"
        umount_vol
        rm -f "$work/work.img" && cp --sparse=always --reflink=never "$PRISTINE" "$work/work.img"
        mount_vol "$fs" "$work/work.img"
        rm -f "$work"/run.db*
        mkdir -p "$MNT/aside" && mv "$data/vm" "$MNT/aside/"
        run "$bin" "first run"
        for f in "$MNT"/aside/vm/*; do cp --reflink=never "$f" "$data/images/new-$(basename "$f")"; done
        run "$bin" "the night"
    done
    umount_vol
done
