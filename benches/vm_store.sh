#!/usr/bin/env bash
# An image store whose images are changed in place (running VMs): a thick
# golden image written in one pass (data and written zeros in the same
# extents), clones of it, and every clone then changed in place, 1% of its
# 4 KiB blocks at random. On btrfs the in-place writes split the extents
# into stretches that FIEMAP shows apart (docs/ARCHITECTURE.md, "Bookends").
#
#   benches/vm_store.sh [--fs btrfs|xfs] [--size MIB] [--reflinked N]
#                       [--written N] [--filled] [--changed PCT] [--dry-run]
#                       [--bin PATH]...
#       defaults: btrfs, a 512 MiB image (1 MiB data / 1 MiB zeros), 2
#       reflinked clones (cp --reflink=always) and 1 written copy
#       (cp --reflink=never), 1% of each changed. --filled: the image is written as zeros
#       first, flushed, then its data written in place (made with dd, then
#       installed into: on btrfs its zeros in extents of their own).
#       --dry-run: each build previews too, on the same volume before its
#       run.
#
# Per build, on a fresh volume of the same bytes (seeded): wall time, peak
# RSS, freed (statfs), bytes rewritten and zeros turned into holes (the
# report's), the space the files take after (btrfs: compsize, where
# installed; else the volume's used space) and the distinct non-zero data
# they hold (what an ideal store keeps).
# Every file's SHA-256 is checked after each run. Needs root, python3.
set -euo pipefail
FS=btrfs MIB=512 REFLINKED=2 WRITTEN=1 FILLED=0 DRY=0 CHANGED=1 BINS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --fs) FS=$2; shift 2 ;;
        --size) MIB=$2; shift 2 ;;
        --reflinked) REFLINKED=$2; shift 2 ;;
        --written) WRITTEN=$2; shift 2 ;;
        --filled) FILLED=1; shift ;;
        --changed) CHANGED=$2; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        --bin) BINS+=("$(realpath "$2")"); shift 2 ;;
        -h | --help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=benches/lib.sh
. "$HERE/lib.sh"
default_bins "$HERE/.."
WORK=$(mktemp -d "${BENCH_WORK:-/var/tmp}/vm-store.XXXXXX")
MNT=$WORK/mnt LOOP=
mkdir -p "$MNT"
log() { printf '[vm_store %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf 'vm_store.sh: %s\n' "$*" >&2; exit 1; }
cleanup() { umount_vol; rm -rf "$WORK"; }
trap cleanup EXIT

fresh_volume() {
    umount_vol
    rm -f "$WORK/vol.img"
    truncate -s $((MIB * (2 + REFLINKED + WRITTEN) * 2 + 2048))M "$WORK/vol.img"
    case "$FS" in
        xfs) mkfs.xfs -q -f -m reflink=1 "$WORK/vol.img" ;;
        btrfs) mkfs.btrfs -q -f "$WORK/vol.img" >/dev/null ;;
        *) die "--fs btrfs or xfs" ;;
    esac
    mount_vol "$FS" "$WORK/vol.img"
    mkdir "$MNT/store"
    python3 - "$MNT/store/golden.img" "$MIB" "$FILLED" <<'PY'
import os, random, sys
r, M, n, filled = random.Random(3), 1 << 20, int(sys.argv[2]) // 2, sys.argv[3] == "1"
with open(sys.argv[1], 'wb') as f:
    if filled:
        for _ in range(2 * n):
            f.write(bytes(M))
        f.flush()
        os.fsync(f.fileno())
        for i in range(n):
            f.seek(2 * i * M)
            f.write(r.randbytes(M))
    else:
        for _ in range(n):
            f.write(r.randbytes(M))
            f.write(bytes(M))
    f.flush()
    os.fsync(f.fileno())
PY
    local i names=()
    for i in $(seq 1 "$REFLINKED"); do
        cp --reflink=always "$MNT/store/golden.img" "$MNT/store/clone$i.img"
        names+=("clone$i.img")
    done
    for i in $(seq 1 "$WRITTEN"); do
        cp --reflink=never "$MNT/store/golden.img" "$MNT/store/copy$i.img"
        names+=("copy$i.img")
    done
    sync
    (cd "$MNT/store" && python3 - "$CHANGED" "${names[@]}" <<'PY'
import os, random, sys
for i, name in enumerate(sys.argv[2:]):
    r = random.Random(10 + i)
    fd = os.open(name, os.O_WRONLY)
    blocks = os.fstat(fd).st_size // 4096
    for _ in range(blocks * int(sys.argv[1]) // 100):
        os.pwrite(fd, r.randbytes(4096), r.randrange(blocks) * 4096)
    os.fsync(fd)
    os.close(fd)
PY
    )
    sync
}

# Distinct non-zero 4 KiB blocks of the store, in bytes.
distinct() {
    python3 - "$MNT/store" <<'PY'
import hashlib, os, sys
seen = set()
for name in os.listdir(sys.argv[1]):
    with open(os.path.join(sys.argv[1], name), 'rb') as f:
        while b := f.read(4096):
            if b.count(0) != len(b):
                seen.add(hashlib.sha1(b).digest())
print(len(seen) * 4096)
PY
}

used() { # what the store's files take on disk
    if command -v compsize >/dev/null && [ "$FS" = btrfs ]; then
        compsize -b "$MNT/store" | awk '/^TOTAL/ { printf "%.1f MiB", $3 / 1048576 }'
    else
        df --output=used -B1M "$MNT" | awk 'NR == 2 { print $1 " MiB (the volume, metadata included)" }'
    fi
}

summary() { # LABEL REPORT WALL RSS FREED
    python3 - "$@" <<'PY'
import json, sys
label, path, wall, rss, freed = sys.argv[1:]
r = json.load(open(path))
print(f"{label:34} wall {float(wall):6.2f} s  peak RSS {int(rss) / 1024:6.1f} MiB  "
      f"freed {int(freed) / 2**20:8.1f} MiB  rewritten {r['rewritten_bytes'] / 2**20:7.1f} MiB  "
      f"zeros to holes {r['zeros_to_holes_bytes'] / 2**20:7.1f} MiB  errors {r['errors']}")
PY
}

echo "$FS: a ${MIB} MiB thick image$([ "$FILLED" = 1 ] && echo ", zeros written first"), $REFLINKED reflinked clones, $WRITTEN written copies, $CHANGED% of each changed in place"
for bin in "${BINS[@]}"; do
    fresh_volume
    (cd "$MNT/store" && sha256sum ./*) >"$WORK/manifest"
    [ -n "${DISTINCT:-}" ] || DISTINCT=$(distinct)
    echo "  before: $(used) used"
    if [ "$DRY" = 1 ]; then
        cold
        "$bin" "$MNT/store" --db "$WORK/db.sqlite" -q --json --dry-run >"$WORK/dry.json"
        summary "dedupscan $(basename "$bin") --dry-run" "$WORK/dry.json" 0 0 0
        rm -f "$WORK"/db.sqlite*
    fi
    cold
    f0=$(free_bytes "$FS")
    /usr/bin/time -f '%e %M' -o "$WORK/time" "$bin" "$MNT/store" --db "$WORK/db.sqlite" -q --json >"$WORK/out.json"
    sleep 2
    f1=$(free_bytes "$FS")
    read -r wall rss <"$WORK/time"
    (cd "$MNT/store" && sha256sum --quiet -c "$WORK/manifest") || echo "  CONTENTS CHANGED"
    summary "dedupscan $(basename "$bin")" "$WORK/out.json" "$wall" "$rss" $((f1 - f0))
    echo "  after: $(used) used; distinct non-zero data $((DISTINCT >> 20)) MiB"
    rm -f "$WORK"/db.sqlite*
done
