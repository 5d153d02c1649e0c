#!/usr/bin/env python3
"""Two builds of splitos side by side on Figure 8's miss micro-benchmark: sequential 4 KB
loads that all miss (one and four program threads, one and two mComponents) and p-local first
touches, the builds interleaved run by run so that both see the same machine. Reports the
median and spread of the program-side load and first-touch latency and of the pComponent's own
miss latency, and the ratio B/A; writes results/ab.json.

    python3 scripts/bench/ab.py --a OLD/splitos [--b target/release/splitos] [--reps 5] [--mb 64]

Each build is a `splitos` binary with its `libsplitos_shim.so` next to it (copy both out of
target/release before rebuilding).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchlib import ROOT, SPLITOS, ensure_env, machine

# (name, mComponents, program threads, ExCache); "2x" means twice the scanned data (p-local).
CONFIGS = [("miss 1 thread", 1, 1, "4M"), ("miss 4 threads", 1, 4, "4M"), ("miss 2 mComponents", 2, 1, "4M"), ("p-local first touch", 1, 1, "2x")]
KEYS = [("load_p50_ns", "program load p50"), ("first_touch_p50_ns", "program first touch p50"), ("miss_ns_p50", "pComponent miss p50")]


def run(splitos, binary, mb, threads, mcomps, excache):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        r = subprocess.run([splitos, "run", "--embedded", "--excache", excache, "--mcomponents", str(mcomps), "--fault-workers", str(threads),
                            "--stats-json", f.name, "--", binary, str(mb), str(threads)], check=True, capture_output=True, text=True)
        prog, stats = json.loads(r.stdout), json.load(open(f.name))
    return {"load_p50_ns": prog["load"]["p50_ns"], "first_touch_p50_ns": prog["first_touch"]["p50_ns"], "miss_ns_p50": stats["miss_ns_p50"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="the baseline build's splitos binary")
    ap.add_argument("--b", default=SPLITOS, help="the build under test (default: this tree's release build)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mb", type=int, default=64)
    args = ap.parse_args()
    ensure_env()
    binary = os.path.join(tempfile.gettempdir(), "splitos-seqload")
    subprocess.run(["gcc", "-O2", "-pthread", "-o", binary, os.path.join(ROOT, "scripts", "bench", "seqload.c")], check=True)
    builds = {"A": args.a, "B": args.b}
    samples = {(c[0], b): [] for c in CONFIGS for b in builds}
    # A virtual machine that has been idle wakes its vCPUs slowly: warm up, untimed.
    for b in builds.values():
        run(b, binary, args.mb, 1, 1, "4M")
    for rep in range(args.reps):
        for name, m, t, ex in CONFIGS:
            ex = f"{2 * args.mb}M" if ex == "2x" else ex
            # Alternate which build goes first, so neither always runs on a warmer machine.
            order = ["A", "B"] if rep % 2 == 0 else ["B", "A"]
            for b in order:
                samples[(name, b)].append(run(builds[b], binary, args.mb, t, m, ex))
        print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)
    res = {"machine": machine(), "params": vars(args), "configs": []}
    for name, m, t, ex in CONFIGS:
        row = {"config": name, "mcomponents": m, "threads": t}
        for k, _ in KEYS:
            for b in builds:
                v = [s[k] for s in samples[(name, b)]]
                row[f"{b}_{k}"] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
            row[f"ratio_{k}"] = row[f"B_{k}"]["median"] / max(row[f"A_{k}"]["median"], 1)
        res["configs"].append(row)
    os.makedirs(os.path.join(ROOT, "results"), exist_ok=True)
    with open(os.path.join(ROOT, "results", "ab.json"), "w") as f:
        json.dump(res, f, indent=2)
    mach = res["machine"]
    print(f"Machine: {mach['cores']} cores ({mach['cpu']}), {mach['memory_mib']} MiB, Linux {mach['kernel']}; {args.mb} MiB scanned, {args.reps} interleaved runs per build.")
    print("| configuration | measure | A median µs (min–max) | B median µs (min–max) | B / A |")
    print("|---|---|---|---|---|")
    us = lambda x: f"{x / 1000:.1f}"
    for row in res["configs"]:
        for k, label in KEYS:
            a, b = row[f"A_{k}"], row[f"B_{k}"]
            print(f"| {row['config']} | {label} | {us(a['median'])} ({us(a['min'])}–{us(a['max'])}) | {us(b['median'])} ({us(b['min'])}–{us(b['max'])}) | {row[f'ratio_{k}']:.2f} |")


if __name__ == "__main__":
    main()
