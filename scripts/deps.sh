#!/usr/bin/env bash
# Install what building and testing dedupscan needs on Debian/Ubuntu:
# filesystem tools for the loop-mounted test volumes, and a Rust toolchain
# when none is present. Safe to run again; does nothing that is already done.
set -euo pipefail

need=()
for pair in mkfs.btrfs:btrfs-progs mkfs.xfs:xfsprogs xfs_io:xfsprogs mkfs.ext4:e2fsprogs \
            setfattr:attr chattr:e2fsprogs systemd-analyze:systemd man:man-db \
            strace:strace setpriv:util-linux \
            lintian:lintian promtool:prometheus dpkg-shlibdeps:dpkg-dev unshare:util-linux \
            cc:gcc pkg-config:pkg-config python3:python3; do
  cmd=${pair%%:*} pkg=${pair#*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "dedupscan: missing packages: ${need[*]} — install them (as root: apt-get install ${need[*]})" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2046
  apt-get install -y -qq $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
fi
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
# Rust 1.85 or newer (Debian bookworm's own cargo, 1.63, is too old): rustup.
rustv=$(rustc --version 2>/dev/null | awk '{print $2}')
if [ -z "$rustv" ] || [ "$(printf '%s\n1.85.0\n' "$rustv" | sort -V | head -n1)" != "1.85.0" ]; then
  echo "dedupscan: needs Rust 1.85 or newer (found: ${rustv:-none}); install it with rustup (https://rustup.rs)" >&2
  exit 1
fi
