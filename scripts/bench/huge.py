#!/usr/bin/env python3
"""Huge pages for program heaps (`--huge-pages`), side by side: each workload natively with 4 KiB
pages, natively with transparent huge pages for its heap (glibc's malloc advised with
`glibc.malloc.hugetlb=1`), and under splitos with `--huge-pages off` and `on`, the
configurations interleaved run by run. Reports median wall time (min-max), the slowdown against
native, the first touches that trapped, the huge pages made and split. Writes
results/huge.json; prints the table (Markdown) for docs/benchmarks.md.

    python3 scripts/bench/huge.py [--reps 3] [--only TEXT]

The pComponent must run as root (`--huge-pages on` mounts a private tmpfs).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import ROOT, SPLITOS, WORK, ensure_env, machine, miss_workloads
from suite import corpus


def workloads(tmp):
    touch = os.path.join(tmp, "hugetouch")
    subprocess.run(["gcc", "-O2", "-o", touch, os.path.join(ROOT, "tests", "programs", "hugetouch.c")], check=True)
    # The suite's xz input (full mode).
    os.makedirs(os.path.join(WORK, "data"), exist_ok=True)
    text = corpus(os.path.join(WORK, "data", "corpus-f.txt"), 6)
    xz = ["bash", "-c", f"xz -6 -T1 -c {text} | md5sum"]
    fits = [w for w in miss_workloads(tmp) if w[0].endswith("fits")]
    return [("random reads over 256 MiB (C), fits", [touch, "256", "8"], "512M"), ("xz -6, fits", xz, "512M"), *fits]


def run(cmd, excache=None, huge=None, env=None):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        full = cmd if excache is None else [SPLITOS, "run", "--embedded", "--excache", excache, "--huge-pages", huge, "--stats-json", f.name, "--", *cmd]
        t0 = time.monotonic()
        subprocess.run(full, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, **(env or {})))
        wall = time.monotonic() - t0
        stats = json.load(open(f.name)) if excache is not None else {}
    return wall, stats


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="", help="run only the workloads whose name contains this")
    args = ap.parse_args()
    ensure_env()
    configs = [("native", None, None, None), ("native, THP heap", None, None, {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}),
               ("splitos, huge pages off", True, "off", None), ("splitos, huge pages on", True, "on", None)]
    res = {"machine": machine(), "params": vars(args), "load_before": os.getloadavg(), "workloads": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd, ex in workloads(tmp):
            if args.only not in name:
                continue
            runs = {c[0]: [] for c in configs}
            for rep in range(args.reps):
                for label, under, huge, env in (configs if rep % 2 == 0 else configs[::-1]):
                    runs[label].append(run(cmd, ex if under else None, huge, env))
            row = {"workload": name, "excache": ex, "configs": {}}
            for label, rs in runs.items():
                walls = [w for w, _ in rs]
                med = lambda k: statistics.median(s.get(k, 0) for _, s in rs)
                row["configs"][label] = {"wall_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls),
                                         "plocal_fills": med("plocal_fills"), "huge_pages": med("huge_pages"), "huge_splits": med("huge_splits")}
            res["workloads"].append(row)
            print(f"{name} done", file=sys.stderr)
    res["load_after"] = os.getloadavg()
    os.makedirs(os.path.join(ROOT, "results"), exist_ok=True)
    with open(os.path.join(ROOT, "results", "huge.json"), "w") as f:
        json.dump(res, f, indent=2)
    print(f"Load average {res['load_before'][0]:.1f} before, {res['load_after'][0]:.1f} after; {args.reps} runs each, interleaved.\n")
    print("| workload | configuration | wall s (min-max) | x native | first touches that trapped | huge pages | split |")
    print("|---|---|---|---|---|---|---|")
    for row in res["workloads"]:
        native = row["configs"]["native"]["wall_s"]
        for label, c in row["configs"].items():
            print(f"| {row['workload']} | {label} | {c['wall_s']:.2f} ({c['min_s']:.2f}-{c['max_s']:.2f}) | {c['wall_s'] / native:.2f} | {c['plocal_fills']:.0f} | {c['huge_pages']:.0f} | {c['huge_splits']:.0f} |")


if __name__ == "__main__":
    main()
