#!/usr/bin/env python3
"""The datacenter simulation (docs/simulation.md) on the shipped Alibaba trace: ThymesisFlow's
figure 1 (fragmentation index, modules that could be switched off), LegoOS's figure 4
(utilization over time) and table 1 (mean time to failure), and the simulator's speed.

- The trace as published (8,152 tasks on 1,523 nodes), then 20, 100 and 200 shifted copies
  of its task list on the same nodes (`--load`), with best fit as in ThymesisFlow.
- The busy month: 150 copies, averaged from day 120 on (`--window`), when the cluster is
  as busy as the clusters both papers studied (half its CPU allocated): each placement
  policy (best fit, first fit, and least loaded, the global managers' default), and the splitos model under
  each topology (links per module, racks, none).
- Speed: 100 copies of the cluster and of the task list (`--scale 100`), three runs,
  median events per second.

    python3 scripts/bench/sim.py [--out DIR]

Writes DIR/sim.json, docs/sim-fig1.png, docs/sim-fig4.png and the section of
docs/benchmarks.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import ROOT, SPLITOS, ensure_env, machine, replace_section

NODES = os.path.join(ROOT, "data", "traces", "alibaba-openb-nodes.csv")
TASKS = os.path.join(ROOT, "data", "traces", "alibaba-openb-pods.csv")
MODELS = ["fixed", "disaggregated", "splitos"]
# The busy month: 150 shifted copies of the task list, averaged from day 120 on.
BUSY = ["--load", "150", "--window", f"{120 * 86400}:"]
KEYS = ["fragmentation_cpu", "fragmentation_mem", "switched_off_compute", "switched_off_memory", "utilization_cpu", "utilization_mem"]
# ThymesisFlow (MICRO '20) section I, figure 1, on the Google trace.
PAPER = {"fixed": {"fragmentation_cpu": 0.16, "fragmentation_mem": 0.295, "switched_off_compute": 0.01, "switched_off_memory": 0.01},
         "disaggregated": {"fragmentation_cpu": 0.0386, "fragmentation_mem": 0.092, "switched_off_compute": 0.08, "switched_off_memory": 0.27}}


def sim(tmp, *args):
    out = os.path.join(tmp, "sim.json")
    started = time.monotonic()
    subprocess.run([SPLITOS, "sim", "--nodes", NODES, "--tasks", TASKS, "--json", out, "--quiet", *args], check=True, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - started
    r = json.load(open(out))
    r["wall_seconds"] = wall
    return r


def summary(r, models=MODELS):
    out = {}
    for m in models:
        x = r[m]
        out[m] = {k: x[k] for k in KEYS}
        out[m].update({k: x[k] for k in ("unplaced", "placed", "peak_compute_on", "peak_memory_on", "events_per_second")})
        out[m]["waited"] = x["waits"]["waited"]
        out[m]["wait_p50_seconds"] = x["waits"]["p50_seconds"]
        out[m]["mttf_vs_fixed"] = x["reliability"]["mttf_vs_fixed"]
        out[m]["cluster_mttf_days"] = x["reliability"]["cluster_mttf_days"]
        if x.get("redundancy"):
            out[m]["redundancy"] = x["redundancy"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "results"))
    ap.add_argument("--reps", type=int, default=3, help="runs of the scale-up, for its speed")
    args = ap.parse_args()
    ensure_env()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = {"machine": machine(), "loads": {}, "placements": {}, "topologies": {}, "series": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for load in (1, 20, 100, 200):
            r = sim(tmp, "--load", str(load), "--samples", "150")
            res["loads"][str(load)] = summary(r)
            if load in (1, 100):
                # The two figure 4 plots: the fixed cluster's utilization over time.
                res["series"][str(load)] = {k: r["fixed"]["series"][k] for k in ("time", "utilization_cpu", "utilization_mem")}
            if load == 1:
                res["trace"] = r["trace"]
                res["paper_mttf"] = r["paper"]
            print(f"load {load}: " + ", ".join(f"{m} frag {r[m]['fragmentation_cpu']:.3f}/{r[m]['fragmentation_mem']:.3f}" for m in MODELS), flush=True)
        for placement in ("best-fit", "first-fit", "least-loaded"):
            res["placements"][placement] = summary(sim(tmp, *BUSY, "--placement", placement, "--samples", "2"))
        for topo in ("links:16", "links:4", "racks:8", "none"):
            res["topologies"][topo] = summary(sim(tmp, *BUSY, "--models", "splitos", "--topology", topo, "--samples", "2"), ["splitos"])["splitos"]
        runs = []
        for _ in range(args.reps):
            r = sim(tmp, "--scale", "100", "--samples", "2")
            runs.append({"events": r["run"]["events"], "seconds": r["run"]["seconds"], "wall_seconds": r["wall_seconds"], "events_per_second": r["run"]["events_per_second"]})
        res["scale_100"] = {"runs": runs, "nodes": r["trace"]["replayed_nodes"], "tasks": r["trace"]["replayed_tasks"],
                            "median_events_per_second": statistics.median(x["events_per_second"] for x in runs),
                            "median_wall_seconds": statistics.median(x["wall_seconds"] for x in runs)}
    os.makedirs(args.out, exist_ok=True)
    json.dump(res, open(os.path.join(args.out, "sim.json"), "w"), indent=1)

    docs = os.path.join(ROOT, "docs")
    # ThymesisFlow figure 1: fragmentation index and modules switched off in the busy month,
    # next to the paper's on the Google trace.
    at = res["placements"]["best-fit"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (title, keys, labels) in zip(axes, [("Fragmentation index (lower is better)", ["fragmentation_cpu", "fragmentation_mem"], ["CPU", "memory"]),
                                               ("Switched off (higher is better)", ["switched_off_compute", "switched_off_memory"], ["compute", "memory"])]):
        bars = [(f"{m}\n(Alibaba, busy)", [at[m][k] for k in keys]) for m in MODELS] + [(f"{m}\n(paper, Google)", [PAPER[m][k] for k in keys]) for m in ("fixed", "disaggregated")]
        width = 0.38
        for i, label in enumerate(labels):
            ax.bar([j + (i - 0.5) * width for j in range(len(bars))], [b[1][i] * 100 for b in bars], width, label=label, hatch=None if i == 0 else "//")
        ax.set_xticks(range(len(bars)))
        ax.set_xticklabels([b[0] for b in bars], fontsize=7)
        ax.set_ylabel("% of the resource" if "Frag" in title else "% of the units")
        ax.set_title(title)
        ax.legend()
    fig.suptitle("ThymesisFlow figure 1 on the Alibaba openb trace (150 shifted copies of its tasks, from day 120; best fit)")
    fig.tight_layout()
    fig.savefig(os.path.join(docs, "sim-fig1.png"), dpi=110)
    # LegoOS figure 4: the cluster's CPU and memory utilization over time.
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    for ax, load in zip(axes, ("1", "100")):
        s = res["series"][load]
        days = [t / 86400 for t in s["time"]]
        ax.plot(days, [v * 100 for v in s["utilization_cpu"]], label="CPU")
        ax.plot(days, [v * 100 for v in s["utilization_mem"]], label="memory")
        ax.set_xlabel("day of the trace")
        ax.set_title(f"{'the trace as published' if load == '1' else '100 shifted copies of its tasks'}")
        ax.legend()
    axes[0].set_ylabel("% allocated")
    fig.suptitle("LegoOS figure 4: utilization of the Alibaba openb cluster (1,523 nodes)")
    fig.tight_layout()
    fig.savefig(os.path.join(docs, "sim-fig4.png"), dpi=110)

    m = res["machine"]
    pct = lambda v: f"{v * 100:.2f}%"
    lines = ["<!-- sim:begin (written by scripts/bench/sim.py) -->", "## Datacenter simulation (ThymesisFlow figure 1, LegoOS figure 4 and table 1)", "",
             f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_mib'] // 1024} GiB, Linux {m['kernel']}. `python3 scripts/bench/sim.py`; data in `results/sim.json`; what the numbers mean in [simulation.md](simulation.md).", "",
             "Best fit, the shipped trace with N shifted copies of its task list on its 1,523 nodes (time-weighted averages):", "",
             "| load | model | fragmentation CPU | fragmentation memory | switched off compute | switched off memory | utilization CPU / memory | unplaced | MTTF vs fixed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for load, runs in res["loads"].items():
        for name in MODELS:
            x = runs[name]
            lines.append(f"| x{load} | {name} | {pct(x['fragmentation_cpu'])} | {pct(x['fragmentation_mem'])} | {pct(x['switched_off_compute'])} | {pct(x['switched_off_memory'])} | {pct(x['utilization_cpu'])} / {pct(x['utilization_mem'])} | {x['unplaced']} | {x['mttf_vs_fixed']:.2f}x |")
    lines += ["", "ThymesisFlow's figure 1 (Google trace): fixed 16% / 29.5% fragmentation, 1% of servers off; disaggregated 3.86% / 9.2%, 8% of compute and 27% of memory modules off.", "",
              "The busy month (x150, averaged from day 120 on, half the CPU allocated): each placement policy (fragmentation CPU / memory, switched off compute / memory, unplaced, MTTF vs fixed):", "", "| placement | fixed | disaggregated | splitos |", "|---|---|---|---|"]
    for placement, runs in res["placements"].items():
        lines.append(f"| {placement} | " + " | ".join(f"{pct(runs[n]['fragmentation_cpu'])} / {pct(runs[n]['fragmentation_mem'])}, {pct(runs[n]['switched_off_compute'])} / {pct(runs[n]['switched_off_memory'])}, {runs[n]['unplaced']}, {runs[n]['mttf_vs_fixed']:.2f}x" for n in MODELS) + " |")
    lines += ["", "The splitos model's topology in the busy month (best fit):", "", "| topology | fragmentation memory | switched off memory | peak mComponents on | unplaced | waited |", "|---|---|---|---|---|---|"]
    for topo, x in res["topologies"].items():
        lines.append(f"| {topo} | {pct(x['fragmentation_mem'])} | {pct(x['switched_off_memory'])} | {x['peak_memory_on']} | {x['unplaced']} | {x['waited']} |")
    s = res["scale_100"]
    lines += ["", f"Speed: 100 copies of the cluster and of the task list ({s['nodes']:,} nodes, {s['tasks']:,} tasks, three models on {m['cores']} cores): median {s['median_wall_seconds']:.1f} s for the whole run, {s['median_events_per_second']:,.0f} events per second over {args.reps} runs.", "",
              "![ThymesisFlow figure 1](sim-fig1.png)", "", "![LegoOS figure 4](sim-fig4.png)", "<!-- sim:end -->"]
    replace_section(docs, "sim", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
