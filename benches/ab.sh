#!/usr/bin/env bash
# benches/ab.sh [--fs btrfs|xfs] [--size FULL|SMALL|BYTES] [--rounds N]
#               [--memory-limit 1G] [--work DIR] BIN_A BIN_B [BIN...]
#
# A/B timing of dedupscan builds on one corpus, the way the 2-core machines
# need it (docs/BENCHMARKS.md): one pristine volume with the corpus, and for
# every run a fresh byte-identical copy of it (cp --sparse=always), read once
# to settle (on a loop device with direct I/O, as compare.sh), caches
# dropped, then the raw read (cat, 64 readers) and, caches
# dropped again, one full run of one build, on that same copy. Builds are
# alternated round by round, so a slow spell of the disk hits them alike;
# each run prints full / raw of its own copy (the spread between copies is
# often larger than the difference between builds: compare medians).
#
# Per run: full/raw, the phase times of the report, freed bytes (statfs),
# bytes the run read from the volume (the loop device's counter: the scan's
# read and the share phase's rereads) and user/sys CPU; at the end, the
# medians per build. Extra arguments for every run go after `--`. With
# --memory-limit both the raw read and the run are in a memory cgroup (v2,
# or v1 where that is what the machine has).
# Needs root, loop devices, mkfs.<fs>, /usr/bin/time, python3.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

fs=btrfs size=FULL rounds=3 limit= work=/var/tmp/dedupscan-ab
bins=() extra=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --fs) fs=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --memory-limit) limit=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -*) echo "ab.sh: unknown option $1" >&2; exit 2 ;;
    *) bins+=("$(realpath "$1")"); shift ;;
    esac
done
[[ ${#bins[@]} -ge 1 && $EUID -eq 0 ]] || { sed -n '2,4p' "$0" >&2; echo "ab.sh: needs root and at least one build" >&2; exit 2; }
MNT=$work/mnt LOOP=
data=$MNT/data
mkdir -p "$MNT"
log() { printf '[ab %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf 'ab.sh: %s\n' "$*" >&2; exit 1; }
# limit_memory/cgroup_remove, pristine_volume, cold, mount_vol/umount_vol (lib.sh).
. "$HERE/lib.sh"
# readall [PREFIX...]: read every file of the copy (64 readers), run by PREFIX.
readall() { "$@" sh -c 'cd "$0" && find . -type f -print0 | xargs -0 -n 32 -P 64 cat >/dev/null' "$data"; }
cleanup() {
    umount_vol
    cgroup_remove
}
trap cleanup EXIT

limit_memory "$limit"

pristine_volume "$fs" "$size" "$work"

results=$work/results-$$.tsv
: >"$results"
for ((round = 1; round <= rounds; round++)); do
    for bin in "${bins[@]}"; do
        rm -f "$work/work.img" && cp --sparse=always --reflink=never "$PRISTINE" "$work/work.img"
        mount_vol "$fs" "$work/work.img"
        readall && cold
        t0=$(date +%s%N) && readall "${IN_CG[@]}"
        raw=$(($(date +%s%N) - t0)) && cold
        rm -f "$work"/run.db*
        # Bytes the run reads from the volume (the loop device's counter):
        # the scan's one read of the data, and whatever the share phase
        # reads again.
        dev=/sys/block/$(basename "$LOOP")/stat
        r0=$(awk '{print $3}' "$dev")
        t0=$(date +%s%N)
        "${IN_CG[@]}" /usr/bin/time -o "$work/cpu" -f '%U %S' "$bin" "$data" --db "$work/run.db" --json \
            --progress never "${extra[@]}" >"$work/report.json" 2>"$work/stderr" || log "$bin: exit $?"
        full=$(($(date +%s%N) - t0))
        read_mib=$((($(awk '{print $3}' "$dev") - r0) / 2048))
        umount_vol
        python3 - "$work/report.json" "$raw" "$full" "$bin" "$(cat "$work/cpu")" "$read_mib" >>"$results" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1])); t = r["timings"]; raw, full = int(sys.argv[2]) / 1e9, int(sys.argv[3]) / 1e9
print("\t".join(map(str, [sys.argv[4], round(full / raw, 3), round(raw, 2), round(full, 2), t["hash_ms"] / 1e3,
      t["plan_ms"] / 1e3, t["dedupe_ms"] / 1e3, r["freed_bytes"], sys.argv[5], sys.argv[6]])))
EOF
        tail -1 "$results" | awk -F'\t' '{printf "%s: full/raw %.3f (raw %.2f s, full %.2f s: hash %.2f, plan %.2f, share %.2f), freed %.1f MiB, read %d MiB, cpu %s\n", $1, $2, $3, $4, $5, $6, $7, $8 / 1048576, $10, $9}'
    done
done
echo "medians over $rounds rounds ($fs, $size${limit:+, memory limit $limit}):"
python3 - "$results" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
for b in dict.fromkeys(r[0] for r in rows):
    m = [statistics.median(float(r[k]) for r in rows if r[0] == b) for k in (*range(1, 8), 9)]
    print(f"  {b}: full/raw {m[0]:.3f}, raw {m[1]:.2f} s, full {m[2]:.2f} s (hash {m[3]:.2f}, plan {m[4]:.2f}, share {m[5]:.2f}), freed {m[6] / 2**20:.1f} MiB, read {m[7]:.0f} MiB")
EOF
