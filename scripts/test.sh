#!/usr/bin/env bash
# The formatting check, then every test: unit tests, then end-to-end tests that start real
# component processes and run real programs (C, C++, Python, Node.js, Java, bash) against
# native runs.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo fmt --all --check
cargo test --release --workspace --no-fail-fast "$@"
