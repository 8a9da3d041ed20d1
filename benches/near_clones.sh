#!/usr/bin/env bash
# Planning what is already shared (issue 14, hold less): an image and N
# reflinked near-copies of it (VM clones that diverged a little), each with
# 32 random 4 KiB blocks rewritten. Nearly every block of every copy shares
# its extent with the image; a good plan costs what the differing blocks
# cost, not what the copies' apparent size does.
#
#   benches/near_clones.sh [--copies N] [--image-mib M] [--fs xfs|btrfs] [--bin PATH]...
#                       defaults: 64 copies of a 1024 MiB image on XFS, this
#                       tree's release build. --bin (repeatable): measure
#                       these binaries one after the other on the same
#                       volume, each with a database of its own.
#
# Each binary runs a cold `--dry-run` under /usr/bin/time: wall time, peak
# RSS, the plan phase and what the report counts as already shared. Needs
# root; the volume lives under /var/tmp (BENCH_WORK) and is removed on exit.
# The image is written once (M MiB of disk); the copies cost their rewritten
# blocks only.
set -euo pipefail
COPIES=64 IMAGE_MIB=1024 FS=xfs BINS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --copies) COPIES=$2; shift 2 ;;
        --image-mib) IMAGE_MIB=$2; shift 2 ;;
        --fs) FS=$2; shift 2 ;;
        --bin) BINS+=("$(realpath "$2")"); shift 2 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
if [ ${#BINS[@]} -eq 0 ]; then
    cargo build --release --quiet
    BINS=("$(realpath target/release/dedupscan)")
fi
WORK=$(mktemp -d "${BENCH_WORK:-/var/tmp}/near-clones.XXXXXX")
MNT=$WORK/mnt
cleanup() { umount "$MNT" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
truncate -s $((IMAGE_MIB * 2 + 1024))M "$WORK/vol.img"
case "$FS" in
    xfs) mkfs.xfs -q -m reflink=1 "$WORK/vol.img" ;;
    btrfs) mkfs.btrfs -q "$WORK/vol.img" ;;
    *) echo "--fs xfs or btrfs" >&2; exit 2 ;;
esac
mkdir "$MNT" && mount -o loop "$WORK/vol.img" "$MNT" && mkdir "$MNT/images"
head -c "${IMAGE_MIB}M" /dev/urandom > "$MNT/images/base.img"
python3 - "$MNT/images" "$COPIES" "$IMAGE_MIB" <<'PY'
import os, random, subprocess, sys
d, n, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(1)
for i in range(n):
    p = f"{d}/vm{i:04d}.img"
    subprocess.run(["cp", "--reflink=always", f"{d}/base.img", p], check=True)
    fd = os.open(p, os.O_WRONLY)
    for _ in range(32):
        os.pwrite(fd, rnd.randbytes(4096), rnd.randrange(mib * 256) * 4096)
    os.close(fd)
PY
sync
echo "$FS: one ${IMAGE_MIB} MiB image and $COPIES reflinked near-copies ($(( (COPIES + 1) * IMAGE_MIB )) MiB apparent)"
for bin in "${BINS[@]}"; do
    rm -f "$WORK"/db*
    sync; echo 3 > /proc/sys/vm/drop_caches
    /usr/bin/time -f "%e %M" -o "$WORK/time" "$bin" "$MNT/images" --db "$WORK/db" --dry-run --json \
        --progress=never > "$WORK/out.json" 2> "$WORK/err" || { cat "$WORK/err" >&2; exit 1; }
    read -r wall rss < "$WORK/time"
    python3 - "$WORK/out.json" "$bin" "$wall" "$rss" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}: wall {sys.argv[3]} s, peak RSS {int(sys.argv[4]) / 1024:.1f} MiB, "
      f"plan {r['timings']['plan_ms'] / 1000:.2f} s, ranges {r['ranges_planned']}, "
      f"already shared {r['already_shared_bytes'] / 2**30:.1f} GiB")
PY
done
