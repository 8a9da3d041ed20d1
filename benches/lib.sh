# Shell helpers of the benchmark scripts (compare.sh, ab.sh), sourced. They
# use the caller's globals: MNT (mount point), LOOP (loop device, empty when
# none), CGROUP (memory cgroup directory, empty when none), and its log().

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

