#!/usr/bin/env python3
"""LegoOS Figure 8 on this machine: sequential 4 KB loads that all miss, one thread and four,
with 0 (receiving thread serves) / 1 / 2 / 4 mComponent worker threads and 1-2 mComponents,
plus the p-local first-touch case, against floors measured in the same run: a native
first-touch fault, a userfaultfd fault served locally by another thread, a raw TCP round trip
carrying 4 KB, and the splitos RPC round trip. Writes results/fig8.json, docs/fig8.png and
the Figure 8 section of docs/benchmarks.md.

    python3 scripts/bench/fig8.py [--reps 3] [--mb 128]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchlib import ROOT, SPLITOS, ensure_env, machine, replace_section


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def local_floors(n):
    return {x["name"]: x for x in json.loads(sh([SPLITOS, "bench-floor", "--n", str(n)]).stdout)}


def floors(n):
    out = list(local_floors(n).values())
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, SPLITOS_STATE_DIR=d)
        sh([SPLITOS, "cluster", "up"], env=env)
        try:
            st = json.loads(sh([SPLITOS, "cluster", "status", "--json"], env=env).stdout)
            m = next(c["addr"] for c in st["components"] if c["role"] == "mcomponent")
            out += [x for x in json.loads(sh([SPLITOS, "bench-floor", "--n", str(n), "--mcomp", m], env=env).stdout) if x["name"] == "splitos_rpc_4k"]
        finally:
            sh([SPLITOS, "cluster", "down"], env=env)
    return {x["name"]: x for x in out}


def run_one(binary, mb, threads, mcomps, workers, excache):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        # Read-ahead and fault-around off: every load is one miss, as in the paper's figure.
        r = sh([SPLITOS, "run", "--embedded", "--excache", excache, "--mcomponents", str(mcomps), "--mem-workers", str(workers), "--prefetch-lines", "0", "--fault-around", "0", "--prealloc", "0",
                "--fault-workers", str(threads), "--stats-json", f.name, "--", binary, str(mb), str(threads)])
        prog = json.loads(r.stdout)
        stats = json.load(open(f.name))
    return prog, stats


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mb", type=int, default=128)
    ap.add_argument("--excache", default="4M")
    args = ap.parse_args()
    ensure_env()
    binary = os.path.join(tempfile.gettempdir(), "splitos-seqload")
    sh(["gcc", "-O2", "-pthread", "-o", binary, os.path.join(ROOT, "scripts", "bench", "seqload.c")])

    res = {"machine": machine(), "params": vars(args), "floors": floors(20000), "native": {}, "runs": []}
    for t in (1, 4):
        res["native"][t] = json.loads(sh([binary, str(args.mb), str(t)]).stdout)
    configs = [(m, w, t) for m in (1, 2) for w in (0, 1, 2, 4) for t in (1, 4)]
    # A virtual machine that has been idle wakes its vCPUs slowly: warm up, untimed.
    run_one(binary, args.mb, 1, 1, 0, args.excache)
    for i, (m, w, t) in enumerate(configs):
        # Floors again right next to each configuration: this machine's latencies drift.
        fl = local_floors(3000)
        reps = []
        for _ in range(args.reps):
            prog, stats = run_one(binary, args.mb, t, m, w, args.excache)
            reps.append({"load_mb_s": prog["load_mb_s"], "load_p50_ns": prog["load"]["p50_ns"], "load_p99_ns": prog["load"]["p99_ns"],
                         "first_touch_p50_ns": prog["first_touch"]["p50_ns"], "first_touch_p99_ns": prog["first_touch"]["p99_ns"],
                         "miss_ns_p50": stats["miss_ns_p50"], "miss_ns_p99": stats["miss_ns_p99"], "breakdown": stats["miss_breakdown_ns_p50"],
                         "misses": stats["misses"], "plocal_fills": stats["plocal_fills"]})
        med = {k: statistics.median(r[k] for r in reps) for k in reps[0] if k != "breakdown"}
        med["breakdown"] = {k: statistics.median(r["breakdown"][k] for r in reps) for k in reps[0]["breakdown"]}
        med.update({"mcomponents": m, "workers": w, "threads": t, "spread_mb_s": [min(r["load_mb_s"] for r in reps), max(r["load_mb_s"] for r in reps)]})
        med["floor_ns"] = fl["uffd_fault_local_page"]["p50_ns"] + min(fl["tcp_rtt_4k"]["p50_ns"], fl["tcp_rtt_4k_polling"]["p50_ns"])
        res["runs"].append(med)
        print(f"[{i + 1}/{len(configs)}] mcomps={m} workers={w} threads={t}: {med['load_mb_s']:.0f} MB/s, load p50 {med['load_p50_ns'] / 1000:.1f} us", file=sys.stderr)

    # p-local: an ExCache larger than the data, so first touches evict nothing.
    pl = [run_one(binary, args.mb, 1, 1, 0, f"{2 * args.mb}M") for _ in range(args.reps)]
    fl = local_floors(3000)
    res["plocal"] = {"native_first_touch_p50_ns": fl["native_first_touch"]["p50_ns"],"first_touch_p50_ns": statistics.median(p["first_touch"]["p50_ns"] for p, _ in pl),
                     "first_touch_p99_ns": statistics.median(p["first_touch"]["p99_ns"] for p, _ in pl),
                     "plocal_fills": statistics.median(s["plocal_fills"] for _, s in pl), "misses": statistics.median(s["misses"] for _, s in pl)}
    os.makedirs(os.path.join(ROOT, "results"), exist_ok=True)
    with open(os.path.join(ROOT, "results", "fig8.json"), "w") as f:
        json.dump(res, f, indent=2)
    plot(res)
    report(res)


def plot(res):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4))
    for m in (1, 2):
        for t in (1, 4):
            rs = [r for r in res["runs"] if r["mcomponents"] == m and r["threads"] == t]
            ax.plot([str(r["workers"]) for r in rs], [r["load_mb_s"] for r in rs], marker="o", label=f"{m} mComponent(s), {t} thread(s)")
    ax.set_xlabel("mComponent worker threads (0 = receiving thread serves)")
    ax.set_ylabel("sequential load throughput, all misses (MB/s)")
    ax.set_title("LegoOS Figure 8 on this machine")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", "fig8.png"), dpi=110)


def report(res):
    f, mach = res["floors"], res["machine"]
    us = lambda ns: f"{ns / 1000:.1f}"
    base = [r for r in res["runs"] if r["mcomponents"] == 1 and r["threads"] == 1 and r["workers"] == 0][0]
    floor = base["floor_ns"]
    lines = [
        "<!-- fig8:begin (generated by scripts/bench/fig8.py; do not edit by hand) -->",
        "## Figure 8: remote miss and p-local micro-benchmark",
        "",
        f"Machine: {mach['cores']} cores ({mach['cpu']}), {mach['memory_mib']} MiB, Linux {mach['kernel']}. "
        f"{res['params']['mb']} MiB scanned with {res['params']['excache']} of ExCache, medians of {res['params']['reps']} runs.",
        "",
        "Floors measured at the start of the run (p50 / p99, µs); each configuration below is also compared with floors measured right before it. `tcp_rtt_4k` is a blocking ping-pong between two threads of one "
        "process (the scheduler keeps it on one CPU); `tcp_rtt_4k_polling` reads the way splitos does; `splitos_rpc_4k` is our RPC "
        "to a running mComponent in another process:",
        "",
        "| floor | p50 | p99 |",
        "|---|---|---|",
    ]
    for k in ("native_first_touch", "uffd_fault_local_page", "tcp_rtt_4k", "tcp_rtt_4k_polling", "splitos_rpc_4k"):
        if k in f:
            lines.append(f"| {k} | {us(f[k]['p50_ns'])} | {us(f[k]['p99_ns'])} |")
    lines += [
        "",
        "Sequential 4 KB loads that all miss, seen by the program (one load = one miss):",
        "",
        "| mComponents | mComponent workers | program threads | MB/s (min–max) | load p50 µs | load p99 µs | floor µs | load p50 / floor | pComponent miss p50 µs | evict / RPC / install p50 µs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["runs"]:
        b = r["breakdown"]
        lines.append(f"| {r['mcomponents']} | {r['workers']} | {r['threads']} | {r['load_mb_s']:.0f} ({r['spread_mb_s'][0]:.0f}–{r['spread_mb_s'][1]:.0f}) | "
                     f"{us(r['load_p50_ns'])} | {us(r['load_p99_ns'])} | {us(r['floor_ns'])} | {r['load_p50_ns'] / r['floor_ns']:.2f}x | {us(r['miss_ns_p50'])} | {us(b['evict'])} / {us(b['rpc'])} / {us(b['install'])} |")
    nat = res["native"]["1"] if "1" in res["native"] else res["native"][1]
    lines += [
        "",
        f"Native sequential loads (resident memory): {nat['load_mb_s']:.0f} MB/s, p50 {nat['load']['p50_ns']} ns.",
        "",
        f"- Remote miss, 1 thread, 1 mComponent, receiving thread serving: p50 {us(base['load_p50_ns'])} µs against a floor of "
        f"{us(floor)} µs measured next to it (uffd fault served locally + the faster raw TCP 4 KB round trip): "
        f"**{base['load_p50_ns'] / floor:.2f}x** the floor (target 1.5x). "
        f"The program-side time minus the pComponent's own time ({us(base['miss_ns_p50'])} µs) is the trap and wake-up cost.",
        f"- p-local first touch (ExCache larger than the data, {res['plocal']['plocal_fills']:.0f} p-local fills, no message): p50 "
        f"{us(res['plocal']['first_touch_p50_ns'])} µs, p99 {us(res['plocal']['first_touch_p99_ns'])} µs against a native first-touch fault of "
        f"{us(res['plocal']['native_first_touch_p50_ns'])} µs measured next to it: "
        f"**{res['plocal']['first_touch_p50_ns'] / res['plocal']['native_first_touch_p50_ns']:.2f}x** (target 1.5x).",
        f"- With a small ExCache a first touch also evicts and writes back a dirty line: p50 {us(base['first_touch_p50_ns'])} µs.",
        "",
        "What the numbers say:",
        "",
        "- A miss costs one trap to the pComponent, one RPC and one `UFFDIO_COPY`; its p50 sits at the floor of those two "
        "mechanisms. Its p99 is several times the p50: a virtual CPU that went idle takes tens of microseconds to wake.",
        "- A p-local first touch sends no message, yet it is a userfaultfd round trip between two processes, and that alone "
        "costs several native page faults here: the 1.5x-of-native target is below what userfaultfd itself costs on this machine "
        "(compare `uffd_fault_local_page` with `native_first_touch`). Closing it needs a fault path inside the kernel, or the "
        "faulting thread resolving its own p-local lines (UFFD_FEATURE_SIGBUS), which trades away kernel-initiated accesses.",
        "- With 2 cores, mComponent worker pools are slower than serving on the receiving thread: each request then needs a "
        "second thread wake-up, and three busy threads share two cores. LegoOS's worker scaling needs cores to scale onto. "
        "For the same reason four program threads gain little over one: their misses queue on two cores.",
        "- A second mComponent changes little for one scanning thread: the miss path is latency-bound, not bandwidth-bound.",
        "",
        "![Figure 8](fig8.png)",
        "<!-- fig8:end -->",
    ]
    replace_section(os.path.join(ROOT, "docs"), "fig8", lines)

if __name__ == "__main__":
    main()
