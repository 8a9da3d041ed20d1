#!/usr/bin/env bash
# benches/slices.sh [--size FULL|SMALL|BYTES] [--cgroup 1G] [--work DIR] BIN [BIN...]
#
# Nightly runs that each add data to a volume already deduplicated: the
# corpus's directories (in the order the scan walks them; one over 1 GiB is
# cut into its subdirectories) are added to the runs one at a time, as new
# backups, images and trees arrive on a server night after night, on a fresh
# copy of one pristine btrfs volume per build. Each run is a default
# (incremental) run over every directory added so far, with one database, so
# it hashes only the new directory and shares it against what earlier runs
# shared. Per run: wall time, the report's phase times, ranges, bytes shared,
# freed, pinned and pending; per build, the total and the freed space
# (statfs) against one full run over everything on another fresh copy.
#
# Found with it (session 47): each run asked btrfs who holds a destination's
# extent once per stretch rather than once per extent, and the stretches of
# extents an earlier run had shared number in the thousands: on FULL the
# seven runs took 470 s against 12 s for one full run.
# Needs root, loop devices, mkfs.btrfs, python3.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

size=FULL limit= work=/var/tmp/dedupscan-slices
bins=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --size) size=$2; shift 2 ;;
    --cgroup) limit=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    -*) echo "slices.sh: unknown option $1" >&2; exit 2 ;;
    *) bins+=("$(realpath "$1")"); shift ;;
    esac
done
[[ ${#bins[@]} -ge 1 && $EUID -eq 0 ]] || { sed -n '2,3p' "$0" >&2; echo "slices.sh: needs root and at least one build" >&2; exit 2; }
MNT=$work/mnt LOOP=
data=$MNT/data
mkdir -p "$MNT"
log() { printf '[slices %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf 'slices.sh: %s\n' "$*" >&2; exit 1; }
. "$HERE/lib.sh"
trap 'umount_vol; cgroup_remove' EXIT
limit_memory "$limit"

pristine_volume btrfs "$size" "$work"

# fresh: a byte-identical copy of the pristine volume, mounted, read once
# to settle, caches dropped.
fresh() {
    rm -f "$work/work.img" && cp --sparse=always --reflink=never "$PRISTINE" "$work/work.img"
    mount_vol btrfs "$work/work.img"
    find "$data" -type f -print0 | xargs -0 -n 32 -P 64 cat >/dev/null
    cold
    rm -f "$work"/run.db*
}
avail() { echo $(($(stat -f -c '%a * %S' "$MNT"))); }
# run BIN LABEL PATH...: one run; prints its line, adds its wall time to $total_ms.
run() {
    local bin=$1 label=$2 t0 ms
    shift 2
    t0=$(date +%s%N)
    "${IN_CG[@]}" "$bin" "$@" --db "$work/run.db" --progress never --json >"$work/report.json" 2>"$work/stderr" ||
        log "$label: exit $? ($(tail -1 "$work/stderr"))"
    ms=$((($(date +%s%N) - t0) / 1000000))
    total_ms=$((total_ms + ms))
    python3 - "$work/report.json" "$label" "$ms" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); t = r["timings"]; M = 2**20
print(f"  {sys.argv[2]:<24} {int(sys.argv[3]) / 1e3:7.2f} s (walk {t['walk_ms'] / 1e3:.2f}, hash {t['hash_ms'] / 1e3:.2f}, "
      f"plan {t['plan_ms'] / 1e3:.2f}, share {t['dedupe_ms'] / 1e3:.2f}) {r['ranges_planned']:7d} ranges, "
      f"shared {r['deduped_bytes'] / M:7.1f} MiB, freed {r['freed_bytes'] / M:7.1f}, pinned {r['pinned_bytes'] / M:5.1f}, "
      f"pending {r['pending_bytes'] / M:6.1f}")
PY
}

for bin in "${bins[@]}"; do
    log "$bin"
    fresh
    dirs=()
    while IFS= read -r d; do dirs+=("$d"); done < <(python3 - "$data" <<'PY'
import os, sys
def size(p):
    return sum(os.lstat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(p) for f in fs)
def cut(p, top):
    for e in os.scandir(p):
        if e.is_dir(follow_symlinks=False):
            if top and size(e.path) > 1 << 30:
                yield from cut(e.path, False)
            else:
                yield e.path
        elif e.is_file(follow_symlinks=False):
            yield e.path
print("\n".join(cut(sys.argv[1], True)))
PY
    )
    before=$(avail) total_ms=0 paths=()
    echo "$bin: ${#dirs[@]} runs, one directory more each"
    for d in "${dirs[@]}"; do
        paths+=("$d")
        run "$bin" "+${d#"$data"/}" "${paths[@]}"
    done
    sync -f "$MNT"
    sliced_ms=$total_ms sliced_freed=$(($(avail) - before))
    umount_vol
    fresh
    before=$(avail) total_ms=0
    run "$bin" "one full run" "$data"
    sync -f "$MNT"
    printf '%s: the runs took %.2f s and freed %.1f MiB; one full run %.2f s, %.1f MiB (statfs)\n' "$bin" \
        "$(echo "$sliced_ms / 1000" | bc -l)" "$(echo "$sliced_freed / 1048576" | bc -l)" \
        "$(echo "$total_ms / 1000" | bc -l)" "$(echo "($(avail) - $before) / 1048576" | bc -l)"
    umount_vol
done
