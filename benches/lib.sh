# shellcheck shell=bash disable=SC2154 # the globals are the caller's
# Shell helpers of the benchmark scripts (compare.sh, rivals.sh, ab.sh,
# layouts.sh, images.sh, slices.sh), sourced. They use the caller's
# globals: MNT (mount point), LOOP (loop device, empty when none), CGROUP
# (memory cgroup directory, empty when none), and its log() and die().

# The memory cgroup of --memory-limit: CGROUP is its directory (empty: no limit).
CGROUP=
cgroup_setup() { # BYTES
    local root=/sys/fs/cgroup
    if [[ $(stat -fc %T "$root") == cgroup2fs ]]; then
        grep -qw memory "$root/cgroup.subtree_control" || echo +memory >"$root/cgroup.subtree_control"
        CGROUP=$root/dedupscan-bench-$$
        mkdir "$CGROUP"
        echo "$1" >"$CGROUP/memory.max"
        [[ -e $CGROUP/memory.swap.max ]] && echo 0 >"$CGROUP/memory.swap.max"
    elif [[ -d $root/memory ]]; then
        CGROUP=$root/memory/dedupscan-bench-$$
        mkdir "$CGROUP"
        echo "$1" >"$CGROUP/memory.limit_in_bytes"
    else
        die "--memory-limit: no memory cgroup (neither cgroup v2 nor v1 memory at $root)"
    fi
}
# limit_memory [SIZE]: with SIZE (such as 1G), the memory cgroup
# (cgroup_setup) and IN_CG, a prefix that runs a command in it; without,
# IN_CG is empty.
limit_memory() {
    IN_CG=()
    [[ -n ${1:-} ]] || return 0
    cgroup_setup "$(numfmt --from=iec "$1")"
    IN_CG=(sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CGROUP")
}
cgroup_remove() {
    [[ -n $CGROUP && -d $CGROUP ]] || return 0
    rmdir "$CGROUP" 2>/dev/null || { sleep 1; rmdir "$CGROUP" 2>/dev/null; } || log "could not remove $CGROUP"
}
cold() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}

attach() {
    LOOP=$(losetup --find --show "$1")
    # Direct I/O on the backing file: no second copy of the data in the host
    # page cache (drop_caches would drop it anyway).
    losetup --direct-io=on "$LOOP" 2>/dev/null || true
}

# pristine_volume FS SIZE WORK: the corpus of SIZE (FULL, SMALL or a size
# such as 1G; built in WORK/corpus-BYTES if not there) copied onto a fresh
# FS volume three times its size (at least 2 GiB, as compare.sh), kept in
# WORK for the next call (ab.sh, slices.sh); sets PRISTINE to its image.
# Uses HERE (the benches directory) and MNT.
pristine_volume() {
    local fs=$1 size=$2 work=$3 bytes vol
    case $size in FULL) bytes=4G ;; SMALL) bytes=400M ;; *) bytes=$size ;; esac
    vol=$(($(numfmt --from=iec "$bytes") * 3))
    ((vol > 2 << 30)) || vol=$((2 << 30))
    PRISTINE=$work/pristine-$fs-$bytes.img
    [[ -f $PRISTINE ]] && return 0
    [[ -d $work/corpus-$bytes ]] || { log "building the corpus ($size)"; "$HERE/corpus.sh" "$work/corpus-$bytes" "$bytes" >&2; }
    log "pristine $fs volume"
    truncate -s "$vol" "$PRISTINE.tmp"
    case $fs in
    btrfs) mkfs.btrfs -q -f "$PRISTINE.tmp" >/dev/null ;;
    xfs) mkfs.xfs -q -f -m reflink=1 "$PRISTINE.tmp" ;;
    *) die "--fs btrfs or xfs" ;;
    esac
    mount_vol "$fs" "$PRISTINE.tmp" && mkdir "$MNT/data"
    cp -a --sparse=always --reflink=never "$work/corpus-$bytes/." "$MNT/data/"
    sync -f "$MNT" && umount_vol && mv "$PRISTINE.tmp" "$PRISTINE"
}

mount_vol() { # FS IMAGE
    attach "$2"
    local opts=()
    [[ $1 == xfs ]] && opts=(-o nouuid) # every copy has the pristine's UUID
    mount "${opts[@]}" "$LOOP" "$MNT"
}

umount_vol() {
    if mountpoint -q "$MNT"; then umount "$MNT"; fi
    if [[ -n $LOOP ]]; then losetup -d "$LOOP"; LOOP=; fi
}

# --- the volume discipline of compare.sh and rivals.sh ------------------------
# These also use: WORK (scratch directory, holds the pristine images, the
# corpus and the working copy), LOGS (per-step logs), STEPS (JSON lines of
# raw records), DATA (the corpus on the mounted volume, $MNT/data), IN_CGROUP
# (array: prefix of every timed command, may be empty), verify (1: check
# contents), size, size_name, vol_bytes, IDEAL (ideal-dup.py), HERE.

# ideal_path: ideal-dup.py, the yardstick: $IDEAL_DUP, else
# ../shared/tools/ideal-dup.py from the checkout ($ROOT), else (a git
# worktree elsewhere) the same next to the main checkout.
ideal_path() {
    local p=${IDEAL_DUP:-$ROOT/../shared/tools/ideal-dup.py} common
    if [[ -z ${IDEAL_DUP:-} && ! -r $p ]]; then
        common=$(git -C "$ROOT" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
        [[ -n $common ]] && p=$(dirname "$(dirname "$common")")/shared/tools/ideal-dup.py
    fi
    echo "$p"
}

# build_corpus: benches/corpus.sh into $WORK/corpus ($size bytes).
build_corpus() {
    local t0
    log "building the corpus ($size_name, $(numfmt --to=iec "$size"))"
    t0=$(date +%s)
    "$HERE/corpus.sh" "$WORK/corpus" "$size" 2>"$LOGS/corpus.log" || { cat "$LOGS/corpus.log" >&2; die "corpus.sh failed"; }
    record step=meta corpus_build_s="$(($(date +%s) - t0))"
    tail -7 "$LOGS/corpus.log" >&2
}

# record KEY=VALUE...: one JSON object per line in $STEPS; numbers stay numbers.
record() {
    python3 - "$@" >>"$STEPS" <<'EOF'
import json, sys
d = {}
for a in sys.argv[1:]:
    k, v = a.split("=", 1)
    for conv in (int, float):
        try:
            v = conv(v)
            break
        except ValueError:
            pass
    d[k] = v
print(json.dumps(d))
EOF
}

# default_bins ROOT: the binaries to measure are BINS (given with --bin), or
# else the release build of the tree at ROOT, built now.
default_bins() {
    if [[ ${#BINS[@]} -eq 0 ]]; then
        (cd "$1" && cargo build --release --quiet)
        BINS=("$1/target/release/dedupscan")
    fi
}

# free_bytes FS: statfs free bytes of the mounted volume, after committing
# everything (btrfs releases freed extents at transaction commit).
free_bytes() {
    sync -f "$MNT"
    if [[ $1 == btrfs ]]; then
        btrfs filesystem sync "$MNT" >/dev/null
        sleep 1
        btrfs filesystem sync "$MNT" >/dev/null
    fi
    sync -f "$MNT"
    # Shell arithmetic, not awk: mawk's printf %d clamps at 2^31 - 1, which
    # made every volume over 2 GiB look like it freed nothing.
    local free size
    read -r free size < <(stat -f -c '%f %S' "$MNT")
    echo $((free * size))
}

# step FS NAME CMD...: drop caches (unless STEP_COLD=0), run CMD under
# /usr/bin/time -v with stdout in $LOGS/FS-NAME.out, record wall time, peak
# RSS, exit status.
step() {
    local fs=$1 name=$2
    shift 2
    local base=$LOGS/$fs-$name rc=0 t0 t1 rss load
    [[ ${STEP_COLD:-1} -eq 0 ]] || cold
    load=$(cut -d' ' -f1 /proc/loadavg)
    t0=$(date +%s%N)
    /usr/bin/time -v -o "$base.time" "${IN_CGROUP[@]}" "$@" >"$base.out" 2>"$base.err" || rc=$?
    t1=$(date +%s%N)
    rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$base.time")
    record fs="$fs" step="$name" wall_s="$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", (b - a) / 1e9}')" \
        max_rss_kb="${rss:-0}" rc="$rc" load1="$load"
    log "$fs $name: $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", (b - a) / 1e9}') s, peak RSS ${rss:-?} KiB, exit $rc"
    if [[ $rc -ne 0 ]]; then
        log "  stderr: $(tail -3 "$base.err" | tr '\n' ' ')"
    fi
}

# Steps that change the volume: free space before and after.
tool_step() { # FS NAME CMD...
    local fs=$1 name=$2 before after
    before=$(free_bytes "$fs")
    step "$@"
    after=$(free_bytes "$fs")
    record fs="$fs" step="$name" free_before="$before" free_after="$after" freed="$((after - before))"
    log "$fs $name: freed $(numfmt --to=iec -- $((after - before))) (statfs)"
}

db_bytes() { # FILE: the database and its WAL
    local n=0 f
    for f in "$1" "$1-wal"; do
        [[ -e $f ]] && n=$((n + $(stat -c %s "$f")))
    done
    echo "$n"
}

manifest() { # > list of SHA-256 of every file, in path order
    (cd "$DATA" && find . -type f -print0 | sort -z | xargs -0 -r sha256sum)
}

check_unchanged() { # FS NAME
    [[ $verify -eq 1 ]] || return 0
    if manifest | cmp -s - "$WORK/manifest-$1"; then
        record fs="$1" step="$2" content_unchanged=1
    else
        record fs="$1" step="$2" content_unchanged=0
        log "ERROR: $1 $2: file contents changed! (diff in $1-$2.manifest-diff)"
        manifest | diff "$WORK/manifest-$1" - >"$LOGS/$1-$2.manifest-diff" || true
    fi
}

# permute_names DIR SEED: rename DIR's subdirectories and theirs to
# NN-<name>, NN from a seeded shuffle (second level first, then top level).
permute_names() {
    python3 - "$1" "$2" <<'EOF'
import os, random, sys
root, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
def permute(parent):
    names = sorted(n for n in os.listdir(parent)
                   if os.path.isdir(os.path.join(parent, n)) and not os.path.islink(os.path.join(parent, n)))
    order = names[:]
    rng.shuffle(order)
    for i, n in enumerate(order):
        new = f"{i:02d}-{n}"
        os.rename(os.path.join(parent, n), os.path.join(parent, new))
        print(f"{os.path.relpath(os.path.join(parent, n), root)} -> {new}")
for top in sorted(os.listdir(root)):
    if os.path.isdir(os.path.join(root, top)) and not os.path.islink(os.path.join(root, top)):
        permute(os.path.join(root, top))
permute(root)
EOF
}

fresh_copy() { # FS LABEL
    umount_vol
    rm -f "$WORK/work.img"
    local t0
    t0=$(date +%s%N)
    cp --sparse=always --reflink=never "$WORK/pristine-$1.img" "$WORK/work.img"
    mount_vol "$1" "$WORK/work.img"
    log "$1: fresh copy $2 of the pristine volume ($(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN {printf "%.1f", (b - a) / 1e9}') s)"
    # Settle: read the copy once (in no ratio), so that every timed step starts
    # from the same state. The first read of a fresh copy is slower than the
    # next ones (FULL/btrfs: 14.5 s, then 12.8 and 13.0 s, P64), presumably
    # the host still writing the copy back: without this the raw reads and
    # the scan (2nd-4th reads of copy A) were timed warm and the full run
    # (1st read of copy B) cold.
    step "$1" "settle_$2" sh -c 'cd "$1" && find . -type f -print0 | xargs -0 -n 32 -P 64 cat >/dev/null' sh "$DATA"
}

# make_pristine FS [SEED]: a fresh FS on a sparse image $WORK/pristine-FS.img
# ($vol_bytes) holding the corpus in $DATA (directory names permuted with
# SEED if given), its corpus facts and ideal duplicate bytes recorded. The
# volume is left mounted, for the caller's manifest; umount_vol after.
make_pristine() {
    local img=$WORK/pristine-$1.img files logical
    truncate -s "$vol_bytes" "$img"
    attach "$img"
    case $1 in
    btrfs) mkfs.btrfs -q -f "$LOOP" >"$LOGS/$1-mkfs.log" 2>&1 ;;
    xfs) mkfs.xfs -q -f -m reflink=1 "$LOOP" >"$LOGS/$1-mkfs.log" 2>&1 ;;
    esac
    losetup -d "$LOOP"
    LOOP=
    mount_vol "$1" "$img"
    mkdir "$DATA"
    cp -a --sparse=always --reflink=never "$WORK/corpus/." "$DATA/"
    if [[ ${thick_images:-0} -eq 1 ]]; then
        # compare.sh --thick-images: the images' holes written as zeros.
        find "$DATA" -type f \( -name '*.img' -o -name '*.raw' -o -name '*.ext4' \) -print0 |
            while IFS= read -r -d '' f; do
                # dd writes every block it reads, holes as zeros (cp may
                # clone extents, holes and all, through copy_file_range).
                dd if="$f" of="$f.thick" bs=1M status=none &&
                    chmod --reference="$f" "$f.thick" && touch -r "$f" "$f.thick" && mv "$f.thick" "$f"
            done
        log "$1: images written thick: $(du -sB1 "$DATA" | cut -f1) bytes allocated"
    fi
    if [[ -n ${2:-} ]]; then
        permute_names "$DATA" "$2" >"$LOGS/permute-names.log"
        log "$1: directory names permuted (seed $2): $(tr '\n' ' ' <"$LOGS/permute-names.log" | cut -c1-200)"
    fi
    sync -f "$MNT"
    # Corpus facts on this volume, and the yardstick.
    read -r files logical < <(find "$DATA" -type f -printf '%s\n' | awk '{n++; s += $1} END {printf "%d %.0f\n", n, s}')
    python3 "$IDEAL" "$DATA" >"$LOGS/$1-ideal.json"
    record fs="$1" step=corpus files="$files" logical_bytes="$logical" \
        allocated_bytes="$(du -sB1 "$DATA" | cut -f1)" \
        "$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("ideal_dup_block_bytes_4k=%d" % d["dup_block_bytes_4k"])' "$LOGS/$1-ideal.json")" \
        "$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("ideal_dup_file_bytes=%d" % d["dup_file_bytes"])' "$LOGS/$1-ideal.json")" \
        "$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("ideal_zero_block_bytes=%d" % d["zero_block_bytes"])' "$LOGS/$1-ideal.json")"
    log "$1: corpus $files files, $(numfmt --to=iec "$logical") logical; ideal: $(cat "$LOGS/$1-ideal.json")"
}

# bench_cleanup: the EXIT trap of compare.sh and rivals.sh (the volume
# discipline's globals, and `out`, the results file): unmount, detach, keep
# the end of each step's log next to the results (duperemove's and jdupes'
# can be long), remove the scratch directory and the cgroup, and exit with
# the status the script had.
bench_cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM HUP
    cd /
    if mountpoint -q "$MNT"; then
        umount "$MNT" 2>/dev/null || { sleep 2; umount "$MNT"; } || umount -l "$MNT"
    fi
    [[ -n $LOOP ]] && losetup -d "$LOOP"
    if [[ -d $LOGS ]]; then
        rm -rf "$out.logs"
        mkdir -p "$out.logs"
        local f
        for f in "$LOGS"/*; do
            [[ -e $f ]] || continue
            tail -c 4M "$f" >"$out.logs/$(basename "$f")"
        done
    fi
    rm -rf "$WORK"
    cgroup_remove
    [[ $rc -ne 0 ]] && log "failed (exit $rc); partial logs in $out.logs"
    exit "$rc"
}

# layouts_corpus: build the corpus of layouts.py once, cached in BENCH_WORK
# (/var/tmp by default; a corpus cached before part H was added is built
# again), and set TREE to it.
layouts_corpus() {
    TREE=${BENCH_WORK:-/var/tmp}/dedupscan-layouts-corpus
    if [ ! -e "$TREE.complete" ] || [ ! -d "$TREE/vocab" ]; then
        rm -rf "$TREE"
        python3 "$HERE/layouts.py" "$TREE"
        touch "$TREE.complete"
    fi
}

# scratch_dir NAME: a new work directory $WORK under BENCH_WORK (/var/tmp by
# default) with a mount point $MNT in it, unmounted and removed on exit.
scratch_dir() {
    WORK=$(mktemp -d "${BENCH_WORK:-/var/tmp}/dedupscan-$1.XXXXXX")
    MNT=$WORK/mnt
    mkdir "$MNT"
    trap 'mountpoint -q "$MNT" && umount "$MNT"; rm -rf "$WORK"' EXIT
}
