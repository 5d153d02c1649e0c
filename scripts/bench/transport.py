#!/usr/bin/env python3
"""The transports side by side: the RPC floor of each (a 4 KiB request to a real mComponent),
and workloads natively, over loopback TCP, over shared memory, and over shared memory with
adaptive instead of fixed polling, and over shared memory with fault workers polling on any
CPU (`--fault-cpu any`) instead of sleeping beside the program on the faulting CPU (the
default), configurations interleaved run by run. Reports median wall
time (min-max), the slowdown against native, the CPU time of the whole run (program and
components), remote misses and the p50 of a miss and of its RPC part. Then a busy neighbour:
the fitting workload and the one at 25% alone and next to a process that only computes,
natively and under splitos, with the neighbour's share of the CPU. Writes results/transport.json and the
"Transports" section of docs/benchmarks.md.

    python3 scripts/bench/transport.py [--reps 5] [--floor-n 20000]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import ROOT, SPLITOS, cpu_of_children, ensure_env, machine, miss_workloads, replace_section

CONFIGS = {"tcp": ["--transport", "tcp"], "shm": ["--transport", "shm"], "shm, adaptive polling": ["--transport", "shm", "--polling", "adaptive"],
           "shm, fault workers on any CPU": ["--transport", "shm", "--fault-cpu", "any"]}
KINDS = list(CONFIGS)


def run(cmd, excache=None, kind=None):
    """Wall and CPU seconds of one run (the embedded cluster's components are children of
    `splitos run`, which waits for them, so their CPU time is in the total) and its counters."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        full = cmd if kind is None else [SPLITOS, "run", "--embedded", *CONFIGS[kind], "--excache", excache, "--stats-json", f.name, "--", *cmd]
        c0, t0 = cpu_of_children(), time.monotonic()
        subprocess.run(full, check=True, stdout=subprocess.DEVNULL)
        wall, cpu = time.monotonic() - t0, cpu_of_children() - c0
        stats = json.load(open(f.name)) if kind is not None else {}
    return wall, cpu, stats


NEIGHBOUR = "import signal, sys\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nwhile True:\n    pass\n"


def with_neighbour(cmd, excache=None, kind=None):
    """One run next to a process that only computes; returns the run's wall seconds and the
    share of one CPU the neighbour got meanwhile."""
    c0 = cpu_of_children()
    hog = subprocess.Popen([sys.executable, "-c", NEIGHBOUR])
    time.sleep(0.2)
    t0 = time.monotonic()
    wall, cpu, _ = run(cmd, excache, kind)
    span = time.monotonic() - t0 + 0.2
    hog.terminate()
    hog.wait()
    return wall, (cpu_of_children() - c0 - cpu) / span


def floors(n):
    """The RPC round trip over each transport to an mComponent of a cluster of this host."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, SPLITOS_STATE_DIR=d, SPLITOS_DATA_DIR=os.path.join(d, "data"))
        env.pop("SPLITOS_GM", None)
        subprocess.run([SPLITOS, "cluster", "up"], env=env, check=True, stdout=subprocess.DEVNULL)
        try:
            st = json.loads(subprocess.run([SPLITOS, "cluster", "status", "--json"], env=env, check=True, capture_output=True).stdout)
            m = next(c["addr"] for c in st["components"] if c["role"] == "mcomponent")
            out = json.loads(subprocess.run([SPLITOS, "bench-floor", "--n", str(n), "--mcomp", m], env=env, check=True, capture_output=True).stdout)
        finally:
            subprocess.run([SPLITOS, "cluster", "down"], env=env, stdout=subprocess.DEVNULL)
    return {x["name"]: x for x in out if x["name"] in ("tcp_rtt_4k_polling", "splitos_rpc_4k", "splitos_rpc_4k_shm")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--floor-n", type=int, default=20000)
    args = ap.parse_args()
    ensure_env()
    load = os.getloadavg()[0]
    res = {"machine": machine(), "params": vars(args), "load_before": load, "floors": floors(args.floor_n), "workloads": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd, ex in miss_workloads(tmp):
            native, runs = [], {k: [] for k in KINDS}
            for rep in range(args.reps):
                native.append(run(cmd))
                for k in (KINDS if rep % 2 == 0 else KINDS[::-1]):
                    runs[k].append(run(cmd, ex, k))
            row = {"workload": name, "excache": ex, "native_s": statistics.median(w for w, _, _ in native),
                   "native_cpu_s": statistics.median(c for _, c, _ in native), "kinds": {}}
            for k, rs in runs.items():
                walls = [w for w, _, _ in rs]
                med = lambda f: statistics.median(f(s) for _, _, s in rs)
                row["kinds"][k] = {"wall_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls),
                                   "cpu_s": statistics.median(c for _, c, _ in rs),
                                   "remote_misses": med(lambda s: s["misses"] - s["plocal_fills"]),
                                   "miss_p50_us": med(lambda s: s["miss_ns_p50"]) / 1000,
                                   "rpc_p50_us": med(lambda s: s["miss_breakdown_ns_p50"]["rpc"]) / 1000}
            res["workloads"].append(row)
            print(f"{name} done", file=sys.stderr)
        # The busy neighbour, with the workload that fits and with the one that misses.
        res["neighbour"] = []
        for name, cmd, ex in miss_workloads(tmp)[:2]:
            alone, busy = {k: [] for k in ["native", *KINDS]}, {k: [] for k in ["native", *KINDS]}
            for rep in range(args.reps):
                for k in (["native", *KINDS] if rep % 2 == 0 else ["native", *KINDS][::-1]):
                    kind = None if k == "native" else k
                    alone[k].append(run(cmd, ex, kind)[0])
                    busy[k].append(with_neighbour(cmd, ex, kind))
            res["neighbour"].append({"workload": name, "configs": {k: {"alone_s": statistics.median(alone[k]), "busy_s": statistics.median(w for w, _ in busy[k]),
                                                                        "neighbour_cpu": statistics.median(c for _, c in busy[k])} for k in alone}})
    os.makedirs(os.path.join(ROOT, "results"), exist_ok=True)
    with open(os.path.join(ROOT, "results", "transport.json"), "w") as f:
        json.dump(res, f, indent=2)
    m, fl = res["machine"], res["floors"]
    lines = [
        "<!-- transports:begin (generated by scripts/bench/transport.py; do not edit by hand) -->",
        "## Transports",
        "",
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_mib']} MiB, Linux {m['kernel']}; load average {load:.2f} at the start. "
        f"Embedded cluster with the default levers, `--transport tcp` against `--transport shm`; medians of {args.reps} runs, "
        "configurations interleaved. CPU is user + system time of the whole run: the program and every component.",
        "",
        "Floors (p50 / p99 µs): " + ", ".join(f"{label} {fl[k]['p50_ns'] / 1000:.2f} / {fl[k]['p99_ns'] / 1000:.2f}" for k, label in
                                             (("tcp_rtt_4k_polling", "raw TCP 4 KiB round trip"), ("splitos_rpc_4k", "splitos RPC over TCP"),
                                              ("splitos_rpc_4k_shm", "splitos RPC over shared memory")) if k in fl) + ".",
        "",
        "| workload | transport | wall s (min–max) | x native | CPU s (native) | remote misses | miss p50 µs | RPC p50 µs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in res["workloads"]:
        for k, c in row["kinds"].items():
            lines.append(f"| {row['workload']} | {k} | {c['wall_s']:.2f} ({c['min_s']:.2f}–{c['max_s']:.2f}) | {c['wall_s'] / row['native_s']:.2f}x | "
                         f"{c['cpu_s']:.2f} ({row['native_cpu_s']:.2f}) | {c['remote_misses']:.0f} | {c['miss_p50_us']:.1f} | {c['rpc_p50_us']:.1f} |")
    lines += ["", "Native: " + ", ".join(f"{r['workload']} {r['native_s']:.2f} s" for r in res["workloads"]) + "."]
    lines += ["", "A busy neighbour: each workload alone and next to a process that only computes (a Python busy loop), "
              "on the same two cores. Slowdown is the time with the neighbour over the time alone, in the same configuration; "
              "the neighbour's share is the CPU time it got over the run's duration (1.0 = a whole core).", "",
              "| workload | configuration | alone s | with neighbour s | slowdown | neighbour's share of a CPU |", "|---|---|---|---|---|---|"]
    for nb in res["neighbour"]:
        for k, c in nb["configs"].items():
            lines.append(f"| {nb['workload']} | {k} | {c['alone_s']:.2f} | {c['busy_s']:.2f} | {c['busy_s'] / c['alone_s']:.2f}x | {c['neighbour_cpu']:.2f} |")
    lines += ["<!-- transports:end -->"]
    print("\n".join(lines))
    replace_section(os.path.join(ROOT, "docs"), "transports", lines)


if __name__ == "__main__":
    main()
