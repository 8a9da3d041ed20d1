#!/usr/bin/env bash
# benches/rivals.sh [--size SMALL|FULL|BYTES] [--fs btrfs|xfs|both] [--out FILE]
#                   [--bin PATH] [--tools LIST] [--no-verify]
#
# Side-by-side benchmark of dedupscan and the tools administrators compare it
# with -- duperemove, jdupes, rmlint, fclones -- on a loop-mounted btrfs
# and/or XFS volume holding the corpus of benches/corpus.sh (SMALL = 400M,
# FULL = 4G). Same volume discipline as compare.sh (the shared functions are
# in benches/lib.sh): the corpus goes once into a pristine image per
# filesystem; every tool gets its own fresh `cp --sparse=always` copy of it,
# read once to settle (recorded, in no ratio), then caches dropped before the
# tool's first step. Each tool deduplicates the tree in place with the
# kernel's clone/dedupe ioctls, the way its documentation says, with its
# out-of-the-box options:
#
#   dedupscan   dedupscan DIR --db FILE                    (full run)
#   duperemove  duperemove -dr --hashfile=FILE DIR         (extents; FIDEDUPERANGE)
#   jdupes      jdupes -r -B DIR                           (whole files; FIDEDUPERANGE)
#   rmlint      rmlint -T df -o sh:SCRIPT -c sh:handler=clone DIR, then
#               sh SCRIPT -d                               (whole files; the script
#               calls `rmlint --dedupe`, FIDEDUPERANGE)
#   fclones     fclones group DIR >LIST, then
#               fclones dedupe <LIST                       (whole files; FICLONE,
#               then restores the mtime/atime it had)
#
# bees is left out: it is not packaged for Debian 12 and could not be fetched
# here, and it is a btrfs-only daemon with no "done" state to time anyway.
#
# The second step of a two-step tool (rmlint's script, fclones dedupe)
# follows its search without dropping caches, as when an administrator runs
# them one after the other. Per tool: wall time (sum of its steps), peak RSS
# (max of its steps; /usr/bin/time -v, i.e. the largest single process),
# exit status of each step, size of the state it leaves (database, hashfile,
# rmlint's script, fclones' list; jdupes has none), free space gained (statfs
# after sync, btrfs transactions committed), freed / ideal (ideal-dup.py:
# duplicate 4 KiB blocks, and its whole-file part) and, unless --no-verify, a
# check of every entry on the volume against the pristine one: each file's
# SHA-256, size, mode, owner, mtime and xattrs must be unchanged and no entry
# may appear or disappear; inode numbers, link counts, ctimes and directory
# mtimes are compared and reported too (FS-TOOL.metadata-diff in the logs
# lists every changed path).
#
# Prints one Markdown table per filesystem (ratios against dedupscan) and
# writes the raw numbers as JSON to --out FILE (default
# ./rivals-results.json), the logs of every step next to it in FILE.logs/.
# `benches/rivals_report.py --table FILE` prints the tables again.
# --tools picks tools, comma-separated (default all five, in that order); a
# tool not installed is reported as skipped. Binaries: --bin (or
# DEDUPSCAN_BIN; default target/release/dedupscan), DUPEREMOVE, JDUPES,
# RMLINT, FCLONES (default: found on PATH; `cargo install fclones`).
#
# Needs root, loop devices, /usr/bin/time, mkfs.btrfs / mkfs.xfs, python3.
# Everything it mounts or creates is removed on exit, also on error or Ctrl-C
# (after the step that is running finishes).

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")

usage() {
    sed -n '2,3p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

ALL_TOOLS=dedupscan,duperemove,jdupes,rmlint,fclones
size_arg=SMALL
fs_arg=both
out=rivals-results.json
bin=${DEDUPSCAN_BIN:-$ROOT/target/release/dedupscan}
tools_arg=$ALL_TOOLS
verify=1
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
    --tools) tools_arg=${2:?}; shift 2 ;;
    --tools=*) tools_arg=${1#*=}; shift ;;
    --no-verify) verify=0; shift ;;
    -h | --help) usage ;;
    *) echo "rivals.sh: unknown argument '$1'" >&2; usage ;;
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
IFS=, read -r -a tools <<<"$tools_arg"
for t in "${tools[@]}"; do
    [[ ,$ALL_TOOLS, == *,$t,* ]] || { echo "rivals.sh: unknown tool '$t' (known: $ALL_TOOLS)" >&2; usage; }
done
DUPEREMOVE=${DUPEREMOVE:-duperemove}
JDUPES=${JDUPES:-jdupes}
RMLINT=${RMLINT:-rmlint}
FCLONES=${FCLONES:-fclones}

log() { printf '[rivals %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf 'rivals.sh: %s\n' "$*" >&2; exit 1; }
# build_corpus, make_pristine, fresh_copy, step, record, free_bytes, db_bytes,
# cold, mount_vol/umount_vol, as compare.sh.
# shellcheck source=benches/lib.sh
. "$HERE/lib.sh"
IDEAL=$(ideal_path)

[[ $EUID -eq 0 ]] || die "must run as root (loop devices, mount, drop_caches)"
[[ -r $IDEAL ]] || die "$IDEAL: ideal-dup.py not found (set IDEAL_DUP)"
[[ -x /usr/bin/time ]] || die "/usr/bin/time not found (apt-get install time)"
for t in losetup mount umount python3 numfmt; do
    command -v "$t" >/dev/null || die "$t not found"
done
for fs in "${filesystems[@]}"; do
    command -v "mkfs.$fs" >/dev/null || die "mkfs.$fs not found"
done
out=$(realpath -m "$out")
mkdir -p "$(dirname "$out")"

WORK=$(mktemp -d "${BENCH_WORK:-/var/tmp}/dedupscan-rivals.XXXXXX")
LOGS=$WORK/logs
STEPS=$WORK/steps.jsonl
MNT=$WORK/mnt
DATA=$MNT/data
LOOP=
IN_CGROUP=() # the prefix of lib.sh's step: no memory cgroup here
mkdir -p "$LOGS" "$MNT" "$WORK/state"
: >"$STEPS"

trap bench_cleanup EXIT
trap 'exit 130' INT TERM HUP

# --- the tools -----------------------------------------------------------------

# tool_path TOOL: the command that runs it (empty if not installed).
tool_path() {
    local c
    case $1 in
    dedupscan) c=$bin ;;
    duperemove) c=$DUPEREMOVE ;;
    jdupes) c=$JDUPES ;;
    rmlint) c=$RMLINT ;;
    fclones) c=$FCLONES ;;
    esac
    command -v "$c" 2>/dev/null || true
}

tool_version() { # TOOL PATH
    case $1 in
    jdupes) "$2" -v 2>&1 | head -1 | awk '{print $2}' ;;
    rmlint) "$2" --version 2>&1 | head -1 | awk '{print $2}' ;;
    duperemove) "$2" --version 2>&1 | head -1 | awk '{print $NF}' ;;
    *) "$2" --version 2>&1 | head -1 | awk '{print $NF}' ;;
    esac
}

# run_tool FS TOOL: the tool on its own fresh copy of the pristine volume.
run_tool() {
    local fs=$1 tool=$2 exe=${PATHS[$2]} st=$WORK/state/$1-$2 before after state='' what='' names
    if [[ -z $exe ]]; then
        log "$fs $tool: not installed, skipped"
        record fs="$fs" step="tool:$tool" skipped=1 reason="not installed"
        return 0
    fi
    fresh_copy "$fs" "$tool"
    before=$(free_bytes "$fs")
    case $tool in
    dedupscan)
        names=run
        step "$fs" dedupscan_run "$exe" "$DATA" --db "$st.db" --json --progress never
        state=$(db_bytes "$st.db") what=database
        ;;
    duperemove)
        names=run
        step "$fs" duperemove_run "$exe" -dr --hashfile="$st.hash" "$DATA"
        state=$(db_bytes "$st.hash") what=hashfile
        ;;
    jdupes)
        names=run
        step "$fs" jdupes_run "$exe" -r -B "$DATA"
        ;;
    rmlint)
        names="search script"
        # -o replaces the default outputs (rmlint.sh and rmlint.json in the
        # current directory, a progress bar and a summary) by the script only.
        step "$fs" rmlint_search "$exe" -T df -o sh:"$st.sh" -c sh:handler=clone "$DATA"
        # The script deletes itself when done (unless -x): size it first.
        state=$(stat -c %s "$st.sh" 2>/dev/null || echo 0) what=script
        STEP_COLD=0 step "$fs" rmlint_script sh "$st.sh" -d
        ;;
    fclones)
        names="group dedupe"
        step "$fs" fclones_group "$exe" group "$DATA"
        cp "$LOGS/$fs-fclones_group.out" "$st.list"
        state=$(stat -c %s "$st.list") what=list
        STEP_COLD=0 step "$fs" fclones_dedupe sh -c 'exec "$0" dedupe <"$1"' "$exe" "$st.list"
        ;;
    esac
    after=$(free_bytes "$fs")
    record fs="$fs" step="tool:$tool" steps="$names" path="$exe" version="$(tool_version "$tool" "$exe")" \
        free_before="$before" free_after="$after" freed="$((after - before))" \
        ${state:+state_bytes="$state"} ${what:+state_what="$what"}
    log "$fs $tool: freed $(numfmt --to=iec -- $((after - before))) (statfs)"
    if [[ $verify -eq 1 ]]; then
        python3 "$HERE/rivals_report.py" manifest "$DATA" "$WORK/manifest-$fs-$tool.json"
        local diffs
        mapfile -t diffs < <(python3 "$HERE/rivals_report.py" diff "$WORK/manifest-$fs.json" \
            "$WORK/manifest-$fs-$tool.json" "$LOGS/$fs-$tool.metadata-diff")
        record fs="$fs" step="tool:$tool" "${diffs[@]}"
        log "$fs $tool: $(printf '%s ' "${diffs[@]}" | grep -o '[a-z_]*=[1-9][0-9]*' | tr '\n' ' ')"
        grep -q '^content_unchanged=1$' < <(printf '%s\n' "${diffs[@]}") ||
            log "ERROR: $fs $tool: file contents changed! (see $fs-$tool.metadata-diff)"
        rm -f "$WORK/manifest-$fs-$tool.json"
    fi
}

# --- run -------------------------------------------------------------------------

declare -A PATHS
for t in "${tools[@]}"; do
    PATHS[$t]=$(tool_path "$t")
done
if [[ -n ${PATHS[dedupscan]:-} ]]; then
    cp "${PATHS[dedupscan]}" "$WORK/dedupscan" # the build must not change under the run
    PATHS[dedupscan]=$WORK/dedupscan
fi
cd "$WORK" # anything a tool writes to its current directory stays out of the way

t_start=$(date +%s)
vol_bytes=$((size * 3 > 2 * 1024 ** 3 ? size * 3 : 2 * 1024 ** 3))
record step=meta started="$(date -u +%FT%TZ)" size_name="$size_name" size_bytes="$size" tools="$tools_arg" \
    volume_bytes="$vol_bytes" kernel="$(uname -r)" nproc="$(nproc)" \
    cpu="$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)" \
    mem_kb="$(awk '/MemTotal/ {print $2}' /proc/meminfo)" \
    dedupscan_version="$([[ -n ${PATHS[dedupscan]:-} ]] && "${PATHS[dedupscan]}" --version || echo none)" \
    git_head="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    git_dirty_files="$(git -C "$ROOT" status --short 2>/dev/null | wc -l)" \
    btrfs_progs="$(mkfs.btrfs --version 2>&1 | head -1)" xfsprogs="$(mkfs.xfs -V 2>&1 | head -1)"

build_corpus
for fs in "${filesystems[@]}"; do
    log "=== $fs ==="
    make_pristine "$fs"
    [[ $verify -eq 1 ]] && python3 "$HERE/rivals_report.py" manifest "$DATA" "$WORK/manifest-$fs.json"
    umount_vol
    for t in "${tools[@]}"; do
        run_tool "$fs" "$t"
    done
    umount_vol
    rm -f "$WORK/work.img" "$WORK/pristine-$fs.img"
done
record step=meta finished="$(date -u +%FT%TZ)" total_s="$(($(date +%s) - t_start))"

python3 "$HERE/rivals_report.py" report "$STEPS" "$out"
log "results: $out (logs: $out.logs/); total $(($(date +%s) - t_start)) s"
