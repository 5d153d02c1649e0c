#!/usr/bin/env bash
# Makes the release archive: splitos and its shim side by side in bin/ (where `splitos run`
# finds the shim), the systemd units, and the docs. Unpacked into /usr/local (`tar -C
# /usr/local -xzf ARCHIVE`) it puts splitos where the units run it.
#   scripts/package.sh [--from DIR] [--out DIR]
# --from: take splitos and libsplitos_shim.so from DIR instead of building them (release).
set -euo pipefail
cd "$(dirname "$0")/.."
from="" out="dist"
while [ $# -gt 0 ]; do
    case "$1" in
        --from) from="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        *) echo "usage: scripts/package.sh [--from DIR] [--out DIR]" >&2; exit 2 ;;
    esac
done
if [ -z "$from" ]; then
    cargo build --release --workspace --quiet
    from="${CARGO_TARGET_DIR:-target}/release"
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
name="splitos-$version-$(uname -m)-linux"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$name/bin" "$stage/$name/lib/systemd/system" "$stage/$name/lib/tmpfiles.d" "$stage/$name/share/doc/splitos"
install -m 0755 "$from/splitos" "$stage/$name/bin/splitos"
install -m 0644 "$from/libsplitos_shim.so" "$stage/$name/bin/libsplitos_shim.so"
install -m 0644 deploy/systemd/*.service "$stage/$name/lib/systemd/system/"
install -m 0644 deploy/tmpfiles.d/splitos.conf "$stage/$name/lib/tmpfiles.d/"
install -m 0644 README.md docs/*.md "$stage/$name/share/doc/splitos/"
mkdir -p "$out"
# Owned by root and not writable by others whoever packs it: unpacked as root into /usr/local,
# its directories must not hand /usr/local to the packer.
tar --owner=0 --group=0 --numeric-owner --mode=go-w -C "$stage/$name" -czf "$out/$name.tar.gz" bin lib share
echo "$out/$name.tar.gz"
