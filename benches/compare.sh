#!/usr/bin/env bash
# benches/compare.sh [--size SMALL|FULL|BYTES] [--fs btrfs|xfs|both] [--out FILE]
#                    [--bin PATH] [--label TEXT] [--no-verify] [--permute-names SEED]
#                    [--thick-images]
#                    [--memory-limit SIZE]
#
# Side-by-side benchmark of dedupscan and duperemove on a loop-mounted btrfs
# and/or XFS volume holding the corpus of benches/corpus.sh (SMALL = 400M,
# FULL = 4G). See docs/BENCHMARKS.md for what each step measures and why.
#
# How the volumes are made: the corpus is built once into a staging
# directory, copied into a freshly made filesystem on a sparse image (the
# *pristine* image), which is then unmounted. Every tool starts from its own
# byte-identical copy of that image (cp --sparse=always; cheaper than
# building the corpus again, and the data and its on-disk layout are exactly
# the same for every tool):
#
#   Every copy is read once (settle_A/B/C, see fresh_copy; recorded but in
#   no ratio) before its measured steps.
#   copy A  (1) cold raw read: find | xargs -P N cat, N = 4, 16, 64; fastest
#           (2) dedupscan scan
#   copy B  (3) dedupscan full run (scan, plan, share), new database
#           (5) find -printf of size/mtime/ctime/inode (cold), then
#               dedupscan scan --incremental and dedupscan --incremental
#               on the unchanged volume
#           (6) a second full dedupscan run (same command as (3))
#           (7) dedupscan --rehash: every file hashed again right after the
#               dedupe (issue 14: reads <= 60% of what (3) read, since
#               shared extents are read once)
#   copy C  (4) duperemove -dr --hashfile=FILE
#           (5) the same duperemove command again (hashfile rerun)
#
# Page cache, dentries and inodes are dropped (sync; echo 3 >
# /proc/sys/vm/drop_caches) before every timed step. Each step records wall
# time, peak RSS (/usr/bin/time -v), exit status and the load average; tool
# runs also record free space before/after (statfs, after sync), database or
# hashfile size and, unless --no-verify, that every file's SHA-256 is
# unchanged afterwards. The ideal duplicate bytes come from
# ideal-dup.py (IDEAL_DUP, default ../shared/tools/ideal-dup.py).
#
# Prints a Markdown table with ratios and writes every raw number as JSON to
# --out FILE (default ./compare-results.json); the logs of every step go
# next to it in FILE.logs/. --bin picks the dedupscan binary (default
# target/release/dedupscan; it is copied first, so a rebuild during the run
# does not matter); --label adds a note to the results (e.g. which commit the
# binary was built from, when it is not the checkout's HEAD).
# `benches/compare_report.py --table FILE` prints the table again.
#
# --permute-names SEED renames the top-level and second-level directories of
# the corpus on the volume (before anything is measured) to
# `NN-<old name>`, NN their position in a permutation seeded by SEED, so that
# path order no longer follows the corpus layout: results that move with
# SEED depend on names (the planner must not). The renames are logged in
# FILE.logs/permute-names.log.
#
# --thick-images writes the holes of the corpus's disk images (*.img,
# *.raw, *.ext4) as zeros on the volume (`dd`), as a
# thick-provisioned VM store or images made with `dd if=/dev/zero` hold
# them: the yardstick leaves zero blocks apart (ideal_zero_block_bytes
# says how many); what a tool frees of them shows in freed_bytes.
#
# --memory-limit SIZE (e.g. 1G) runs every timed step -- the raw reads,
# each dedupscan step and duperemove -- inside a memory cgroup limited to
# SIZE (cgroup v2 memory.max, or v1 memory.limit_in_bytes, whichever the
# machine has). The page cache a step fills is charged to the cgroup, so a
# corpus larger than SIZE no longer fits in cache, as on a busy server whose
# data is many times its RAM: a tool that reads a byte twice pays for it.
#
# Needs root, loop devices, /usr/bin/time, mkfs.btrfs / mkfs.xfs, duperemove,
# python3. Everything it mounts or creates is removed on exit, also on error
# or Ctrl-C (after the step that is running finishes).

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")

usage() {
    sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

size_arg=SMALL
fs_arg=both
out=compare-results.json
bin=${DEDUPSCAN_BIN:-$ROOT/target/release/dedupscan}
verify=1
label=
permute=
memory_limit=
thick_images=0
while [[ $# -gt 0 ]]; do
    case $1 in
    --size) size_arg=${2:?}; shift 2 ;;
    --size=*) size_arg=${1#*=}; shift ;;
    --fs) fs_arg=${2:?}; shift 2 ;;
    --fs=*) fs_arg=${1#*=}; shift ;;
    --out) out=${2:?}; shift 2 ;;
    --out=*) out=${1#*=}; shift ;;
    --bin) bin=${2:?}; shift 2 ;;
    --bin=*) bin=${1#*=}; shift ;;
    --label) label=${2:?}; shift 2 ;;
    --label=*) label=${1#*=}; shift ;;
    --no-verify) verify=0; shift ;;
    --permute-names) permute=${2:?}; shift 2 ;;
    --permute-names=*) permute=${1#*=}; shift ;;
    --thick-images) thick_images=1; shift ;;
    --memory-limit) memory_limit=${2:?}; shift 2 ;;
    --memory-limit=*) memory_limit=${1#*=}; shift ;;
    -h | --help) usage ;;
    *) echo "compare.sh: unknown argument '$1'" >&2; usage ;;
    esac
done
case ${size_arg^^} in
SMALL) size_name=SMALL; size=$(numfmt --from=iec 400M) ;;
FULL) size_name=FULL; size=$(numfmt --from=iec 4G) ;;
*) size_name=custom; size=$(numfmt --from=iec "$size_arg") || usage ;;
esac
case $fs_arg in
btrfs | xfs) filesystems=("$fs_arg") ;;
both) filesystems=(btrfs xfs) ;;
*) usage ;;
esac
DUPEREMOVE=${DUPEREMOVE:-duperemove}
# Extra duperemove flags, e.g. DUPEREMOVE_ARGS="-b 4k --dedupe-options=partial"
# (default: none, i.e. what `duperemove -dr --hashfile=FILE` does out of the box).
read -r -a DUPEREMOVE_ARGS <<<"${DUPEREMOVE_ARGS:-}"

log() { printf '[compare %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf 'compare.sh: %s\n' "$*" >&2; exit 1; }
# cgroup_setup/cgroup_remove, cold, attach, mount_vol/umount_vol (on $MNT, $LOOP);
# build_corpus, make_pristine, fresh_copy, step, tool_step, record, free_bytes,
# db_bytes, manifest, check_unchanged, permute_names (shared with rivals.sh).
# shellcheck source=benches/lib.sh
. "$HERE/lib.sh"
IDEAL=$(ideal_path)

[[ -z $permute || $permute =~ ^[0-9]+$ ]] || die "--permute-names takes a number (the seed)"
[[ $EUID -eq 0 ]] || die "must run as root (loop devices, mount, drop_caches)"
[[ -x $bin ]] || die "$bin: no dedupscan binary (cargo build --release, or --bin PATH)"
[[ -r $IDEAL ]] || die "$IDEAL: ideal-dup.py not found (set IDEAL_DUP)"
[[ -x /usr/bin/time ]] || die "/usr/bin/time not found (apt-get install time)"
for tool in losetup mount umount python3 "$DUPEREMOVE" numfmt; do
    command -v "$tool" >/dev/null || die "$tool not found"
done
for fs in "${filesystems[@]}"; do
    command -v "mkfs.$fs" >/dev/null || die "mkfs.$fs not found"
done
out=$(realpath -m "$out")
mkdir -p "$(dirname "$out")"

WORK=$(mktemp -d "${BENCH_WORK:-/var/tmp}/dedupscan-compare.XXXXXX")
LOGS=$WORK/logs
STEPS=$WORK/steps.jsonl
MNT=$WORK/mnt
DATA=$MNT/data
LOOP=
mkdir -p "$LOGS" "$MNT"
: >"$STEPS"

# IN_CGROUP: the prefix that runs a command in the cgroup (a shell that moves
# itself in, then execs the command); empty without --memory-limit.
IN_CGROUP=()
if [[ -n $memory_limit ]]; then
    memory_limit=$(numfmt --from=iec "$memory_limit") || die "--memory-limit takes a size such as 1G"
fi

trap bench_cleanup EXIT
trap 'exit 130' INT TERM HUP
if [[ -n $memory_limit ]]; then
    cgroup_setup "$memory_limit"
    IN_CGROUP=(sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CGROUP")
    log "every timed step runs in $CGROUP, limited to $(numfmt --to=iec "$memory_limit")"
fi

# --- run -------------------------------------------------------------------------

t_start=$(date +%s)
cp "$bin" "$WORK/dedupscan" # the build must not change under the run
BIN=$WORK/dedupscan
vol_bytes=$((size * 3 > 2 * 1024 ** 3 ? size * 3 : 2 * 1024 ** 3))
record step=meta started="$(date -u +%FT%TZ)" size_name="$size_name" size_bytes="$size" label="$label" \
    volume_bytes="$vol_bytes" kernel="$(uname -r)" nproc="$(nproc)" \
    cpu="$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)" \
    mem_kb="$(awk '/MemTotal/ {print $2}' /proc/meminfo)" \
    permute_names="$permute" thick_images="$thick_images" memory_limit_bytes="${memory_limit:-0}" dedupscan_version="$("$BIN" --version)" dedupscan_sha256="$(sha256sum "$BIN" | cut -c1-16)" \
    git_head="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    git_dirty_files="$(git -C "$ROOT" status --short 2>/dev/null | wc -l)" \
    git_src_diff_sha256="$(git -C "$ROOT" diff HEAD -- src schema Cargo.toml 2>/dev/null | sha256sum | cut -c1-12)" \
    duperemove_version="$("$DUPEREMOVE" --version 2>&1 | head -1)" duperemove_args="${DUPEREMOVE_ARGS[*]}" \
    btrfs_progs="$(mkfs.btrfs --version 2>&1 | head -1)" xfsprogs="$(mkfs.xfs -V 2>&1 | head -1)"

build_corpus

for fs in "${filesystems[@]}"; do
    log "=== $fs ==="
    make_pristine "$fs" "$permute"
    [[ $verify -eq 1 ]] && manifest >"$WORK/manifest-$fs"
    umount_vol
    img=$WORK/pristine-$fs.img

    # Copy A: raw read and scan only (nothing on the volume changes).
    fresh_copy "$fs" A
    for n in 4 16 64; do
        # -n 32: a few files per cat, so that N readers really run at once.
        step "$fs" "raw_read_P$n" sh -c 'cd "$1" && find . -type f -print0 | xargs -0 -n 32 -P "$2" cat >/dev/null' \
            sh "$DATA" "$n"
    done
    step "$fs" ds_scan "$BIN" scan "$DATA" --db "$WORK/scan-$fs.db" --json --progress never
    record fs="$fs" step=ds_scan db_bytes="$(db_bytes "$WORK/scan-$fs.db")"

    # Copy B: full runs of dedupscan.
    fresh_copy "$fs" B
    db=$WORK/run-$fs.db
    tool_step "$fs" ds_run "$BIN" "$DATA" --db "$db" --json --progress never
    record fs="$fs" step=ds_run db_bytes="$(db_bytes "$db")"
    check_unchanged "$fs" ds_run
    step "$fs" find_meta sh -c 'find "$1" -type f -printf "%s %T@ %C@ %i\n" >/dev/null' sh "$DATA"
    step "$fs" ds_scan_incr "$BIN" scan "$DATA" --incremental --db "$db" --json --progress never
    tool_step "$fs" ds_run_incr "$BIN" "$DATA" --incremental --db "$db" --json --progress never
    tool_step "$fs" ds_run2 "$BIN" "$DATA" --db "$db" --json --progress never
    record fs="$fs" step=ds_run2 db_bytes="$(db_bytes "$db")"
    check_unchanged "$fs" ds_run2
    tool_step "$fs" ds_rehash "$BIN" "$DATA" --rehash --db "$db" --json --progress never
    check_unchanged "$fs" ds_rehash

    # Copy C: duperemove.
    fresh_copy "$fs" C
    hf=$WORK/dupe-$fs.hash
    tool_step "$fs" dupe "$DUPEREMOVE" -dr "${DUPEREMOVE_ARGS[@]}" --hashfile="$hf" "$DATA"
    record fs="$fs" step=dupe db_bytes="$(db_bytes "$hf")"
    check_unchanged "$fs" dupe
    tool_step "$fs" dupe_rerun "$DUPEREMOVE" -dr "${DUPEREMOVE_ARGS[@]}" --hashfile="$hf" "$DATA"
    check_unchanged "$fs" dupe_rerun
    umount_vol
    rm -f "$WORK/work.img" "$img"
done
record step=meta finished="$(date -u +%FT%TZ)" total_s="$(($(date +%s) - t_start))"

# --- results -------------------------------------------------------------------

python3 "$HERE/compare_report.py" "$STEPS" "$LOGS" "$out"
log "results: $out (logs: $out.logs/); total $(($(date +%s) - t_start)) s"
