#!/usr/bin/env bash
# Prove the README's quick start on a fresh Debian 12 with no Rust: bootstrap
# a clean bookworm root (debootstrap), copy a clean clone of this repository
# into it, and run the README's commands inside as root:
#
#   scripts/quickstart.sh               build, then the demo on loop volumes
#   scripts/quickstart.sh /some/path    preview; without a terminal nothing is shared
#   scripts/test.sh                     only with --full: the whole suite
#
# Not part of the regular suite (it downloads Debian and the crates and builds
# from scratch): 7 minutes on a quiet 2-core machine (404 s at 80220d3:
# debootstrap 2 min, apt and the release build 4 min), an hour on a busy one;
# --full adds the debug build and the suite. Run it before each release.
#
#   sudo scripts/fresh-chroot.sh [--full] [--keep] [--mirror URL]
#
# Needs root, network access to the Debian mirror and crates.io, and loop
# devices. Everything runs in a private mount namespace, so the mounts made
# inside (the chroot's /proc, /sys, /dev and the demo volumes) vanish with it.
# The root is built under /var/tmp and removed afterwards unless --keep.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

full=0 keep=0 mirror=
while [ $# -gt 0 ]; do
  case $1 in
    --full) full=1 ;;
    --keep) keep=1 ;;
    --mirror) mirror=$2; shift ;;
    *) echo "usage: $0 [--full] [--keep] [--mirror URL]" >&2; exit 2 ;;
  esac
  shift
done
if [ "$(id -u)" -ne 0 ]; then
  echo "fresh-chroot: needs root (debootstrap, chroot, loop devices)" >&2
  exit 1
fi
# The mirror this machine uses (deb822 or one-line sources), else Debian's CDN.
if [ -z "$mirror" ]; then
  mirror=$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)\/\?$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 || true)
  [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  mirror=${mirror:-http://deb.debian.org/debian}
fi
security=${mirror%/debian}/debian-security
command -v debootstrap >/dev/null || {
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq debootstrap >/dev/null
}

t0=$(date +%s)
step() { echo; echo "=== [$(($(date +%s) - t0)) s] $*"; }
work=$(mktemp -d /var/tmp/dedupscan-fresh.XXXXXX)
root=$work/root
cleanup() {
  if [ $keep = 1 ]; then echo "kept: $root"; else rm -rf --one-file-system "$work"; fi
}
trap cleanup EXIT

step "debootstrap bookworm from $mirror into $root"
debootstrap bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -20 "$work/debootstrap.log" >&2
  exit 1
}
# What a fresh Debian 12 install has: the release, its updates and security.
cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $security bookworm-security main
EOF
cp /etc/resolv.conf "$root/etc/resolv.conf"
# Site-local CA certificates (e.g. of a TLS-inspecting proxy), so that cargo
# reaches crates.io from the chroot as it does from this machine; the
# ca-certificates package, installed by deps.sh, adds them to the bundle.
if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
fi

step "clean clone of $(git -C "$repo" rev-parse --short HEAD) ($(git -C "$repo" rev-parse --abbrev-ref HEAD))"
git clone -q --no-local "$repo" "$root/root/dedupscan"
if chroot "$root" sh -c 'command -v rustc || command -v cargo'; then
  echo "fresh-chroot: the new root already has Rust" >&2
  exit 1
fi

# Inside: a private mount namespace with /proc, /sys and /dev (loop devices).
# PATH and HOME as a root login shell has them; no terminal (stdin from
# /dev/null), as under cron or ssh without -t.
inside() {
  unshare --mount --propagation private -- bash -euo pipefail -c '
    root=$1; shift
    # The new root a mount point of its own, as / is on a real machine
    # (unshare --propagation and findmnt / need one: check-deb.sh does).
    mount --bind "$root" "$root"
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      DEDUPSCAN_REQUIRE_FS_TESTS=1 bash -c "cd /root/dedupscan && $*" </dev/null
  ' inside "$root" "$@"
}

step "README: scripts/quickstart.sh (no Rust yet: installs it, builds, runs the demo)"
inside scripts/quickstart.sh 2>&1 | tee "$work/quickstart.log"
grep -q '^freed (statfs)' "$work/quickstart.log" || { echo "fresh-chroot: the demo printed no result" >&2; exit 1; }
inside 'rustc --version; cargo --version'

step "README: scripts/quickstart.sh PATH without a terminal: previews, shares nothing"
inside 'truncate -s 300M /var/tmp/path.img && mkfs.btrfs -q /var/tmp/path.img && mkdir -p /mnt/v &&
        mount -o loop /var/tmp/path.img /mnt/v && mkdir /mnt/v/data &&
        head -c 1M /dev/urandom >/mnt/v/data/a && cp --reflink=never /mnt/v/data/a /mnt/v/data/b && sync &&
        { scripts/quickstart.sh /mnt/v/data --db /root/path.sqlite; echo "exit status $?"; } ;
        umount /mnt/v; rm -f /var/tmp/path.img' 2>&1 | tee "$work/path.log"
grep -q 'nothing shared' "$work/path.log" || { echo "fresh-chroot: quickstart.sh PATH did not refuse" >&2; exit 1; }

if [ $full = 1 ]; then
  step "README: scripts/test.sh"
  # The whole output stays in /var/tmp/fresh-chroot-test.log (the root goes).
  inside scripts/test.sh 2>&1 | tee /var/tmp/fresh-chroot-test.log | tail -40
fi
step "fresh-chroot: passed in $(($(date +%s) - t0)) s"
