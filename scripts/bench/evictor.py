#!/usr/bin/env python3
"""The background evictor against inline eviction: each miss-path workload that evicts, under
splitos with the default levers and `--evict-reserve 0` (off), with the evictor keeping
--reserve spare ways per set in the same ExCache (fewer lines fit: spare ways hold none), and
with it in an ExCache grown to hold as many lines (ways / (ways - reserve) times the bytes: the
same memory), the configurations interleaved run by run. Reports median wall time (min-max),
CPU time of the run and its components, misses, inline and background evictions, background
write-back messages and the evictor's time (and its thread's CPU time); writes results/evictor.json.

    python3 scripts/bench/evictor.py [--reps 3] [--reserve 1] [--only TEXT]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import ROOT, SPLITOS, cpu_of_children, ensure_env, machine, miss_workloads

WAYS = 8


def run(cmd, excache, reserve):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        full = [SPLITOS, "run", "--embedded", "--excache", excache, "--ways", str(WAYS), "--evict-reserve", str(reserve), "--stats-json", f.name, "--", *cmd]
        c0, t0 = cpu_of_children(), time.monotonic()
        subprocess.run(full, check=True, stdout=subprocess.DEVNULL)
        wall, cpu = time.monotonic() - t0, cpu_of_children() - c0
        return wall, cpu, json.load(open(f.name))


def kib(size):
    assert size.endswith("M"), size
    return int(size[:-1]) * 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--reserve", type=int, default=1, help="spare ways per set the evictor keeps")
    ap.add_argument("--only", default="", help="run only the workloads whose name contains this")
    args = ap.parse_args()
    ensure_env()
    res = {"machine": machine(), "params": vars(args), "load_before": os.getloadavg(), "workloads": []}
    with tempfile.TemporaryDirectory() as tmp:
        # A cache that fits never evicts: nothing for an evictor to do.
        for name, cmd, ex in [w for w in miss_workloads(tmp) if args.only in w[0] and not w[0].endswith("fits")]:
            same_memory = f"{kib(ex) * WAYS // (WAYS - args.reserve)}K"
            configs = [("off", ex, 0), (f"reserve {args.reserve}, same ExCache", ex, args.reserve), (f"reserve {args.reserve}, ExCache {same_memory}", same_memory, args.reserve)]
            runs = {c[0]: [] for c in configs}
            for rep in range(args.reps):
                for label, e, r in (configs if rep % 2 == 0 else configs[::-1]):
                    runs[label].append(run(cmd, e, r))
            row = {"workload": name, "excache": ex, "configs": {}}
            for label, rs in runs.items():
                walls = [w for w, _, _ in rs]
                med = lambda k: statistics.median(s[k] for _, _, s in rs)
                row["configs"][label] = {"wall_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls), "cpu_s": statistics.median(c for _, c, _ in rs),
                                         **{k: med(k) for k in ("misses", "evictions", "inline_evictions", "bg_evictions", "bg_writebacks", "bg_writeback_batches", "evictor_ns", "evictor_cpu_ns", "piggybacked")}}
            res["workloads"].append(row)
            print(f"{name} done", file=sys.stderr)
    res["load_after"] = os.getloadavg()
    os.makedirs(os.path.join(ROOT, "results"), exist_ok=True)
    with open(os.path.join(ROOT, "results", "evictor.json"), "w") as f:
        json.dump(res, f, indent=2)
    m = res["machine"]
    print(f"Machine: {m['cores']} cores ({m['cpu']}), Linux {m['kernel']}; medians of {args.reps} runs, interleaved; load average {res['load_before'][0]:.1f} before, {res['load_after'][0]:.1f} after.\n")
    print("| workload | evictor | wall s (min–max) | CPU s | misses | inline evictions | background evictions | background write-backs / messages | evictor ms (CPU) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in res["workloads"]:
        for label, c in row["configs"].items():
            print(f"| {row['workload']} (ExCache {row['excache']}) | {label} | {c['wall_s']:.2f} ({c['min_s']:.2f}–{c['max_s']:.2f}) | {c['cpu_s']:.1f} | {c['misses']:.0f} | "
                  f"{c['inline_evictions']:.0f} | {c['bg_evictions']:.0f} | {c['bg_writebacks']:.0f} / {c['bg_writeback_batches']:.0f} | {c['evictor_ns'] / 1e6:.0f} ({c['evictor_cpu_ns'] / 1e6:.0f}) |")


if __name__ == "__main__":
    main()
