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
- The network benchmark's round trips (docs/network.md; hosts as in scripts/bench/network.py):
  a program's TCP through an nComponent on another host serving on threads or on one loop,
  request-response p50 and p99 for 128 B, 8 KiB and 64 KiB messages and a 64 KiB stream, at
  rest and with the busy neighbour.

The configurations run in a fresh random order each repetition. Writes results/serving.json and
the "Serving on event loops" section of docs/benchmarks.md.

    python3 scripts/bench/serving.py [--reps 3] [--mb 64] [--skip-network]
"""
import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchlib import ROOT, SPLITOS, cpu_of_children, ensure_env, machine, machine_line, replace_section

CONFIGS = [("threads", ["--mem-serving", "threads"]), ("loops", ["--mem-serving", "loops"]), ("2 loops", ["--mem-serving", "loops", "--mem-serving-cores", "2"])]
IDLE_S = 10
NET_CONFIGS = [("threads", ""), ("loops", '[ncomponent.serving]\nkind = "loops"\n')]
NET_SIZES = (128, 8192, 65536)


def miss_run(binary, mb, threads, flags):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        r = subprocess.run([SPLITOS, "run", "--embedded", "--quiet", "--excache", "4M", "--prefetch-lines", "0", "--fault-around", "0", "--prealloc", "0", "--one-sided", "off",
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


def network_part(reps):
    """The network benchmark's round trips and stream through an nComponent serving on threads
    and on a loop, at rest and beside the neighbour: {condition: {config: {measure: [runs]}}}."""
    import network as nw
    tmp = tempfile.mkdtemp(prefix="splitos-servingnet-")
    nb = os.path.join(tmp, "netbench")
    subprocess.run(["gcc", "-O2", "-pthread", "-o", nb, os.path.join(ROOT, "scripts", "bench", "netbench.c")], check=True)
    out = {cond: {label: {} for label, _ in NET_CONFIGS} for cond in ("rest", "busy")}
    nw.make_hosts()
    server = subprocess.Popen(nw.in_host("out", [nb, "server", "9100"]))
    dest = (f"{nw.OUTSIDE}.2", "9100")
    try:
        for rep in range(reps):
            for cond in ("rest", "busy"):
                order = list(NET_CONFIGS)
                random.shuffle(order)
                for label, extra in order:
                    rack = nw.Rack(os.path.join(tmp, f"state-{rep}-{cond}-{label}"), ncomp=extra)
                    try:
                        with Neighbour() if cond == "busy" else contextlib.nullcontext():
                            got = out[cond][label]
                            for size in NET_SIZES:
                                r = rack.run("ddio", [nb, "rr", *dest, str(size), "2000" if size < 65536 else "500"])
                                got.setdefault(f"rr_{size}_p50_us", []).append(r["p50_us"])
                                got.setdefault(f"rr_{size}_p99_us", []).append(r["p99_us"])
                            got.setdefault("stream_65536_mb_s", []).append(rack.run("ddio", [nb, "stream", *dest, "65536", "64"])["mb_per_s"])
                    finally:
                        rack.down()
            print(f"network repetition {rep + 1} done", file=sys.stderr)
    finally:
        server.kill()
        nw.teardown()
        shutil.rmtree(tmp, ignore_errors=True)
    return {cond: {label: summarise([dict(zip(m, v)) for v in zip(*m.values())]) for label, m in by.items()} for cond, by in out.items()}


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
    ap.add_argument("--skip-network", action="store_true", help="leave out the nComponent's part")
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
    if not args.skip_network:
        res["network"] = network_part(args.reps)
    res["load_after"] = os.getloadavg()[0]
    os.makedirs(args.out, exist_ok=True)
    json.dump(res, open(path, "w"), indent=1)
    report(res, args.docs)


def report(res, docs):
    lines = [
        "<!-- serving:begin (generated by scripts/bench/serving.py; do not edit by hand) -->",
        "## Serving on event loops",
        "",
        machine_line(res) + f"`scripts/bench/serving.py`, {res['reps']} repetitions in a fresh random order, medians with min-max: the mComponent serving on threads "
        "(`--mem-serving threads`, the default) against one Ebb event loop (`--mem-serving loops`) and two (`--mem-serving-cores 2`), figure 8's sequential 4 KiB loads that all miss "
        f"({res['mb']} MiB, 4 MiB ExCache, read-ahead, fault-around and one-sided copies off), at rest and with a busy neighbour (one CPU-bound "
        "process per CPU at the same priority). Load latency is the program's own, per load; loops/threads below 1 is better for loops.",
        "",
        "| condition | program threads | serving | load p50 (µs) | load p99 (µs) | MB/s | pComponent miss p50 (µs) | loops/threads p50 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in res["misses"]:
        t = row["configs"]["threads"]["load_p50_ns"]
        for label, c in row["configs"].items():
            ratio = f"{c['load_p50_ns'] / t:.2f}x" if label != "threads" else ""
            lines.append(f"| {row['condition']} | {row['threads']} | {label} | {c['load_p50_ns'] / 1e3:.1f} ({c['load_p50_ns_min'] / 1e3:.1f}-{c['load_p50_ns_max'] / 1e3:.1f}) "
                         f"| {c['load_p99_ns'] / 1e3:.1f} | {c['load_mb_s']:.1f} | {c['miss_ns_p50'] / 1e3:.1f} | {ratio} |")
    lines += ["", f"CPU time of the whole embedded cluster while its program sleeps {res['idle_s']} s:", "", "| serving | CPU s (min-max) |", "|---|---|"]
    for label, c in res["idle"].items():
        lines.append(f"| {label} | {c['cpu_s']:.3f} ({c['cpu_s_min']:.3f}-{c['cpu_s_max']:.3f}) |")
    if "network" in res:
        lines += ["", "The nComponent on threads and on one loop: a program's TCP through it to a host outside (as in the network benchmark), request-response and a 64 KiB stream:", "",
                  "| condition | nComponent serving | rr 128 B p50 / p99 (µs) | rr 8 KiB p50 / p99 (µs) | rr 64 KiB p50 / p99 (µs) | stream 64 KiB (MB/s) |", "|---|---|---|---|---|---|"]
        for cond, by in res["network"].items():
            for label, c in by.items():
                rr = " | ".join(f"{c[f'rr_{s}_p50_us']:.0f} ({c[f'rr_{s}_p50_us_min']:.0f}-{c[f'rr_{s}_p50_us_max']:.0f}) / {c[f'rr_{s}_p99_us']:.0f}" for s in NET_SIZES)
                lines.append(f"| {cond} | {label} | {rr} | {c['stream_65536_mb_s']:.0f} ({c['stream_65536_mb_s_min']:.0f}-{c['stream_65536_mb_s_max']:.0f}) |")
    lines += ["", "<!-- serving:end -->"]
    replace_section(docs, "serving", lines)


if __name__ == "__main__":
    main()
