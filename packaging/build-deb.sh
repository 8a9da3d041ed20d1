#!/usr/bin/env bash
# Build the Debian package: target/debian/dedupscan_<version>-1_<arch>.deb.
# Installs cargo-deb (from crates.io) when it is missing. Extra arguments go
# to `cargo deb`, e.g. `packaging/build-deb.sh --fast`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

if ! cargo deb --version >/dev/null 2>&1; then
    echo "== installing cargo-deb"
    cargo install cargo-deb --locked
fi
# The man page and completions in the package are the committed files:
# make sure they match the CLI before packaging them.
if ! cargo test --quiet --test packaging generated_docs_are_up_to_date >/dev/null 2>&1; then
    echo "build-deb: man/dedupscan.1 or packaging/completions/ are stale; run \`cargo run --example gen_docs\`" >&2
    exit 1
fi
echo "== cargo deb"
cargo deb "$@"
ls -l target/debian/*.deb
