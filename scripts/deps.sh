#!/usr/bin/env bash
# Install what building and testing dedupscan needs on Debian/Ubuntu:
# filesystem tools for the loop-mounted test volumes, and a Rust toolchain
# when none is present. Safe to run again; does nothing that is already done.
# Sourced by scripts/quickstart.sh and scripts/test.sh (set -euo pipefail).
#
# Rust: a rustup toolchain (~/.cargo/bin) or any rustc/cargo on PATH that is
# new enough is used as is. Otherwise, as root on Debian 12, Debian's own
# `rustc-web`/`cargo-web` packages are installed (1.96 in bookworm-security;
# bookworm's plain `rustc` is 1.63, and the 1.85 `rustc-web` of the bookworm
# point release is older than what our dependencies need: rusqlite 0.41
# requires 1.89). DEDUPSCAN_DEPS_LINT=1 (set by test.sh) also installs
# rustfmt and clippy.

msg() { echo "dedupscan setup: $*" >&2; }

# apt-get that waits for another apt run to finish instead of failing.
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "${_dedupscan_apt_updated:-}" ]; then
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    _dedupscan_apt_updated=1
  fi
  msg "apt-get install $*"
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "$@" >/dev/null
}

need=()
for pair in mkfs.btrfs:btrfs-progs mkfs.xfs:xfsprogs xfs_io:xfsprogs mkfs.ext4:e2fsprogs \
            setfattr:attr chattr:e2fsprogs systemd-analyze:systemd man:man-db \
            strace:strace setpriv:util-linux losetup:mount \
            lintian:lintian promtool:prometheus dpkg-shlibdeps:dpkg-dev unshare:util-linux \
            cc:gcc pkg-config:pkg-config python3:python3; do
  cmd=${pair%%:*} pkg=${pair#*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
# cargo fetches crates over https.
[ -e /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    msg "missing packages: ${need[*]} — install them (as root: apt-get install ${need[*]})"
    exit 1
  fi
  # shellcheck disable=SC2046
  apt_install $(printf '%s\n' "${need[@]}" | sort -u)
fi

# The oldest Rust that builds the crate: Cargo.toml's rust-version.
rust_min=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' "$(dirname "${BASH_SOURCE[0]}")/../Cargo.toml")
rust_min=${rust_min:-1.89}
rust_version() { # the version of the rustc on PATH, or nothing (never fails)
  rustc --version 2>/dev/null | awk '{print $2}' || true
}
new_enough() { [ -n "$1" ] && [ "$(printf '%s\n%s\n' "$1" "$rust_min" | sort -V | head -n1)" = "$rust_min" ]; }

[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
rustv=$(rust_version)
if ! new_enough "$rustv" || ! command -v cargo >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    msg "needs Rust $rust_min or newer (found: ${rustv:-none}). As root on Debian 12 this script installs" \
        "Debian's rustc-web and cargo-web itself; otherwise install Rust with rustup (https://rustup.rs)"
    exit 1
  fi
  candidate=$(apt-cache policy rustc-web 2>/dev/null | awk '/Candidate:/ {print $2}' || true)
  if ! new_enough "${candidate%%+*}"; then
    # An apt index from before the rustc-web update: refresh it once.
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    _dedupscan_apt_updated=1
    candidate=$(apt-cache policy rustc-web 2>/dev/null | awk '/Candidate:/ {print $2}' || true)
  fi
  if ! new_enough "${candidate%%+*}"; then
    msg "needs Rust $rust_min or newer (found: ${rustv:-none}); apt offers rustc-web ${candidate:-(none)}." \
        "Enable bookworm-security (deb http://deb.debian.org/debian-security bookworm-security main)" \
        "or install Rust with rustup (https://rustup.rs)"
    exit 1
  fi
  msg "no Rust $rust_min or newer found (found: ${rustv:-none}): installing Debian's rustc-web/cargo-web $candidate"
  apt_install rustc-web cargo-web
  rustv=$(rust_version)
  msg "using $(command -v rustc) $rustv"
fi
if [ "${DEDUPSCAN_DEPS_LINT:-0}" = 1 ]; then
  for tool in fmt:rustfmt-web clippy:rust-web-clippy; do
    sub=${tool%%:*} pkg=${tool#*:}
    if ! cargo "$sub" --version >/dev/null 2>&1; then
      if [ "$(id -u)" -eq 0 ] && dpkg -s cargo-web >/dev/null 2>&1; then
        apt_install "$pkg"
      else
        msg "cargo $sub is missing: rustup component add ${sub/fmt/rustfmt} (or, with Debian's cargo-web, apt-get install $pkg)"
        exit 1
      fi
    fi
  done
fi
