#!/usr/bin/env python3
"""Access sampling (reads made visible) side by side: each workload natively and under splitos
with FIFO (the default), CLOCK and ghost CLOCK, each without and with `--access-sampling
unmap`, the configurations in a fresh random order each repetition. Reports the median (min-max)
wall time, the slowdown against native, remote misses (misses less first touches filled in the
pComponent), the lines the pComponent unmapped and the touches it saw, and what each touch
cost: (wall time - wall time of the same policy without sampling, or of fully associative
CLOCK for the fully associative rows) / touches. Writes
results/sampling.json and the "Access sampling" section of docs/benchmarks.md; the machine's
load average is recorded before and after.

    python3 scripts/bench/sampling.py [--reps 3] [--only TEXT]

Needs root (CAP_SYS_NICE) and a host without swap: on others the pComponent turns sampling
off, and the script stops.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import ROOT, SPLITOS, ensure_env, machine, replace_section

POLICIES = ["fifo", "clock", "ghost-clock"]


def configs():
    out = [(p, ["--policy", p]) for p in POLICIES]
    out += [(f"{p} + sampling", ["--policy", p, "--access-sampling", "unmap"]) for p in POLICIES if p != "fifo"]
    # Fully associative: no conflicts within a set, one hand over every line.
    out += [("clock, ways 0", ["--policy", "clock", "--ways", "0"]), ("ghost-clock + sampling, ways 0", ["--policy", "ghost-clock", "--access-sampling", "unmap", "--ways", "0"])]
    return out


def workloads(tmp):
    """(name, command, ExCache): a read-mostly hot set between streams (C), a CPython record
    table at about 65% and 45% of its heap, CPython word counting at 25%."""
    readhot = os.path.join(tmp, "readhot")
    subprocess.run(["gcc", "-O2", "-o", readhot, os.path.join(ROOT, "tests", "programs", "readhot.c")], check=True)
    records = [sys.executable, os.path.join(ROOT, "scripts", "workloads", "records.py"), "100000"]
    wordfreq = [sys.executable, os.path.join(ROOT, "scripts", "workloads", "wordfreq.py"), "400000"]
    return [
        ("read-hot set and streams (C)", [readhot, "6144", "32768", "20"], "40M"),
        ("record table (CPython) at 65%", records, "50M"),
        ("record table (CPython) at 45%", records, "35M"),
        ("word counting (CPython) at 25%", wordfreq, "22M"),
    ]


def run(cmd, excache=None, flags=()):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        full = cmd if excache is None else [SPLITOS, "run", "--embedded", "--quiet", "--excache", excache, *flags, "--stats-json", f.name, "--", *cmd]
        t0 = time.monotonic()
        r = subprocess.run(full, capture_output=True, text=True)
        wall = time.monotonic() - t0
        if r.returncode != 0:
            sys.exit(f"{' '.join(full)} failed ({r.returncode}): {r.stderr[-2000:]}")
        stats = json.load(open(f.name)) if excache is not None else {}
    return wall, r.stdout, stats


def load():
    return os.getloadavg()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="", help="run only the workloads whose name contains this")
    ap.add_argument("--out", default=os.path.join(ROOT, "results"))
    ap.add_argument("--docs", default=os.path.join(ROOT, "docs"))
    args = ap.parse_args()
    ensure_env()
    if any(l.strip() and not l.startswith("Filename") for l in open("/proc/swaps")):
        sys.exit("this host has swap: the pComponent turns access sampling off on it (swapoff -a first)")
    res = {"machine": machine(), "load_before": load(), "reps": args.reps, "workloads": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd, ex in workloads(tmp):
            if args.only not in name:
                continue
            native, expected = [], None
            samples = {c: [] for c, _ in configs()}
            for rep in range(args.reps):
                wall, out, _ = run(cmd)
                native.append(wall)
                expected = expected or out
                order = configs()
                random.shuffle(order)
                for label, flags in order:
                    wall, out, s = run(cmd, ex, flags)
                    if out != expected:
                        sys.exit(f"{name} under {label}: output differs from the native run")
                    samples[label].append({"wall_s": wall, "remote_misses": s["misses"] - s["plocal_fills"], "misses": s["misses"], "unmaps": s.get("sample_unmaps", 0), "touches": s.get("sample_touches", 0), "wp_faults": s["wp_faults"], "evictions": s["evictions"], "miss_ns_p50": s["miss_ns_p50"]})
            row = {"workload": name, "excache": ex, "native_s": statistics.median(native), "configs": {}}
            for label, runs in samples.items():
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                med["wall_min_s"] = min(r["wall_s"] for r in runs)
                med["wall_max_s"] = max(r["wall_s"] for r in runs)
                row["configs"][label] = med
            res["workloads"].append(row)
            print(f"{name} done", file=sys.stderr)
    res["load_after"] = load()
    os.makedirs(args.out, exist_ok=True)
    json.dump(res, open(os.path.join(args.out, "sampling.json"), "w"), indent=1)
    report(res, args.docs)


def report(res, docs):
    m = res["machine"]
    lines = [
        "<!-- sampling:begin (generated by scripts/bench/sampling.py; do not edit by hand) -->",
        "## Access sampling: reads made visible",
        "",
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_mib']} MiB, Linux {m['kernel']}; load average {res['load_before']:.1f} before, {res['load_after']:.1f} after. "
        f"Medians of {res['reps']} runs per configuration, in a fresh random order each repetition. Remote misses are misses less first touches; "
        "a touch is a minor fault on a line the pComponent had unmapped; cost per touch is the wall time over the same policy without sampling (fully associative CLOCK for the fully associative rows), divided by the touches.",
        "",
        "| workload | ExCache | configuration | wall s (min–max) | × native | remote misses | unmapped | touches | µs per touch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w in res["workloads"]:
        for label, c in w["configs"].items():
            base = w["configs"].get(label.replace(" + sampling", "").replace("ghost-clock, ways 0", "clock, ways 0"))
            per_touch = f"{(c['wall_s'] - base['wall_s']) / c['touches'] * 1e6:.1f}" if c["touches"] and base is not c else "–"
            lines.append(
                f"| {w['workload']} | {w['excache']} | {label} | {c['wall_s']:.2f} ({c['wall_min_s']:.2f}–{c['wall_max_s']:.2f}) | {c['wall_s'] / w['native_s']:.2f} | {c['remote_misses']:,.0f} | {c['unmaps']:,.0f} | {c['touches']:,.0f} | {per_touch} |"
            )
    lines += ["", "<!-- sampling:end -->"]
    replace_section(docs, "sampling", lines)


if __name__ == "__main__":
    main()
