#!/usr/bin/env bash
# Draw a `dedupscan report --html` page with headless Chromium (Debian
# package `chromium`) into a PNG, to see what people will see.
#
#   scripts/screenshot-report.sh [REPORT.html] [OUT.png]
#
# Without REPORT.html, the page of tests/html.rs is used (a btrfs loop
# volume with several runs and hostile file names: needs root). OUT.png
# defaults to target/report.png. The window is a laptop's width.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
page=${1:-}
out=${2:-target/report.png}
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
    echo "screenshot-report: no chromium (apt-get install chromium)" >&2
    exit 1
fi
if [ -z "$page" ]; then
    page=target/report.html
    echo "== rendering the test report into $page"
    DEDUPSCAN_HTML_OUT="$PWD/$page" DEDUPSCAN_REQUIRE_FS_TESTS=1 \
        cargo test --quiet --test html -- --test-threads=1 >/dev/null
fi
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
echo "== $browser --headless --screenshot=$out"
# --no-sandbox: root cannot use Chromium's sandbox; the page has no script
# (and its policy forbids one), and nothing is fetched.
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$profile" \
    --window-size="${WIDTH:-1280},${HEIGHT:-2300}" --screenshot="$PWD/$out" "file://$(realpath "$page")" 2>/dev/null
ls -l "$out"
