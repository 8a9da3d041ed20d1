#!/usr/bin/env bash
# Build the Debian package target/debian/dedupscan_<version>-<rev>_<arch>.deb
# from a release build, with dpkg-deb (dpkg-dev for dpkg-shlibdeps).
#
# Why not cargo-deb: `cargo install cargo-deb` compiles for minutes on every
# fresh CI machine, and the package needs things it does not do by itself
# (conffiles, a Debian changelog). This script is the whole recipe: files
# from packaging/debian/install, Depends from dpkg-shlibdeps, md5sums, the
# maintainer scripts of packaging/debian/. Checked by packaging/check-deb.sh
# (lintian, install and purge in a throwaway root).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
umask 022

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
debversion=$(sed -n '1s/^dedupscan (\([^)]*\)).*/\1/p' packaging/debian/changelog)
if [ "${debversion%-*}" != "$version" ]; then
    echo "build-deb: packaging/debian/changelog is at $debversion but Cargo.toml at $version: add a changelog entry" >&2
    exit 1
fi
arch=$(dpkg --print-architecture)
out=target/debian/dedupscan_${debversion}_${arch}.deb

# The man page and completions in the package are the committed files:
# make sure they match the CLI before packaging them.
echo "== check: man page and completions match the CLI (cargo test --test packaging generated_docs)"
cargo test --test packaging generated_docs_are_up_to_date
echo "== cargo build --release"
cargo build --release --locked --bin dedupscan

stage=target/debian/stage
rm -rf "$stage"
mkdir -p "$stage/DEBIAN"
echo "== staging files (packaging/debian/install)"
grep -v '^\s*\(#\|$\)' packaging/debian/install | while read -r src dest mode; do
    case "$dest" in */) dest="$dest$(basename "$src")" ;; esac
    mkdir -p "$stage/$(dirname "$dest")"
    case "$dest" in
        *.gz) gzip -9n <"$src" >"$stage/$dest" ;;
        *) cp "$src" "$stage/$dest" ;;
    esac
    chmod "$mode" "$stage/$dest"
done
# Debug info stays in target/release (the release profile keeps it for
# profiling); the packaged binary is stripped as dh_strip would.
strip --remove-section=.comment --remove-section=.note --strip-unneeded "$stage/usr/bin/dedupscan"
# The per-volume option files' directory (administrator's files).
mkdir -p "$stage/etc/dedupscan"

# Depends from the libraries the binary links (libc6, libgcc-s1).
shlibs=$(mktemp -d)
trap 'rm -rf "$shlibs"' EXIT
mkdir "$shlibs/debian"
printf 'Source: dedupscan\n\nPackage: dedupscan\nArchitecture: any\n' >"$shlibs/debian/control"
depends=$(cd "$shlibs" && dpkg-shlibdeps -O -e "$OLDPWD/$stage/usr/bin/dedupscan" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "build-deb: dpkg-shlibdeps found no dependencies" >&2; exit 1; }

for s in postinst prerm postrm; do install -m 755 "packaging/debian/$s" "$stage/DEBIAN/$s"; done
echo /etc/default/dedupscan >"$stage/DEBIAN/conffiles"
(cd "$stage" && find . -type f ! -path './DEBIAN/*' -printf '%P\n' | LC_ALL=C sort | xargs md5sum) >"$stage/DEBIAN/md5sums"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<CONTROL
Package: dedupscan
Version: $debversion
Architecture: $arch
Maintainer: dedupscan maintainers <maintainers@users.noreply.a-seed-224ed513.example>
Installed-Size: $size
Depends: $depends
Recommends: systemd
Section: admin
Priority: optional
Description: share duplicate data on btrfs and XFS volumes
 dedupscan crawls a btrfs or XFS (reflink=1) volume, hashes file blocks
 into an SQLite database so that the next run only rehashes what changed,
 finds ranges with the same content and asks the kernel to share them with
 the FIDEDUPERANGE ioctl, which compares the bytes before it shares
 anything.
 .
 It keeps a history of the space it freed (report --html draws it) and
 exports metrics for Prometheus. Ships systemd units to run it daily per
 volume, a man page and shell completions.
CONTROL
echo "== dpkg-deb --build"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$out"
ls -l "$out"
echo "Depends: $depends"
