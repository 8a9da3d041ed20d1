#!/usr/bin/env bash
# benches/generations.sh [--fs btrfs|xfs] BIN [BIN...]
#
# Backup generations arriving a night at a time, on the corpus of
# benches/layouts.py (built by benches/layouts.sh, or here): backup/day1..4
# are moved aside on a fresh volume, a full run shares the rest, then each
# night one day is moved back under backup/ (its files new to the
# database, its extents their own) and the next default run shares it.
# Per build: each night's share phase, ranges, shared, freed (statfs) and
# pending bytes, and what all nights freed (one full run over everything:
# about 1,728 MiB on btrfs).
#
# Found with it (session 51): a build that preferred files earlier runs
# shared from as sources, but still ranked whole-file copies by inode
# alone, left a new generation's copies of unchanged files unshared (XFS:
# 1,735 MiB against 1,742 before the change and 1,745 after the fix).
# Needs root, loop devices, mkfs.btrfs / mkfs.xfs, python3.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
FS=btrfs bins=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --fs) FS=$2; shift 2 ;;
    -*) echo "generations.sh: unknown option $1" >&2; exit 2 ;;
    *) bins+=("$(realpath "$1")"); shift ;;
    esac
done
[[ ${#bins[@]} -ge 1 && $EUID -eq 0 ]] || { sed -n '2,3p' "$0" >&2; echo "generations.sh: needs root and at least one build" >&2; exit 2; }
# shellcheck source=benches/lib.sh
. "$HERE/lib.sh"
layouts_corpus
scratch_dir generations
for bin in "${bins[@]}"; do
    echo "$FS, $bin:"
    mountpoint -q "$MNT" && umount "$MNT"
    rm -f "$WORK/vol.img" "$WORK"/run.db*
    truncate -s 8G "$WORK/vol.img"
    if [ "$FS" = btrfs ]; then mkfs.btrfs -q -f "$WORK/vol.img" >/dev/null; else mkfs.xfs -q -f -m reflink=1 "$WORK/vol.img"; fi
    mount -o loop "$WORK/vol.img" "$MNT"
    cp -a --reflink=never "$TREE" "$MNT/data"
    mkdir "$MNT/aside"
    for d in 1 2 3 4; do mv "$MNT/data/backup/day$d" "$MNT/aside/"; done
    start=$(free_bytes "$FS")
    for n in 0 1 2 3 4; do
        [ "$n" -gt 0 ] && mv "$MNT/aside/day$n" "$MNT/data/backup/"
        a=$(free_bytes "$FS")
        "$bin" "$MNT/data" --db "$WORK/run.db" --progress never --json >"$WORK/report.json" 2>"$WORK/stderr" ||
            echo "  (night $n: exit $?: $(tail -1 "$WORK/stderr"))"
        b=$(free_bytes "$FS")
        python3 - "$WORK/report.json" "$n" "$((b - a))" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); M = 2**20
pending = sum(v["bytes"] for v in r["pending"].values())
print(f"  night {sys.argv[2]}: share {r['timings']['dedupe_ms'] / 1e3:.2f} s, {r['ranges_planned']} ranges, "
      f"shared {r['deduped_bytes'] / M:.1f} MiB, freed {int(sys.argv[3]) / M:.1f} (statfs), pending {pending / M:.1f}")
PY
    done
    echo "  all nights freed $(($(free_bytes "$FS") - start >> 20)) MiB (statfs)"
done
