#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, unit tests, and the
# integration tests on real loop-mounted btrfs, XFS and ext4 volumes (these
# need root and loop devices; without them they skip loudly, and with
# DEDUPSCAN_REQUIRE_FS_TESTS=1 a skip is a failure).
set -euo pipefail
cd "$(dirname "$0")/.."
DEDUPSCAN_DEPS_LINT=1 . scripts/deps.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy --all-targets -- -D warnings (also type-checks benches and examples)"
cargo clippy --all-targets -- -D warnings
echo "== cargo test (unit + integration on real volumes)"
log=$(mktemp)
# Every skipped test appends a line here (tests/common skip()); printed below,
# since libtest shows nothing of a test that passes by skipping.
export DEDUPSCAN_SKIP_LOG
DEDUPSCAN_SKIP_LOG=$(mktemp)
trap 'rm -f "$log" "$DEDUPSCAN_SKIP_LOG"' EXIT
start=$SECONDS
cargo test --all-features -- --test-threads="${DEDUPSCAN_TEST_THREADS:-2}" 2>&1 | tee "$log"
# One closing line with the totals of every test binary, and the skips.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
echo "cargo test took $((SECONDS - start)) s (build included)"
if [ -s "$DEDUPSCAN_SKIP_LOG" ]; then
    echo "*** SKIPPED ($(wc -l < "$DEDUPSCAN_SKIP_LOG")); DEDUPSCAN_REQUIRE_FS_TESTS=1 makes these failures:"
    sort "$DEDUPSCAN_SKIP_LOG" | sed 's/^/    /'
fi
# The Debian package: built, lintian-clean, installed into a throwaway root
# and purged (packaging/check-deb.sh; needs root, a release build: ~1-2 min).
if [ "$(id -u)" -eq 0 ]; then
    echo "== packaging/check-deb.sh"
    packaging/check-deb.sh
elif [ "${DEDUPSCAN_REQUIRE_FS_TESTS:-}" = 1 ]; then
    echo "packaging/check-deb.sh needs root, and DEDUPSCAN_REQUIRE_FS_TESTS=1 forbids skipping it" >&2
    exit 1
else
    echo "*** SKIPPED packaging/check-deb.sh: needs root ***"
fi
