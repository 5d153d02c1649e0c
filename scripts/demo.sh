#!/usr/bin/env bash
# The main job: a real, unmodified program (CPython running a word-frequency workload) on the
# embedded local cluster (global managers, one pComponent, two mComponents, one sComponent,
# each its own process), with an ExCache of a quarter of the program's working set. Prints the
# program's output, the ExCache counters, and native vs splitos time, with the components
# talking through shared memory (the default on one host) and then over loopback TCP (as they
# would between hosts). Then two short runs show
# the vNode's file system: one appends to a file there, the next reads it back.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
prog=(python3 scripts/workloads/wordfreq.py "${WORDS:-400000}")
rss_kb=$(python3 - "${prog[@]}" <<'PY'
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
PY
)
excache_mb=$(( rss_kb / 1024 / 4 ))
echo "== working set (native peak RSS): $(( rss_kb / 1024 )) MiB; ExCache: ${excache_mb} MiB (25%)"
echo "== ${prog[*]} under splitos:"
status=0
target/release/splitos run --excache "${excache_mb}M" --stats --compare-native -- "${prog[@]}" || status=$?
echo "== the same with the components over loopback TCP (output not repeated):"
target/release/splitos run --transport tcp --excache "${excache_mb}M" --compare-native -- "${prog[@]}" >/dev/null || status=$?
echo "== files: one run appends to its vNode's file system, the next reads it back"
target/release/splitos run -- bash -c 'echo "run $$ was here at $(date -u +%FT%TZ)" >> "$SPLITOS_VNODE_DIR/demo.log"'
target/release/splitos run -- bash -c 'echo "$SPLITOS_VNODE_DIR/demo.log (persists across runs):"; tail -n 3 "$SPLITOS_VNODE_DIR/demo.log"'
exit "$status"
