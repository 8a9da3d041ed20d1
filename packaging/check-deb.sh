#!/usr/bin/env bash
# CI check of the Debian package: build it, run lintian (no error, no
# warning), install it into a throwaway root and purge it again.
#
# The throwaway root is this machine's root filesystem under an overlay
# (lower: /, upper: a temporary directory) in a private mount namespace,
# with /dev, /proc and /sys bound in: dpkg -i and dpkg --purge run there
# for real — maintainer scripts included — in seconds, without debootstrap
# or network, and nothing reaches the real root. /run is left empty, so the
# scripts see no running systemd, as in a chroot or a container.
# Needs root (mount); lintian and dpkg-dev (scripts/deps.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in lintian dpkg-shlibdeps dpkg-deb unshare; do
    command -v "$tool" >/dev/null || { echo "check-deb: $tool is missing (scripts/deps.sh installs it)" >&2; exit 1; }
done
[ "$(id -u)" -eq 0 ] || { echo "check-deb: needs root (overlay mount for the install test)" >&2; exit 1; }

packaging/build-deb.sh
deb=$(ls -t target/debian/dedupscan_*.deb | head -n1)

echo "== lintian $deb"
lintian --fail-on error,warning --display-info "$deb" 2> >(grep -v 'running with root privileges' >&2)

echo "== install and purge in a throwaway root"
work=$(mktemp -d /var/tmp/dedupscan-check-deb.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/upper" "$work/work" "$work/root"
cp "$deb" "$work/upper/dedupscan.deb"
# What runs inside the throwaway root.
cat >"$work/upper/check-deb-inside.sh" <<'INSIDE'
set -euo pipefail
status() { dpkg-query -W -f='${db:Status-Status}' dedupscan 2>/dev/null || true; }
[ "$(status)" != installed ] || dpkg --purge dedupscan >/dev/null
dpkg -i /dedupscan.deb
[ "$(status)" = installed ]
files=$(dpkg -L dedupscan | while read -r f; do [ -d "$f" ] || echo "$f"; done)
echo "installed: $(echo "$files" | wc -l) files"
test -f /etc/default/dedupscan
dedupscan --version
man -w dedupscan >/dev/null
dpkg --purge dedupscan
left=$(for f in $files; do [ ! -e "$f" ] || echo "$f"; done)
[ -z "$left" ] || { echo "check-deb: left after purge: $left" >&2; exit 1; }
for p in /etc/default/dedupscan /var/lib/dedupscan /usr/share/doc/dedupscan; do
    [ ! -e "$p" ] || { echo "check-deb: $p left after purge" >&2; exit 1; }
done
case "$(status)" in ""|not-installed) ;; *) echo "check-deb: dpkg still knows dedupscan: $(status)" >&2; exit 1 ;; esac
echo "purged: nothing left"
INSIDE
unshare --mount --propagation private bash -euo pipefail -c '
    w=$1
    mount -t overlay overlay -o "lowerdir=/,upperdir=$w/upper,workdir=$w/work" "$w/root"
    for d in dev proc sys; do mount --rbind "/$d" "$w/root/$d"; done
    mount -t tmpfs tmpfs "$w/root/run"
    mount -t tmpfs tmpfs "$w/root/tmp"
    exec chroot "$w/root" /bin/bash /check-deb-inside.sh
' check-deb "$work"
# Besides dpkg's own bookkeeping, the package left nothing in the root.
# Whiteouts (character devices in the upper layer) are paths the purge
# removed that the host already had (e.g. a /var/lib/dedupscan of a run on
# this machine): removed, not left behind.
stray=$(cd "$work/upper" && find . -path ./var/lib/dpkg -prune -o -path ./var/log -prune -o -path ./var/cache -prune \
    -o -name '*dedupscan*' ! -type c ! -name dedupscan.deb ! -name check-deb-inside.sh -print)
[ -z "$stray" ] || { echo "check-deb: left in the root after purge:" >&2; echo "$stray" >&2; exit 1; }
echo "check-deb: OK ($deb)"
