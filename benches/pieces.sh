#!/usr/bin/env bash
# Many files holding pieces of one image's extents (btrfs): an image of
# written zeros, and N files each holding 4 KiB of data of its own then
# 64 KiB of the image reflinked in (`FICLONERANGE`), as `cp --reflink` of
# parts or a deduplicator sharing an image's blocks into a tree leaves
# them. Every holder is a file of the run, so every one lets go of its
# zeros and the image's extents are freed. Per build, on a fresh volume of
# the same files: the full run's wall time, the zero pass's questions to
# btrfs of who holds an extent (`LOGICAL_INO`, under strace, a second run
# on another fresh volume), zeros turned into holes (the report, then the
# dry run's preview) and freed (statfs). Every file's SHA-256 is checked.
#
#   benches/pieces.sh [--pieces N] [--bin PATH]...
#       defaults: 1,500 pieces; the release build of this tree.
# Needs root, btrfs-progs, strace, python3.
set -euo pipefail
N=1500 BINS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --pieces) N=$2; shift 2 ;;
        --bin) BINS+=("$(realpath "$2")"); shift 2 ;;
        -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=benches/lib.sh
. "$HERE/lib.sh"
default_bins "$HERE/.."
WORK=$(mktemp -d "${BENCH_WORK:-/var/tmp}/pieces.XXXXXX")
MNT=$WORK/mnt LOOP=
mkdir -p "$MNT"
cleanup() { umount_vol; rm -rf "$WORK"; }
trap cleanup EXIT

# The volume is built once and copied for every run.
truncate -s $((N / 8 + 1024))M "$WORK/pristine.img"
mkfs.btrfs -q -f "$WORK/pristine.img" >/dev/null
mount_vol btrfs "$WORK/pristine.img"
mkdir "$MNT/vol"
python3 - "$MNT/vol" "$N" <<'PY'
import fcntl, os, random, struct, sys
d, n = sys.argv[1], int(sys.argv[2])
piece, ficlonerange = 64 << 10, 0x4020940D
with open(f"{d}/image", "wb") as f:
    f.write(bytes(n * piece))
    os.fsync(f.fileno())
src = os.open(f"{d}/image", os.O_RDONLY)
for i in range(n):
    fd = os.open(f"{d}/piece{i:05}", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, random.Random(i).randbytes(4096))
    fcntl.ioctl(fd, ficlonerange, struct.pack("qQQQ", src, i * piece, piece, 4096))
    os.close(fd)
PY
sync -f "$MNT"
manifest=$(cd "$MNT/vol" && sha256sum ./* | sort)
umount_vol

fresh() {
    umount_vol
    cp --sparse=always "$WORK/pristine.img" "$WORK/vol.img"
    mount_vol btrfs "$WORK/vol.img"
    rm -f "$WORK"/db*
}

for BIN in "${BINS[@]}"; do
    echo "== $BIN ($("$BIN" --version)), $N pieces"
    fresh
    f0=$(free_bytes btrfs)
    t0=$(date +%s.%N)
    "$BIN" --db "$WORK/db" --json "$MNT/vol" >"$WORK/r.json" 2>"$WORK/err"
    t1=$(date +%s.%N)
    f1=$(free_bytes btrfs)
    [ "$(cd "$MNT/vol" && sha256sum ./* | sort)" = "$manifest" ] || { echo "contents changed" >&2; exit 1; }
    fresh
    "$BIN" --db "$WORK/db" --json --dry-run "$MNT/vol" >"$WORK/dry.json" 2>"$WORK/err"
    rm -f "$WORK"/db*
    strace -f -qq -e trace=ioctl -o "$WORK/trace" "$BIN" --db "$WORK/db" --json "$MNT/vol" >/dev/null 2>"$WORK/err"
    asked=$(grep -c BTRFS_IOC_LOGICAL_INO "$WORK/trace" || true)
    python3 - "$WORK/r.json" "$WORK/dry.json" "$t0" "$t1" "$f0" "$f1" "$asked" <<'PY'
import json, sys
path, dry, t0, t1, f0, f1, asked = sys.argv[1:]
r, d = json.load(open(path)), json.load(open(dry))
mib = lambda b: f"{b / 2**20:.1f} MiB"
print(f"  full run {float(t1) - float(t0):6.2f} s (share phase {r['timings']['dedupe_ms'] / 1000:.2f} s)  "
      f"LOGICAL_INO {asked}  zeros to holes {mib(r['zeros_to_holes_bytes'])} "
      f"(preview {mib(d['zeros_to_holes_bytes'])})  freed {mib(int(f1) - int(f0))}")
PY
done
