#!/usr/bin/env bash
# Packaging checks for CI: installs what `tests/packaging.rs` needs
# (systemd-analyze from systemd, man from man-db, promtool from prometheus)
# when it is missing, then runs those tests. The package itself is checked
# by packaging/check-deb.sh (scripts/test.sh runs both). A missing tool after this is a failure, not a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

missing=()
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v man >/dev/null 2>&1 || missing+=(man-db groff-base)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "== installing ${missing[*]}"
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "ci-check: need ${missing[*]} and there is no apt-get; install them by hand" >&2
        exit 1
    fi
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

echo "== cargo test --test packaging"
DEDUPSCAN_REQUIRE_FS_TESTS=1 cargo test --test packaging
