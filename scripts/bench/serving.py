#!/usr/bin/env python3
"""The mComponent serving its requests on threads (a thread per shared-memory channel, polling
`spin_us` after each request before it sleeps) against serving them on Ebb event loops
(`--mem-serving loops`: one loop polling while requests come faster than `poll_above` a second,
sleeping in epoll below `sleep_below`), side by side in one run, on the embedded cluster:

- Figure 8's miss latency: sequential 4 KiB loads that all miss (read-ahead, fault-around and
  one-sided copies off, so that every miss is a request the mComponent serves), one program
  thread and four, the load's p50 and p99 as the program measures it and its throughput;
  at rest, and with a busy neighbour (one CPU-bound process per CPU, at the same priority,
  running all along).
- CPU at idle: the CPU time of the whole embedded cluster (managers, pComponent, mComponent)
  while its program sleeps for 10 s.

The configurations run in a fresh random order each repetition. Writes results/serving.json and
the "Serving on event loops" section of docs/benchmarks.md.

    python3 scripts/bench/serving.py [--reps 3] [--mb 64]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

from benchlib import ROOT, SPLITOS, cpu_of_children, ensure_env, machine, machine_line, replace_section

CONFIGS = [("threads", ["--mem-serving", "threads"]), ("loops", ["--mem-serving", "loops"])]
IDLE_S = 10


def miss_run(binary, mb, threads, flags):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        r = subprocess.run([SPLITOS, "run", "--embedded", "--quiet", "--excache", "4M", "--prefetch", "0", "--fault-around", "0", "--prealloc", "0", "--one-sided", "off",
                            "--fault-workers", str(threads), *flags, "--stats-json", f.name, "--", binary, str(mb), str(threads)], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"seqload under {flags} failed: {r.stderr[-2000:]}")
        prog = json.loads(r.stdout)
        stats = json.load(open(f.name))
    return {"load_p50_ns": prog["load"]["p50_ns"], "load_p99_ns": prog["load"]["p99_ns"], "load_mb_s": prog["load_mb_s"], "miss_ns_p50": stats["miss_ns_p50"]}


def idle_run(flags):
    c0 = cpu_of_children()
    r = subprocess.run([SPLITOS, "run", "--embedded", "--quiet", *flags, "--", "sleep", str(IDLE_S)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sleep under {flags} failed: {r.stderr[-2000:]}")
    return {"cpu_s": cpu_of_children() - c0}


class Neighbour:
    """One CPU-bound process per CPU, at the same priority as everything else."""

    def __enter__(self):
        spin = "while True: pass"
        self.procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 1)]
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()


def med(runs, key):
    return statistics.median(r[key] for r in runs)


def summarise(runs):
    keys = runs[0].keys()
    out = {k: med(runs, k) for k in keys}
    out.update({f"{k}_min": min(r[k] for r in runs) for k in keys})
    out.update({f"{k}_max": max(r[k] for r in runs) for k in keys})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--out", default=os.path.join(ROOT, "results"))
    ap.add_argument("--docs", default=os.path.join(ROOT, "docs"))
    ap.add_argument("--report-only", action="store_true", help="rewrite the docs section from OUT/serving.json")
    args = ap.parse_args()
    path = os.path.join(args.out, "serving.json")
    if args.report_only:
        return report(json.load(open(path)), args.docs)
    ensure_env()
    res = {"machine": machine(), "load_before": os.getloadavg()[0], "reps": args.reps, "mb": args.mb, "idle_s": IDLE_S}
    with tempfile.TemporaryDirectory() as tmp:
        binary = os.path.join(tmp, "seqload")
        subprocess.run(["gcc", "-O2", "-pthread", "-o", binary, os.path.join(ROOT, "scripts", "bench", "seqload.c")], check=True)
        cases = [(cond, threads) for cond in ("rest", "busy") for threads in (1, 4)]
        samples = {(cond, threads, label): [] for cond, threads in cases for label, _ in CONFIGS}
        idle = {label: [] for label, _ in CONFIGS}
        for rep in range(args.reps):
            for cond, threads in cases:
                order = list(CONFIGS)
                random.shuffle(order)
                for label, flags in order:
                    if cond == "busy":
                        with Neighbour():
                            s = miss_run(binary, args.mb, threads, flags)
                    else:
                        s = miss_run(binary, args.mb, threads, flags)
                    samples[(cond, threads, label)].append(s)
            order = list(CONFIGS)
            random.shuffle(order)
            for label, flags in order:
                idle[label].append(idle_run(flags))
            print(f"repetition {rep + 1} done", file=sys.stderr)
    res["misses"] = [{"condition": cond, "threads": threads, "configs": {label: summarise(samples[(cond, threads, label)]) for label, _ in CONFIGS}} for cond, threads in cases]
    res["idle"] = {label: summarise(runs) for label, runs in idle.items()}
    res["load_after"] = os.getloadavg()[0]
    os.makedirs(args.out, exist_ok=True)
    json.dump(res, open(path, "w"), indent=1)
    report(res, args.docs)


def report(res, docs):
    lines = [
        f"`scripts/bench/serving.py` ({machine_line(res)}, {res['reps']} repetitions, medians with min-max): the mComponent serving on threads "
        "(`--mem-serving threads`, the default) against one Ebb event loop (`--mem-serving loops`), figure 8's sequential 4 KiB loads that all miss "
        f"({res['mb']} MiB, 4 MiB ExCache, read-ahead, fault-around and one-sided copies off), at rest and with a busy neighbour (one CPU-bound "
        "process per CPU at the same priority). Load latency is the program's own, per load; loops/threads below 1 is better for loops.",
        "",
        "| condition | program threads | serving | load p50 (µs) | load p99 (µs) | MB/s | pComponent miss p50 (µs) | loops/threads p50 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in res["misses"]:
        t = row["configs"]["threads"]["load_p50_ns"]
        for label, c in row["configs"].items():
            ratio = f"{c['load_p50_ns'] / t:.2f}x" if label == "loops" else ""
            lines.append(f"| {row['condition']} | {row['threads']} | {label} | {c['load_p50_ns'] / 1e3:.1f} ({c['load_p50_ns_min'] / 1e3:.1f}-{c['load_p50_ns_max'] / 1e3:.1f}) "
                         f"| {c['load_p99_ns'] / 1e3:.1f} | {c['load_mb_s']:.1f} | {c['miss_ns_p50'] / 1e3:.1f} | {ratio} |")
    lines += ["", f"CPU time of the whole embedded cluster while its program sleeps {res['idle_s']} s:", "", "| serving | CPU s (min-max) |", "|---|---|"]
    for label, c in res["idle"].items():
        lines.append(f"| {label} | {c['cpu_s']:.3f} ({c['cpu_s_min']:.3f}-{c['cpu_s_max']:.3f}) |")
    replace_section(os.path.join(docs, "benchmarks.md"), "serving", lines)


if __name__ == "__main__":
    main()
