#!/usr/bin/env bash
# benches/corpus.sh DIR [SIZE]
#
# Build a realistic, mixed deduplication corpus of about SIZE bytes
# (default 4G; suffixes K, M, G) into DIR, which should be a directory on the
# volume under test. The same SIZE, SEED and cache always give the same data.
#
#   DIR/trees/debian-<release>/   minbase root trees (debootstrap), two releases
#   DIR/tarballs/*.tar            uncompressed tar of each tree (512-byte aligned
#                                 members: mostly NOT 4 KiB-aligned duplicates)
#   DIR/images/debian-<rel>.img   ext4 VM disk images built from each tree
#                                 (mkfs.ext4 -b 4096 -d TREE; sparse)
#   DIR/vm/debian-bookworm-1pct.img  copy of images/debian-bookworm.img with 1%
#                                 of its 4 KiB blocks overwritten with random
#                                 data (seeded; dd conv=notrunc)
#   DIR/toolchain/{a,b}/          two identical copies of (part of) a Rust
#                                 toolchain from ~/.rustup/toolchains
#   DIR/layered/                  the same files in every layer at once:
#     roots/{small,copy}/         a small tree (a subset of the first release's
#                                 tree) twice, as whole files
#     images/small-{1,2}.raw      its files concatenated at 4 KiB alignment in
#                                 two seeded orders, with 0-3 blocks of random
#                                 data of their own before each file
#     images/small.ext4           an ext4 image of it (mkfs.ext4 -d)
#     tarballs/small.tar          a tarball of it
#                                 so each content is a whole file in two trees,
#                                 a run inside three images and a tar member:
#                                 one planner must join all of them.
#
# Budget: each tree gets up to 8% of SIZE (a subset of its files, picked by a
# hash of the path, so both releases keep the same paths), the layered tree
# 2% (about 12% with its copies, images and tarball), the toolchain copies
# share what is left. Trees, tarballs, images and the VM copy are each
# about one tree's size, so the corpus is roughly 7 x tree + 2 x toolchain.
#
# Downloads are cached in $DEDUPSCAN_BENCH_CACHE (default
# /var/tmp/dedupscan-bench-cache): the first run debootstraps each release
# (about a minute each from deb.debian.org), later runs copy from the cache.
# If debootstrap fails (or DEDUPSCAN_BENCH_NO_DEBOOTSTRAP=1), the tree is
# made instead from `apt-get download` of the release's required and
# important packages, extracted with `dpkg-deb -x`.
#
# Environment: SEED (default 1), RELEASES (default "bookworm bullseye"),
# DEBIAN_MIRROR (default http://deb.debian.org/debian), TOOLCHAIN_SRC (default:
# the largest directory in ~/.rustup/toolchains).
#
# Needs root (debootstrap, file owners), python3, debootstrap, mkfs.ext4.
# Copies are made with --reflink=never so that nothing starts out shared
# when DIR is on btrfs or XFS.

set -euo pipefail

usage() {
    sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

[[ $# -ge 1 && $# -le 2 ]] || usage
[[ $1 == -h || $1 == --help ]] && usage
DIR=$1
SIZE=$(numfmt --from=iec "${2:-4G}") || { echo "corpus.sh: bad SIZE '${2:-}'" >&2; exit 2; }
SEED=${SEED:-1}
RELEASES=${RELEASES:-bookworm bullseye}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${DEDUPSCAN_BENCH_CACHE:-/var/tmp/dedupscan-bench-cache}
BLOCK=4096

log() { printf '[corpus %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf 'corpus.sh: %s\n' "$*" >&2; exit 1; }

[[ $EUID -eq 0 ]] || die "must run as root (debootstrap, file owners)"
for tool in python3 mkfs.ext4 tar dd numfmt; do
    command -v "$tool" >/dev/null || die "$tool not found"
done

mkdir -p "$DIR" "$CACHE/trees"
DIR=$(cd "$DIR" && pwd)
[[ -z $(ls -A "$DIR") ]] || die "$DIR is not empty"

TMP=$(mktemp -d "${TMPDIR:-/var/tmp}/dedupscan-corpus.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# --- trees -------------------------------------------------------------------

# Tree of a release from required+important .deb files, for when debootstrap
# cannot run. Uses a private apt state so the host's sources are untouched.
tree_from_debs() {
    local rel=$1 dest=$2 a=$CACHE/apt-$rel
    mkdir -p "$a/lists/partial" "$a/cache/archives/partial" "$a/debs" "$dest"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $rel main" >"$a/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$a/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
        -o "Dir::State::Lists=$a/lists" -o "Dir::Cache=$a/cache" -o "APT::Architecture=amd64"
        -o "Debug::NoLocking=1")
    apt-get "${opts[@]}" -q update >&2
    local pkgs
    pkgs=$(apt-cache "${opts[@]}" dumpavail |
        awk '/^Package:/{p=$2} /^Priority: (required|important)$/{print p}' | sort -u)
    [[ -n $pkgs ]] || die "no packages found for $rel"
    # shellcheck disable=SC2086 # one word per package
    (cd "$a/debs" && apt-get "${opts[@]}" -q download $pkgs >&2)
    local deb
    for deb in "$a"/debs/*.deb; do
        dpkg-deb -x "$deb" "$dest"
    done
}

ensure_tree() {
    local rel=$1 t=$CACHE/trees/debian-$1
    [[ -e $t.complete ]] && return 0
    rm -rf "$t" "$t.tmp"
    if [[ ${DEDUPSCAN_BENCH_NO_DEBOOTSTRAP:-0} != 1 ]] && command -v debootstrap >/dev/null; then
        log "debootstrap --variant=minbase $rel (cached in $t; about a minute)"
        if debootstrap --variant=minbase "$rel" "$t.tmp" "$MIRROR" >"$t.log" 2>&1; then
            mv "$t.tmp" "$t"
            date -u +%FT%TZ >"$t.complete"
            return 0
        fi
        log "debootstrap $rel failed (see $t.log); falling back to apt-get download"
        # debootstrap may leave proc/sys mounted on failure.
        umount "$t.tmp/proc" "$t.tmp/sys" 2>/dev/null || true
        rm -rf "$t.tmp"
    fi
    log "building $rel tree from required/important .deb files"
    tree_from_debs "$rel" "$t.tmp"
    mv "$t.tmp" "$t"
    date -u +%FT%TZ >"$t.complete"
}

# select_files SRC BUDGET > LIST: regular files and symlinks of SRC (paths
# relative to SRC, NUL-separated): all of them if they fit in BUDGET bytes,
# otherwise files taken in the order of a hash of their relative path while
# they fit, so that trees of the same layout keep mostly the same paths and
# every directory is sampled. Prints "selected N of TOTAL" on stderr.
select_files() {
    python3 - "$1" "$2" <<'EOF'
import os, sys, zlib
root, budget = sys.argv[1], int(sys.argv[2])
entries = []
for d, dirs, files in os.walk(root):
    for n in files:
        p = os.path.join(d, n)
        if os.path.islink(p):
            entries.append((os.fsencode(os.path.relpath(p, root)), 0))
        elif os.path.isfile(p):
            entries.append((os.fsencode(os.path.relpath(p, root)), os.lstat(p).st_size))
total = sum(s for _, s in entries)
entries.sort(key=lambda e: (zlib.crc32(e[0]), e[0]))
sel, keep = 0, []
for rel, size in entries:
    if sel + size <= budget:
        keep.append(rel)
        sel += size
# Path order, as a copy of the tree would lay the files out.
sys.stdout.buffer.write(b"".join(rel + b"\0" for rel in sorted(keep)))
print(f"selected {sel} of {total}", file=sys.stderr)
EOF
}

copy_selected() { # SRC BUDGET DEST
    local list=$TMP/list.$RANDOM
    select_files "$1" "$2" >"$list" 2>"$list.log"
    mkdir -p "$3"
    tar -C "$1" --null -T "$list" -cf - | tar -C "$3" -xpf -
    awk '{print $2}' "$list.log"
}

# --- build ---------------------------------------------------------------------

read -r -a rels <<<"$RELEASES"
for rel in "${rels[@]}"; do ensure_tree "$rel"; done

tree_budget=$((SIZE * 8 / 100))
for rel in "${rels[@]}"; do
    got=$(copy_selected "$CACHE/trees/debian-$rel" "$tree_budget" "$DIR/trees/debian-$rel")
    log "trees/debian-$rel: $(numfmt --to=iec "$got") (budget $(numfmt --to=iec $tree_budget))"
done

mkdir -p "$DIR/tarballs" "$DIR/images" "$DIR/vm"
for rel in "${rels[@]}"; do
    log "tarballs/debian-$rel.tar"
    tar -C "$DIR/trees/debian-$rel" -cf "$DIR/tarballs/debian-$rel.tar" .
    log "images/debian-$rel.img (mkfs.ext4 -d)"
    bytes=$(du -sb "$DIR/trees/debian-$rel" | cut -f1)
    img_mib=$((bytes * 14 / 10 / 1048576 + 32))
    # Fixed UUID and hash seed: the same tree gives the same image.
    uuid=$(python3 -c "import uuid,sys; print(uuid.uuid5(uuid.NAMESPACE_DNS, sys.argv[1]))" "$rel.$SEED")
    mkfs.ext4 -q -F -b 4096 -U "$uuid" -E "hash_seed=$uuid" -L "$rel" \
        -d "$DIR/trees/debian-$rel" "$DIR/images/debian-$rel.img" "${img_mib}M" >&2
done

# The VM image pair: images/debian-<first>.img and a copy with 1% of its
# blocks overwritten.
base=$DIR/images/debian-${rels[0]}.img
pair=$DIR/vm/debian-${rels[0]}-1pct.img
log "vm/$(basename "$pair") (copy, 1% of blocks rewritten)"
cp --sparse=always --reflink=never "$base" "$pair"
nblocks=$(($(stat -c %s "$base") / BLOCK))
python3 - "$nblocks" "$SEED" "$TMP/rand.bin" >"$TMP/blocks" <<'EOF'
import random, sys
n, seed, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = random.Random(seed)
picks = rng.sample(range(n), max(1, n // 100))
with open(out, "wb") as f:
    f.write(rng.randbytes(len(picks) * 4096))
for i, b in enumerate(picks):
    print(b, i)
EOF
while read -r blk i; do
    dd if="$TMP/rand.bin" of="$pair" bs=$BLOCK skip="$i" seek="$blk" count=1 conv=notrunc status=none
done <"$TMP/blocks"

# The layered part: one small tree as whole files, raw images, ext4 image
# and tarball at once.
L=$DIR/layered
mkdir -p "$L/roots" "$L/images" "$L/tarballs"
got=$(copy_selected "$DIR/trees/debian-${rels[0]}" $((SIZE * 2 / 100)) "$L/roots/small")
log "layered/roots/small: $(numfmt --to=iec "$got") from trees/debian-${rels[0]}, and its copies"
cp -a --sparse=always --reflink=never "$L/roots/small" "$L/roots/copy"
tar -C "$L/roots/small" -cf "$L/tarballs/small.tar" .
bytes=$(du -sb "$L/roots/small" | cut -f1)
uuid=$(python3 -c "import uuid,sys; print(uuid.uuid5(uuid.NAMESPACE_DNS, sys.argv[1]))" "layered.$SEED")
mkfs.ext4 -q -F -b 4096 -U "$uuid" -E "hash_seed=$uuid" -L layered \
    -d "$L/roots/small" "$L/images/small.ext4" "$((bytes * 14 / 10 / 1048576 + 32))M" >&2
python3 - "$L/roots/small" "$L/images" "$SEED" <<'EOF'
import os, random, sys
root, out, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = sorted(os.path.join(d, n) for d, _, ns in os.walk(root) for n in ns
               if os.path.isfile(os.path.join(d, n)) and not os.path.islink(os.path.join(d, n)))
for k in (1, 2):
    rng = random.Random(seed * 1000 + k)
    order = files[:]
    rng.shuffle(order)
    with open(os.path.join(out, f"small-{k}.raw"), "wb") as img:
        for p in order:
            img.write(rng.randbytes(4096 * rng.randrange(4)))
            with open(p, "rb") as f:
                data = f.read()
            img.write(data + bytes(-len(data) % 4096))
EOF

# Toolchain copies: whatever is left of the budget, split in two.
src=${TOOLCHAIN_SRC:-$(du -s /root/.rustup/toolchains/*/ 2>/dev/null | sort -n | tail -1 | cut -f2)}
if [[ -n $src && -d $src ]]; then
    used=$(du -sB1 "$DIR" | cut -f1) # allocated, not apparent: images are sparse
    left=$((SIZE > used ? (SIZE - used) / 2 : 0))
    log "toolchain/a and toolchain/b from $src (budget $(numfmt --to=iec $left) each)"
    copy_selected "$src" "$left" "$DIR/toolchain/a" >/dev/null
    mkdir -p "$DIR/toolchain/b"
    cp -a --sparse=always --reflink=never "$DIR/toolchain/a/." "$DIR/toolchain/b/"
else
    log "no toolchain found (set TOOLCHAIN_SRC): skipping toolchain copies"
fi

sync -f "$DIR"
files=$(find "$DIR" -type f | wc -l)
apparent=$(du -sb "$DIR" | cut -f1)
alloc=$(du -sB1 "$DIR" | cut -f1)
log "done: $files files, $(numfmt --to=iec "$apparent") apparent, $(numfmt --to=iec "$alloc") allocated in $DIR"
for d in "$DIR"/*/; do
    printf '  %-12s %8s\n' "$(basename "$d")" "$(du -sh "$d" | cut -f1)" >&2
done
