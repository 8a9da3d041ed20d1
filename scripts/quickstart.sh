#!/usr/bin/env bash
# Build dedupscan and run it.
#
#   scripts/quickstart.sh PATH    preview (--dry-run) on PATH, then ask on the terminal
#                                 before sharing; without a terminal (cron, a pipe, ssh
#                                 without -t) nothing is shared unless --yes is given
#   scripts/quickstart.sh --yes PATH   preview, then share without asking
#   scripts/quickstart.sh         no path: create a demo XFS and a demo btrfs volume
#                                 (loop-mounted images under /var/tmp) filled with
#                                 duplicated data, run a dry run and a real run on
#                                 each, compare with the ideal, clean up
set -euo pipefail
orig=$PWD # a relative PATH is relative to where the script was started
cd "$(dirname "$0")/.."
. scripts/deps.sh
# --yes (anywhere among the arguments) is the script's own; the rest goes
# to dedupscan.
yes=0 args=()
for a in "$@"; do
  case $a in --yes | -y) yes=1 ;; *) args+=("$a") ;; esac
done
set -- ${args[@]+"${args[@]}"}
if [ -n "${DEDUPSCAN_BIN:-}" ] && [ $# -gt 0 ]; then
  bin=$DEDUPSCAN_BIN # a binary already built (tests/ops.rs)
else
  # The first build takes minutes (longer with Debian's cargo on 2 cores):
  # cargo's own "Compiling ..." lines are the progress display.
  echo "== building dedupscan (release)" >&2
  # Only the binary: the demo's files are written by Python below, so the
  # build does not pull in the test-only dependencies (an example would).
  cargo build --release --bin dedupscan
  bin=${CARGO_TARGET_DIR:-$PWD/target}/release/dedupscan
fi

if [ $# -gt 0 ]; then
  cd "$orig"
  echo "== preview: $bin $* --dry-run (changes nothing)" >&2
  # 1: some paths had errors (listed above); the rest can still be shared.
  rc=0
  "$bin" "$@" --dry-run || rc=$?
  [ $rc = 0 ] || [ $rc = 1 ] || exit $rc
  if [ $yes = 0 ]; then
    if [ ! -t 0 ]; then
      echo "quickstart: nothing shared: no terminal to ask (stdin is not a terminal)." \
           "To share without asking: $0 --yes $*" >&2
      exit 0
    fi
    ok=
    read -r -p "Share these ranges now? [y/N] " ok || true
    case $ok in
      y | Y | yes | YES | Yes) ;;
      *) echo "quickstart: nothing shared." >&2; exit 0 ;;
    esac
  fi
  echo "== sharing: $bin $*" >&2
  exec "$bin" "$@"
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "the demo mounts loop volumes and needs root: sudo $0 (or give a PATH on btrfs/XFS you own)" >&2
  exit 1
fi
# The demo's files (~90 MiB, the same every time): whole-file copies, a copy
# shifted by one block, two files sharing their first half, a VM image and
# a copy with 2% of its blocks changed, a sparse file and its copy, and
# unique files.
demo_corpus() {
  python3 - "$1" <<'PY'
import os, random, sys
root, r = sys.argv[1], random.Random(1)
def put(rel, data):
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, 'wb') as f:
        f.write(data)
for i in range(8):                                   # whole-file copies
    data = r.randbytes(r.randrange(4096, 3 << 20))
    for copy in 'abc':
        put(f'whole/{copy}/file{i}.bin', data)
orig = r.randbytes(4 << 20)                          # shifted by one block
put('shifted/original.bin', orig)
put('shifted/shifted.bin', r.randbytes(4096) + orig)
half = r.randbytes(2 << 20)                          # shared first half
put('partial/first.bin', half + r.randbytes(2 << 20))
put('partial/second.bin', half + r.randbytes(2 << 20))
img = bytearray(r.randbytes(16 << 20))               # VM image pair
put('images/vm-monday.img', bytes(img))
for _ in range(len(img) // 4096 // 50):
    b = r.randrange(len(img) // 4096) * 4096
    img[b:b + 4096] = r.randbytes(4096)
put('images/vm-tuesday.img', bytes(img))
island = r.randbytes(256 << 10)                      # sparse disk images
for n in ('disk1.raw', 'disk2.raw'):
    p = os.path.join(root, 'sparse', n)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, 'wb') as f:
        f.truncate(64 << 20)
        f.seek(32 << 20)
        f.write(island)
for i in range(200):                                 # unique files
    put(f'unique/u{i:03}.dat', r.randbytes(r.randrange(1, 64 << 10)))
PY
}

work=$(mktemp -d /var/tmp/dedupscan-demo.XXXXXX)
cleanup() {
  for m in "$work"/mnt-*; do mountpoint -q "$m" 2>/dev/null && umount "$m"; done
  rm -rf "$work"
}
trap cleanup EXIT
for fs in xfs btrfs; do
  img=$work/$fs.img mnt=$work/mnt-$fs
  mkdir -p "$mnt"
  truncate -s 1G "$img"
  if [ $fs = xfs ]; then mkfs.xfs -q -m reflink=1 "$img"; else mkfs.btrfs -q "$img"; fi
  mount -o loop "$img" "$mnt"
  demo_corpus "$mnt/data"
  sync
  echo
  echo "=== $fs demo volume: $(du -sh "$mnt/data" | cut -f1) of generated files"
  ideal=$("$bin" --version >/dev/null && python3 - "$mnt/data" <<'PY'
import hashlib, os, sys
seen, dup, zero = set(), 0, hashlib.sha256(bytes(4096)).digest()
for d, _, fs in os.walk(sys.argv[1]):
    for n in fs:
        with open(os.path.join(d, n), 'rb') as f:
            while (b := f.read(4096)):
                if len(b) == 4096 and (h := hashlib.sha256(b).digest()) != zero:
                    dup += h in seen; seen.add(h)
print(dup * 4096)
PY
)
  echo "--- dry run (changes nothing):"
  "$bin" "$mnt/data" --dry-run --db "$work/$fs.sqlite"
  echo "--- real run:"
  "$bin" "$mnt/data" --db "$work/$fs.sqlite" --json > "$work/$fs.json"
  "$bin" report --db "$work/$fs.sqlite" | head -4
  python3 - "$work/$fs.json" "$ideal" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); ideal = int(sys.argv[2])
print(f"freed (statfs) {r['freed_bytes']/2**20:.1f} MiB of ideal {ideal/2**20:.1f} MiB "
      f"= {100*r['freed_bytes']/max(ideal,1):.0f}%  (kernel-confirmed shared: {r['deduped_bytes']/2**20:.1f} MiB)")
PY
done
