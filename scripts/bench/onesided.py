#!/usr/bin/env python3
"""One-sided access side by side with messages: each workload natively, then under splitos
with `--one-sided off` (every fetch and write-back a message to the owner) and `--one-sided
on` (the owner's pages copied in and out of its leased segment), the two in a fresh random
order each repetition, on the embedded cluster (shared-memory transport). Reports the median
(min-max) wall time, the slowdown against native, remote misses (misses less first touches),
the pComponent's miss p50 and its round-trip part, the program's time per remote miss ((wall -
native) / remote misses), the CPU time of the program and every component beyond the native
run's per remote miss, the fetches the mComponents served themselves, and the copies. Writes
results/onesided.json and the "One-sided access" section of docs/benchmarks.md; the machine's
load average is recorded before and after.

    python3 scripts/bench/onesided.py [--reps 3] [--only TEXT]
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

from benchlib import ROOT, SPLITOS, cpu_of_children, ensure_env, machine, miss_workloads, replace_section

CONFIGS = [("messages", ["--one-sided", "off"]), ("one-sided", ["--one-sided", "on"])]


def workloads(tmp):
    """The miss-path workloads of levers.py whose output can be compared with a native run's
    (the sequential scan prints its own timings), and a CPython record table at about 65% and
    45% of its heap."""
    records = [sys.executable, os.path.join(ROOT, "scripts", "workloads", "records.py"), "100000"]
    checked = [w for w in miss_workloads(tmp) if not w[0].startswith("sequential scan")]
    return checked + [("record table (CPython) at 65%", records, "50M"), ("record table (CPython) at 45%", records, "35M")]


def run(cmd, excache=None, flags=()):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        full = cmd if excache is None else [SPLITOS, "run", "--embedded", "--quiet", "--excache", excache, *flags, "--stats-json", f.name, "--", *cmd]
        c0 = cpu_of_children()
        t0 = time.monotonic()
        r = subprocess.run(full, capture_output=True, text=True)
        wall = time.monotonic() - t0
        cpu = cpu_of_children() - c0
        if r.returncode != 0:
            sys.exit(f"{' '.join(full)} failed ({r.returncode}): {r.stderr[-2000:]}")
        stats = json.load(open(f.name)) if excache is not None else {}
    return wall, cpu, r.stdout, stats


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="", help="run only the workloads whose name contains this")
    ap.add_argument("--out", default=os.path.join(ROOT, "results"))
    ap.add_argument("--docs", default=os.path.join(ROOT, "docs"))
    args = ap.parse_args()
    ensure_env()
    res = {"machine": machine(), "load_before": os.getloadavg()[0], "reps": args.reps, "workloads": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd, ex in workloads(tmp):
            if args.only not in name:
                continue
            native, native_cpu, expected = [], [], None
            samples = {c: [] for c, _ in CONFIGS}
            for _ in range(args.reps):
                wall, cpu, out, _ = run(cmd)
                native.append(wall)
                native_cpu.append(cpu)
                expected = expected or out
                order = list(CONFIGS)
                random.shuffle(order)
                for label, flags in order:
                    wall, cpu, out, s = run(cmd, ex, flags)
                    if out != expected:
                        sys.exit(f"{name} under {label}: output differs from the native run")
                    sided = s.get("one_sided") or {}
                    samples[label].append({
                        "wall_s": wall, "cpu_s": cpu, "remote_misses": s["misses"] - s["plocal_fills"], "miss_ns_p50": s["miss_ns_p50"],
                        "rpc_ns_p50": s["miss_breakdown_ns_p50"]["rpc"], "evict_ns_p50": s["miss_breakdown_ns_p50"]["evict"], "install_ns_p50": s["miss_breakdown_ns_p50"]["install"],
                        "mcomp_fetches": sum(m["fetches"] for m in s["mcomponents"]), "copied_in": sided.get("reads", 0), "copied_out": sided.get("writes", 0),
                    })
            row = {"workload": name, "excache": ex, "native_s": statistics.median(native), "native_cpu_s": statistics.median(native_cpu), "configs": {}}
            for label, runs in samples.items():
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                med["wall_min_s"] = min(r["wall_s"] for r in runs)
                med["wall_max_s"] = max(r["wall_s"] for r in runs)
                row["configs"][label] = med
            res["workloads"].append(row)
            print(f"{name} done", file=sys.stderr)
    res["load_after"] = os.getloadavg()[0]
    os.makedirs(args.out, exist_ok=True)
    json.dump(res, open(os.path.join(args.out, "onesided.json"), "w"), indent=1)
    report(res, args.docs)


def report(res, docs):
    m = res["machine"]
    lines = [
        "<!-- onesided:begin (generated by scripts/bench/onesided.py; do not edit by hand) -->",
        "## One-sided access",
        "",
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_mib']} MiB, Linux {m['kernel']}; load average {res['load_before']:.1f} before, {res['load_after']:.1f} after. "
        f"Medians of {res['reps']} runs per configuration, in a fresh random order each repetition, on the embedded cluster (shared-memory transport). "
        "Remote misses are misses less first touches. µs per miss: (wall time - native) / remote misses, what the program waited per miss; CPU µs per miss: the CPU time of the program and of every component beyond the native run's, per remote miss. "
        "Fetches served: by the mComponents themselves; copies: pages copied in and out of the owners' segments.",
        "",
        "| workload | ExCache | access | wall s (min–max) | × native | remote misses | miss p50 µs (round trip) | µs per miss | CPU µs per miss | fetches served | copies in / out |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in res["workloads"]:
        for label, c in w["configs"].items():
            rm = max(c["remote_misses"], 1)
            lines.append(
                f"| {w['workload']} | {w['excache']} | {label} | {c['wall_s']:.2f} ({c['wall_min_s']:.2f}–{c['wall_max_s']:.2f}) | {c['wall_s'] / w['native_s']:.2f} | {c['remote_misses']:,.0f} | "
                f"{c['miss_ns_p50'] / 1000:.1f} ({c['rpc_ns_p50'] / 1000:.1f}) | {(c['wall_s'] - w['native_s']) / rm * 1e6:.1f} | {(c['cpu_s'] - w['native_cpu_s']) / rm * 1e6:.1f} | {c['mcomp_fetches']:,.0f} | {c['copied_in']:,.0f} / {c['copied_out']:,.0f} |"
            )
    lines += ["", "<!-- onesided:end -->"]
    replace_section(docs, "onesided", lines)


if __name__ == "__main__":
    main()
