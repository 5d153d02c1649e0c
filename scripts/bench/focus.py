#!/usr/bin/env python3
"""The suite's workloads at one or a few memory shares, for a change to the memory path: each
splitos configuration named with --with beside Linux swapping to zram (and, with --swap-file,
to a swap file) under the same cgroup limit, and native, interleaved run by run. Reports per
workload the median time over native and its spread, remote misses beside the kernel's
swap-ins, and time over native per miss; writes results/focus.json and the "focus" section
of docs/benchmarks.md (--no-doc: only the JSON and the terminal).

    python3 scripts/bench/focus.py [--only node --only sqlite3] [--fractions 0.5] [--reps 3]
        [--with "default=" --with "ws=--eviction workingset --ways 0"] [--swap-file] [--quick]

A configuration is LABEL=OPTIONS: OPTIONS are `splitos run` options added to the suite's own
(`--embedded --excache SHARE --stats-json FILE`); the label "default" with none measures the
defaults. The workloads, their inputs, working sets, the cgroup's limit and the swap devices
are suite.py's, so figures compare with docs/benchmarks.md. Needs root.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

import suite
from benchlib import ROOT, ensure_env, machine, publish, splitos_configs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", default=[], help="a workload whose name contains this (repeatable; default: all)")
    ap.add_argument("--fractions", default="0.5", help="ExCache shares of the working set, comma-separated (default 0.5)")
    ap.add_argument("--with", dest="configs", action="append", default=[], help='LABEL=OPTIONS: a splitos configuration (repeatable; default "default=")')
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every configuration, interleaved (default 3)")
    ap.add_argument("--swap-file", action="store_true", help="also Linux swapping to a swap file")
    ap.add_argument("--quick", action="store_true", help="the suite's small inputs")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "focus.json"), help="where the JSON goes")
    ap.add_argument("--no-doc", action="store_true", help="do not write the section of docs/benchmarks.md")
    ap.add_argument("--report", action="store_true", help="measure nothing: write the section again from the JSON at --out")
    args = ap.parse_args()
    if args.report:
        write_report(json.load(open(args.out)), args.no_doc)
        return
    if os.geteuid() != 0:
        sys.exit("focus.py needs root: memory cgroups and swap devices")
    configs = splitos_configs(args.configs)
    fractions = [float(f) for f in args.fractions.split(",")]
    ensure_env()
    wl = {n: s for n, s in suite.workloads(args.quick).items() if not args.only or any(o in n for o in args.only)}
    if not wl:
        sys.exit(f"no workload's name contains any of {args.only}")
    kinds = ["zram"] + (["swap-file"] if args.swap_file else [])
    res = {"machine": machine(), "load_before": os.getloadavg()[0], "reps": args.reps, "configs": {l: o for l, o in configs}, "workloads": {}}
    for name, spec in wl.items():
        env, cmd = spec.get("env"), spec["cmd"]
        ws = suite.working_set_kib(cmd, env)
        local = suite.local_footprint_bytes(cmd, env)
        r = res["workloads"][name] = {"working_set_kib": ws, "native_s": [], "runs": {}}
        suite.TIMEOUT["s"] = None
        digest = None
        for rep in range(args.reps):
            secs, d, code, _, err = suite.run(cmd, env)
            if code != 0:
                sys.exit(f"{name} failed natively: {err.decode()[-300:]}")
            digest = d
            r["native_s"].append(secs)
            suite.TIMEOUT["s"] = max(20.0, 15 * statistics.median(r["native_s"]))
            for f in fractions:
                for label, opts in configs:
                    with tempfile.NamedTemporaryFile(suffix=".json") as st:
                        secs, d, code, _, err = suite.run(cmd, env, suite.splitos_prefix(int(ws * f), st.name, opts))
                        stats = json.load(open(st.name)) if os.path.getsize(st.name) else {}
                    run = {"s": stats.get("wall_s", secs), "ok": d == digest and code == 0, "timed_out": code == -1,
                           **{k: stats.get(k) for k in ("misses", "plocal_fills", "evictions", "flushes", "wp_faults", "sample_touches", "miss_ns_p50", "miss_ns_mean", "processes")}}
                    if not run["ok"] and code != -1:
                        run["stderr"] = err.decode(errors="replace")[-300:]
                    r["runs"].setdefault(f"{label} {f}", []).append(run)
                for kind in kinds:
                    limit = int(ws * f) * 1024 + local
                    with suite.linux_swapping("file" if kind == "swap-file" else "zram", max(2 * ws // 1024, 64), limit) as (pre, seen):
                        secs, d, code, _, _ = suite.run(cmd, env, pre, suite.four_kib_pages)
                    r["runs"].setdefault(f"{kind} {f}", []).append({"s": secs, "ok": d == digest and code == 0, **seen})
            print(f"{name}: repetition {rep + 1} of {args.reps} done", file=sys.stderr, flush=True)
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        json.dump(res, open(args.out, "w"), indent=2)
    write_report(res, args.no_doc)


def write_report(res, no_doc):
    publish("focus", "scripts/bench/focus.py", report(res), no_doc)


def report(res):
    """The section: per workload, each configuration's time over native (median, min-max) and
    over Linux+zram at the same share, misses (first touches served locally included) and those
    that fetched a page, beside the kernel's swap-ins, and time over native per miss and per
    remote miss (the issue's measure: what a miss costs the program, start-up included)."""
    m = res["machine"]
    out = ["## The memory path beside Linux swapping (focus.py)", "",
           f"{m['cores']} vCPUs ({m['cpu']}), {m['memory_mib']} MiB, Linux {m['kernel']}; load average {res['load_before']:.2f} before; "
           f"medians of {res['reps']} interleaved runs (min-max). Configurations (`splitos run` options beside `--excache SHARE`): "
           + "; ".join(f"`{label}`: {' '.join(o) or 'the defaults'}" for label, o in res["configs"].items())
           + ". zram: Linux under a memory cgroup of the same share plus the program's local footprint (what the cgroup charges "
           "that splitos keeps local and the program keeps using; input read once is not counted: the memory evaluation's "
           "section says how it is taken), swapping to zram; Node.js with `" + suite.NODE_HEAP + "` in every run, since it "
           "sizes its heap from a cgroup's limit. A run past 15 times native is stopped (marked >)."]
    for name, r in res["workloads"].items():
        native = statistics.median(r["native_s"])
        out += ["", f"**{name}**: native {native:.2f} s, working set {r['working_set_kib'] // 1024} MiB", "",
                "| configuration | time over native | over zram | misses | of them remote | zram swap-ins | µs over native per miss | per remote miss | write-protect faults |", "|---|---|---|---|---|---|---|---|---|"]
        for key, runs in r["runs"].items():
            xs = sorted(x["s"] / native for x in runs)
            bound = ">" if any(x.get("timed_out") for x in runs) else ""
            misses = [x["misses"] for x in runs if x.get("misses") is not None]
            mm = statistics.median(misses) if misses else None
            remote = [x["misses"] - x["plocal_fills"] for x in runs if x.get("plocal_fills") is not None]
            swap = statistics.median([x["swap_ins"] for x in runs]) if "swap_ins" in runs[0] else None
            wp = [x["wp_faults"] for x in runs if x.get("wp_faults") is not None]
            med = statistics.median(x["s"] for x in runs)
            per = (med - native) / mm * 1e6 if mm and not bound else None
            rm = statistics.median(remote) if remote else None
            per_remote = (med - native) / rm * 1e6 if rm and not bound else None
            share = key.rsplit(" ", 1)[-1]
            zram = r["runs"].get(f"zram {share}")
            over = med / statistics.median(x["s"] for x in zram) if zram and not key.startswith("zram") else None
            wrong = "" if all(x["ok"] or x.get("timed_out") for x in runs) else " (output differs!)"
            out.append(f"| {key}{wrong} | {bound}{statistics.median(xs):.2f} ({xs[0]:.2f}-{xs[-1]:.2f}) | {f'{bound}{over:.2f}' if over else ''} | {f'{mm:,.0f}' if mm is not None else ''} | "
                       f"{f'{rm:,.0f}' if rm is not None else ''} | {f'{swap:,.0f}' if swap is not None else ''} | {f'{per:.1f}' if per else ''} | {f'{per_remote:.1f}' if per_remote else ''} | {f'{statistics.median(wp):,.0f}' if wp else ''} |")
    return out


if __name__ == "__main__":
    main()
