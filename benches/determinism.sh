#!/usr/bin/env bash
# benches/determinism.sh [--size SMALL|FULL|BYTES] [--fs btrfs|xfs] [--bin PATH]
#                        [--threads LIST] [--out FILE]
#
# Is the plan a function of the data alone (issue 13)? Builds the corpus of
# benches/corpus.sh once into a fresh loop volume (the *pristine* image),
# then for each hashing-thread count of LIST (default "1 2 8 1 8": five
# runs) copies that image byte for byte (cp --sparse=always), mounts the
# copy at the same place, runs a full `dedupscan` on it with --threads N and
# a new database, and records:
#
#   - the plan, range for range: `dedupscan report --list --json` of that
#     database (source, source offset, destination, destination offset,
#     bytes; paths are the same on every copy), as a sorted list and its
#     SHA-256;
#   - freed bytes (statfs before/after, after sync) and the run's own
#     freed_bytes, against the ideal of ../shared/tools/ideal-dup.py
#     (IDEAL_DUP).
#
# The tests/determinism.rs test checks the same on a small layered tree in
# the suite; this script checks it on the benchmark corpus. Prints one line
# per run and a verdict: every plan equal to the first, freed within 0.2
# points of the ideal. Exit status 0 when both hold, 1 when not.
#
# Needs root, loop devices, mkfs.btrfs / mkfs.xfs, python3. Cleans up on exit.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
size_arg=SMALL fs=btrfs threads="1 2 8 1 8" out=determinism-results.json
bin=${DEDUPSCAN_BIN:-$ROOT/target/release/dedupscan}
while [[ $# -gt 0 ]]; do
    case $1 in
    --size) size_arg=${2:?}; shift 2 ;;
    --fs) fs=${2:?}; shift 2 ;;
    --bin) bin=${2:?}; shift 2 ;;
    --threads) threads=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    -h | --help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "determinism.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
case $size_arg in
SMALL) size=400M ;;
FULL) size=4G ;;
*) size=$size_arg ;;
esac
IDEAL=${IDEAL_DUP:-$ROOT/../shared/tools/ideal-dup.py}
[[ -r $IDEAL ]] || { echo "determinism.sh: $IDEAL not found (set IDEAL_DUP)" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "determinism.sh: needs root (loop mounts)" >&2; exit 2; }

WORK=$(mktemp -d /var/tmp/dedupscan-determinism.XXXXXX)
MNT=$WORK/mnt
mkdir -p "$MNT"
cleanup() {
    mountpoint -q "$MNT" && umount "$MNT"
    rm -rf "$WORK"
}
trap cleanup EXIT
cp "$bin" "$WORK/dedupscan"
bin=$WORK/dedupscan
log() { echo "[determinism $(date +%T)] $*" >&2; }

mkfs_img() {
    truncate -s "$1" "$2"
    case $fs in
    btrfs) mkfs.btrfs -q -f "$2" >"$WORK/mkfs.log" 2>&1 || { cat "$WORK/mkfs.log" >&2; exit 1; } ;;
    xfs) mkfs.xfs -q -f -m reflink=1 "$2" ;;
    *) echo "determinism.sh: --fs btrfs|xfs" >&2; exit 2 ;;
    esac
}

log "building the corpus ($size)"
"$HERE/corpus.sh" "$WORK/corpus" "$size" >/dev/null 2>"$WORK/corpus.log"
bytes=$(du -sb "$WORK/corpus" | cut -f1)
mkfs_img $((bytes * 2 + (1 << 30))) "$WORK/pristine.img"
mount -o loop "$WORK/pristine.img" "$MNT"
cp -a "$WORK/corpus" "$MNT/data"
rm -rf "$WORK/corpus"
python3 "$IDEAL" "$MNT/data" >"$WORK/ideal.json"
umount "$MNT"
ideal=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["dup_block_bytes_4k"])' "$WORK/ideal.json")
log "ideal duplicate bytes: $ideal"

# Free bytes (statfs f_bfree, as compare.sh) after committing everything:
# btrfs releases freed extents at transaction commit.
free_bytes() {
    sync -f "$MNT"
    if [[ $fs == btrfs ]]; then
        btrfs filesystem sync "$MNT" >/dev/null
        sleep 1
        btrfs filesystem sync "$MNT" >/dev/null
    fi
    sync -f "$MNT"
    local free size
    read -r free size < <(stat -f -c '%f %S' "$MNT")
    echo $((free * size))
}

n=0
for t in $threads; do
    n=$((n + 1))
    rm -f "$WORK/copy.img"
    cp --sparse=always --reflink=never "$WORK/pristine.img" "$WORK/copy.img"
    mount -o loop "$WORK/copy.img" "$MNT"
    before=$(free_bytes)
    "$bin" "$MNT/data" --threads "$t" --db "$WORK/db-$n.sqlite" --json --quiet >"$WORK/run-$n.json"
    after=$(free_bytes)
    "$bin" report --db "$WORK/db-$n.sqlite" --list --json >"$WORK/report-$n.json"
    umount "$MNT"
    python3 - "$WORK" "$n" "$t" "$before" "$after" "$ideal" <<'EOF'
import hashlib, json, sys
work, n, t, before, after, ideal = sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:])
ranges = json.load(open(f"{work}/report-{n}.json"))["ranges"]
plan = sorted((r["source"], r["source_offset"], r["destination"], r["destination_offset"], r["bytes"]) for r in ranges)
run = json.load(open(f"{work}/run-{n}.json"))
rec = {
    "run": int(n), "threads": int(t), "ranges": len(plan), "planned_bytes": sum(p[4] for p in plan),
    "plan_sha256": hashlib.sha256(json.dumps(plan).encode()).hexdigest(),
    "freed_statfs": after - before, "freed_report": run["freed_bytes"], "ideal": ideal,
    "duplicate_bytes": run["duplicate_bytes"], "hash_ms": run["timings"].get("hash_ms"),
}
json.dump(rec, open(f"{work}/rec-{n}.json", "w"))
json.dump(plan, open(f"{work}/plan-{n}.json", "w"))
print(f"run {n}: --threads {t}: {rec['ranges']} ranges, {rec['planned_bytes']} planned, plan {rec['plan_sha256'][:16]}, "
      f"freed {rec['freed_statfs']} ({100 * rec['freed_statfs'] / ideal:.2f}% of ideal)")
EOF
done

python3 - "$WORK" "$n" "$out" "$size_arg" "$fs" <<'EOF'
import json, sys
work, n, out, size, fs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
recs = [json.load(open(f"{work}/rec-{i}.json")) for i in range(1, n + 1)]
first = json.load(open(f"{work}/plan-1.json"))
same = all(r["plan_sha256"] == recs[0]["plan_sha256"] for r in recs)
ideal = recs[0]["ideal"]
pts = [100 * r["freed_statfs"] / ideal for r in recs]
spread = max(pts) - min(pts)
for i in range(2, n + 1):
    plan = json.load(open(f"{work}/plan-{i}.json"))
    if plan != first:
        a, b = set(map(tuple, first)), set(map(tuple, plan))
        print(f"run {i}: {len(a - b)} ranges only in run 1, {len(b - a)} only in run {i}")
ok = same and spread <= 0.2
json.dump({"size": size, "fs": fs, "runs": recs, "same_plan": same, "freed_spread_points": spread, "ok": ok},
          open(out, "w"), indent=1)
print(f"{size} {fs}: plans {'identical' if same else 'DIFFER'}; freed {min(pts):.2f}-{max(pts):.2f}% of ideal "
      f"(spread {spread:.2f} points, limit 0.2): {'OK' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
EOF
