#!/usr/bin/env python3
"""The miss-path levers side by side (an ablation): each workload natively, under splitos with
its defaults, with every lever off, with each default lever off in turn, and with each
optional lever on in turn (LEVERS below), the configurations in a fresh random order each repetition. Reports
median wall time (min-max), the slowdown against native, traps for first touches, remote
misses, lines read ahead (and the sampled share of them the program used), installed around or
pre-allocated, write-backs, and the program's heap calls (answered by the pComponent alone, and
in all); writes results/levers.json, the ablation figure docs/levers.png and the "Levers"
section of docs/benchmarks.md. The machine's load average is recorded before and after.

With --tier, the compressed local tier instead, on top of the default levers: each workload
that evicts with the tier off, with a tier of --tier-ratio times its ExCache, and with the
tier off but the ExCache grown by the same bytes (the same local memory, uncompressed);
writes results/levers-tier.json and the "Compressed tier" section.

    python3 scripts/bench/levers.py [--reps 3] [--only TEXT] [--configs TEXT,...]
    python3 scripts/bench/levers.py --tier [--reps 5] [--tier-ratio 0.5]
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

from benchlib import ROOT, SPLITOS, ensure_env, machine, miss_workloads, replace_section


# Each lever as the `splitos run` flags that turn it off (defaults: on) or on (optional).
DEFAULT_LEVERS = [
    ("shared-memory transport", ["--transport", "tcp"]),
    ("read-ahead", ["--prefetch-lines", "0"]),
    ("fault-around", ["--fault-around", "0"]),
    ("pre-allocation", ["--prealloc", "0"]),
    ("heap reuse", ["--heap-reuse", "0"]),
    ("one-sided access", ["--one-sided", "off"]),
    ("idle polling", ["--idle-poll", "off"]),
    ("miss served on the faulting CPU", ["--fault-cpu", "any"]),
]
OPTIONAL_LEVERS = [
    ("read-ahead sequential", ["--prefetch", "sequential"]),
    ("read-ahead nextline", ["--prefetch", "nextline"]),
    ("background evictor", ["--evict-reserve", "1"]),
    ("dirty tracking by scan", ["--dirty-tracking", "scan"]),
    ("huge pages", ["--huge-pages", "on"]),
    ("adaptive polling", ["--polling", "adaptive"]),
    ("access sampling with ghost-clock", ["--eviction", "ghost-clock", "--access-sampling", "unmap"]),
]


def configs():
    """(label, flags) of every configuration, over the binary's defaults."""
    out = [("defaults", []), ("all off", [f for _, fl in DEFAULT_LEVERS for f in fl])]
    out += [(f"without {name}", fl) for name, fl in DEFAULT_LEVERS]
    out += [(f"with {name}", fl) for name, fl in OPTIONAL_LEVERS]
    return out


def workloads(tmp):
    """The miss-path workloads, and word counting and a CPython record table at half their
    heap: the ablation at 25% and at 50%."""
    wordfreq = next(cmd for name, cmd, _ in miss_workloads(tmp) if name.startswith("wordfreq"))
    records = [sys.executable, os.path.join(ROOT, "scripts", "workloads", "records.py"), "100000"]
    return miss_workloads(tmp) + [("wordfreq (CPython) at 50%", wordfreq, "44M"), ("record table (CPython) at 50%", records, "39M")]


def run(cmd, excache=None, flags=()):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        full = cmd if excache is None else [SPLITOS, "run", "--embedded", "--excache", excache, *flags, "--stats-json", f.name, "--", *cmd]
        t0 = time.monotonic()
        subprocess.run(full, check=True, stdout=subprocess.DEVNULL)
        wall = time.monotonic() - t0
        stats = json.load(open(f.name)) if excache is not None else {}
    return wall, stats


def remote(s):
    return s["misses"] - s["plocal_fills"] - s.get("tier_hits", 0)


def mib(size):
    assert size.endswith("M"), size
    return int(size[:-1])


def tier_main(args):
    """The compressed tier against no tier and against the same memory given to the ExCache."""
    res = {"machine": machine(), "params": vars(args), "workloads": []}
    with tempfile.TemporaryDirectory() as tmp:
        # Only workloads that evict: with a cache that fits, the tier never sees a line.
        for name, cmd, ex in [w for w in miss_workloads(tmp) if not w[0].endswith("fits")]:
            t = max(1, round(mib(ex) * args.tier_ratio))
            configs = [("tier off", ex, "0"), (f"tier {t}M", ex, f"{t}M"), (f"tier off, ExCache {mib(ex) + t}M", f"{mib(ex) + t}M", "0")]
            native, runs = [], {c[0]: [] for c in configs}
            for rep in range(args.reps):
                native.append(run(cmd)[0])
                for label, e, tier in (configs if rep % 2 == 0 else configs[::-1]):
                    runs[label].append(run(cmd, e, ["--compressed-tier", tier]))
            row = {"workload": name, "excache": ex, "native_s": statistics.median(native), "configs": {}}
            for label, rs in runs.items():
                walls = [w for w, _ in rs]
                med = lambda k: statistics.median(s.get(k, 0) for _, s in rs)
                packed = sum(s["tier_bytes_packed"] for _, s in rs)
                row["configs"][label] = {"wall_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls),
                                         "remote_misses": statistics.median(remote(s) for _, s in rs), "tier_hits": med("tier_hits"),
                                         "tier_stores": med("tier_stores"), "tier_incompressible": med("tier_incompressible"),
                                         "flushes": med("flushes"), "tier_writebacks": med("tier_writebacks"),
                                         "ratio": sum(s["tier_bytes_raw"] for _, s in rs) / packed if packed else None,
                                         "pack_us": sum(s["tier_pack_ns"] for _, s in rs) / 1000 / max(1, sum(s["tier_stores"] + s["tier_incompressible"] for _, s in rs)),
                                         "unpack_us": sum(s["tier_unpack_ns"] for _, s in rs) / 1000 / max(1, sum(s["tier_hits"] + s["tier_writebacks"] for _, s in rs))}
            res["workloads"].append(row)
            print(f"{name} done", file=sys.stderr)
    # Other work on the machine shows in the spread: say how loaded it was.
    res["load_end"] = os.getloadavg()[0]
    os.makedirs(os.path.join(ROOT, "results"), exist_ok=True)
    with open(os.path.join(ROOT, "results", "levers-tier.json"), "w") as f:
        json.dump(res, f, indent=2)
    m = res["machine"]
    lines = [
        "<!-- tier:begin (generated by scripts/bench/levers.py --tier; do not edit by hand) -->",
        "## Compressed tier",
        "",
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_mib']} MiB, Linux {m['kernel']}; load average {res['params']['load']:.1f} at the start, {res['load_end']:.1f} at the end. "
        f"Medians of {args.reps} runs, configurations interleaved; default levers on; "
        f"a tier of {args.tier_ratio:g}x the ExCache, and the same bytes given to the ExCache instead; embedded cluster with its default transport.",
        "",
        "| workload | configuration | wall s (min–max) | x native | remote misses | tier hits | write-backs to the store | of them from the tier | ratio | µs to compress / decompress a page |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in res["workloads"]:
        for label, c in row["configs"].items():
            ratio = f"{c['ratio']:.1f}x" if c["ratio"] else "–"
            cost = f"{c['pack_us']:.1f} / {c['unpack_us']:.1f}" if c["ratio"] else "–"
            lines.append(f"| {row['workload']} (ExCache {row['excache']}) | {label} | {c['wall_s']:.2f} ({c['min_s']:.2f}–{c['max_s']:.2f}) | {c['wall_s'] / row['native_s']:.1f}x | "
                         f"{c['remote_misses']:.0f} | {c['tier_hits']:.0f} | {c['flushes']:.0f} | {c['tier_writebacks']:.0f} | {ratio} | {cost} |")
    lines += ["", "Native: " + ", ".join(f"{r['workload']} {r['native_s']:.2f} s" for r in res["workloads"]) + ".", "<!-- tier:end -->"]
    print("\n".join(lines))
    replace_section(os.path.join(ROOT, "docs"), "tier", lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="", help="run only the workloads whose name contains this")
    ap.add_argument("--configs", default="", help="run only the configurations whose label contains one of these (comma-separated); native and defaults always run")
    ap.add_argument("--tier", action="store_true", help="measure the compressed tier instead")
    ap.add_argument("--tier-ratio", type=float, default=0.5, help="tier size as a fraction of each workload's ExCache")
    ap.add_argument("--replot", action="store_true", help="only redraw the figure and the report from results/levers.json")
    args = ap.parse_args()
    ensure_env()
    if args.replot:
        return report(json.load(open(os.path.join(ROOT, "results", "levers.json"))))
    if args.tier:
        args.load = os.getloadavg()[0]
        return tier_main(args)
    wanted = [w for w in args.configs.split(",") if w]
    chosen = [c for c in configs() if c[0] == "defaults" or not wanted or any(w in c[0] for w in wanted)]
    res = {"machine": machine(), "params": vars(args), "configs": {label: flags for label, flags in chosen}, "load_before": os.getloadavg(), "workloads": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd, ex in workloads(tmp):
            if args.only not in name:
                continue
            native, runs = [], {c[0]: [] for c in chosen}
            for rep in range(args.reps):
                # A fresh order each repetition (native included): a run right after another
                # that freed much memory was measurably slower here, whatever ran.
                order = [("native", None), *chosen]
                random.Random(rep).shuffle(order)
                for label, flags in order:
                    if flags is None:
                        native.append(run(cmd)[0])
                    else:
                        runs[label].append(run(cmd, ex, flags))
            row = {"workload": name, "excache": ex, "native_s": statistics.median(native), "native_min_s": min(native), "native_max_s": max(native), "configs": {}}
            for label, rs in runs.items():
                walls = [w for w, _ in rs]
                med = lambda k: statistics.median(s[k] for _, s in rs)
                row["configs"][label] = {"wall_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls),
                                         "remote_misses": statistics.median(remote(s) for _, s in rs),
                                         "plocal_fills": med("plocal_fills"), "prefetched": med("prefetched"),
                                         "sample_used": sum(s["prefetch_sample_used"] for _, s in rs), "sample_wasted": sum(s["prefetch_sample_wasted"] for _, s in rs),
                                         "faulted_around": med("faulted_around"), "preallocated": med("preallocated"), "flushes": med("flushes"),
                                         "heap_calls": med("heap_calls"), "heap_calls_local": med("heap_calls_local"), "heap_call_ms": med("heap_call_ns") / 1e6}
            res["workloads"].append(row)
            print(f"{name} done", file=sys.stderr)
    res["load_after"] = os.getloadavg()
    os.makedirs(os.path.join(ROOT, "results"), exist_ok=True)
    with open(os.path.join(ROOT, "results", "levers.json"), "w") as f:
        json.dump(res, f, indent=2)
    report(res)


def plot(res):
    """The ablation figure: per workload, time over native with each combination of levers."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = res["workloads"]
    fig, axes = plt.subplots(1, len(rows), figsize=(4 * len(rows), 5), sharey=False, squeeze=False)
    axes = axes[0]
    for ax, row in zip(axes, rows):
        labels = list(row["configs"])
        vals = [row["configs"][c]["wall_s"] / row["native_s"] for c in labels]
        errs = [[v - row["configs"][c]["min_s"] / row["native_s"] for v, c in zip(vals, labels)],
                [row["configs"][c]["max_s"] / row["native_s"] - v for v, c in zip(vals, labels)]]
        ax.barh(range(len(labels)), vals, xerr=errs, capsize=2)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels if ax is axes[0] else [""] * len(labels), fontsize=7)
        ax.invert_yaxis()
        ax.set_title(row["workload"], fontsize=8)
        ax.set_xlabel("time / native (lower is better)", fontsize=8)
    fig.suptitle("Levers of the miss path: defaults, all off, each default off, each option on (median, min–max)", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", "levers.png"), dpi=100)
    plt.close(fig)


def used(c):
    seen = c.get("sample_used", 0) + c.get("sample_wasted", 0)
    return f"{100 * c['sample_used'] / seen:.0f}%" if seen else "–"


def report(res):
    plot(res)
    p = res["params"]
    m = res["machine"]
    flags = "; ".join(f"{label}: `{' '.join(fl)}`" for label, fl in res["configs"].items() if fl)
    lines = [
        "<!-- levers:begin (generated by scripts/bench/levers.py; do not edit by hand) -->",
        "## Levers of the miss path",
        "",
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_mib']} MiB, Linux {m['kernel']}. Medians of {p['reps']} runs, "
        f"configurations (and native) in a fresh random order each repetition; an embedded cluster (its start is in every wall time) with its defaults (`splitos run --help`), "
        f"and the flags of each configuration: {flags}. Load average (1 min) {res['load_before'][0]:.1f} before, {res['load_after'][0]:.1f} after. "
        "Read ahead used: of the sampled lines read ahead (one in 16), the share the program touched before eviction.",
        "",
        "![levers](levers.png)",
        "",
        "| workload | levers | wall s (min–max) | x native | trapped first touches | remote misses | read ahead | read ahead used | installed around | pre-allocated | write-backs | heap calls: local/all, ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in res["workloads"]:
        for label, c in row["configs"].items():
            lines.append(f"| {row['workload']} | {label} | {c['wall_s']:.2f} ({c['min_s']:.2f}–{c['max_s']:.2f}) | {c['wall_s'] / row['native_s']:.2f}x | "
                         f"{c['plocal_fills']:.0f} | {c['remote_misses']:.0f} | {c['prefetched']:.0f} | {used(c)} | {c['faulted_around']:.0f} | {c['preallocated']:.0f} | {c['flushes']:.0f} | "
                         f"{c['heap_calls_local']:.0f}/{c['heap_calls']:.0f}, {c['heap_call_ms']:.0f} |")
    lines += ["", "Native: " + ", ".join(f"{r['workload']} {r['native_s']:.2f} s ({r['native_min_s']:.2f}–{r['native_max_s']:.2f})" for r in res["workloads"]) + ".", "<!-- levers:end -->"]
    print("\n".join(lines))
    replace_section(os.path.join(ROOT, "docs"), "levers", lines)


if __name__ == "__main__":
    main()
