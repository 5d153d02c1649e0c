#!/usr/bin/env bash
# Installs what splitos needs beyond the toolchains, then builds it. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v gcc >/dev/null || need+=(gcc libc6-dev)
command -v g++ >/dev/null || need+=(g++)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
command -v python3 >/dev/null || need+=(python3)
command -v node >/dev/null || need+=(nodejs)
command -v javac >/dev/null || need+=(default-jdk-headless)
# Programs the storage tests run on a vNode mount.
command -v sqlite3 >/dev/null || need+=(sqlite3)
command -v git >/dev/null || need+=(git)
command -v tar >/dev/null || need+=(tar)
# A server the network tests run under splitos, and its benchmark client outside.
command -v redis-server >/dev/null || need+=(redis-server)
command -v memcached >/dev/null || need+=(memcached) # served under splitos to `splitos loadgen` (elastic tests), and the reference of `splitos memcached`'s conformance test
command -v memccapable >/dev/null || need+=(libmemcached-tools) # real clients of `splitos memcached` (memccapable, memccp, memccat, memcslap)
/usr/bin/python3 -c "import pymemcache" 2>/dev/null || need+=(python3-pymemcache) # a Python client of `splitos memcached`
command -v prometheus >/dev/null || need+=(prometheus) # the metrics test scrapes a cluster with a real Prometheus
[ -e /usr/include/jemalloc/jemalloc.h ] || need+=(libjemalloc-dev) # a test program links jemalloc, as redis-server does
command -v curl >/dev/null || need+=(curl) # the TLS test checks the API as a client other than splitos sees it
# Several global managers keep the cluster's state in etcd (the fault tests run a three-member
# etcd); its client crate compiles etcd's protocol at build time.
command -v etcd >/dev/null || need+=(etcd-server)
command -v protoc >/dev/null || need+=(protobuf-compiler)
[ -e /usr/include/google/protobuf/descriptor.proto ] || need+=(libprotobuf-dev)
command -v systemd-analyze >/dev/null || need+=(systemd) # the deployment test checks the service units
# The dashboard's test drives a real headless browser.
command -v chromium-headless-shell >/dev/null || command -v chromium >/dev/null || need+=(chromium-headless-shell)
if [ ${#need[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${need[*]}"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
[ -e /dev/fuse ] || echo "setup: note: /dev/fuse is missing: runs get no vNode file system" >&2
if [ "$(cat /proc/sys/vm/unprivileged_userfaultfd 2>/dev/null || echo 0)" != 1 ] && [ "$(id -u)" -ne 0 ]; then
    echo "setup: note: userfaultfd needs root or vm.unprivileged_userfaultfd=1" >&2
fi
# The test command checks formatting (rustfmt.toml); rustup's minimal profile leaves rustfmt out.
rustfmt --version >/dev/null 2>&1 || rustup component add rustfmt
# It lints every target too (clippy), which that profile may leave out as well.
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
# The test command builds every target at once itself (scripts/run-tests.py): one resolution of
# the dependencies' features, where this build (without the test-only dependencies) would
# resolve some differently and so build most dependencies twice.
[ "${1:-}" = "--no-build" ] || cargo build --release --workspace --quiet
