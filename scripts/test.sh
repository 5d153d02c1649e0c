#!/usr/bin/env bash
# The formatting check, then the linted build and every test: unit tests, then end-to-end tests that
# start real component processes and run real programs (C, C++, Python, Node.js, Java, bash)
# against native runs, side by side (scripts/run-tests.py, docs/testing.md).
# Arguments pick tests by name: ./scripts/test.sh quota network
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --no-build
cargo fmt --all --check
# The crate table of docs/architecture.md is cargo metadata's.
./scripts/crate-graph.py --check
# The benchmark suite's test runs in a Python environment of its own (scripts/bench/benchlib.py);
# made while the tests build, its downloads wait beside the compiler rather than after it.
if [ $# -eq 0 ]; then
    mkdir -p target
    python3 scripts/bench/benchlib.py > target/bench-env.log 2>&1 &
fi
# The build is the lint: the workspace's crates are compiled by clippy's driver, warnings denied.
exec ./scripts/run-tests.py "$@"
