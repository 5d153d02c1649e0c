#!/usr/bin/env python3
"""Programs sharing one small ExCache: N copies of a CPython one-liner (by default 200,000
strings in a list and a dict, about 40 MiB of heap each) at once on one pComponent whose
ExCache holds a fraction of what they need together, against the same programs natively and one copy alone on the same
cluster. Each configuration (a build and cluster settings) gets a fresh `cluster up`; the
configurations are interleaved run by run. Reports, per configuration, the median over programs
and runs of each program's wall time, remote misses and the pComponent's miss p50/p99, and the
components' CPU time per miss; writes results/shared.json and the "Shared ExCache" section of
docs/benchmarks.md.

    python3 scripts/bench/shared.py [--programs 4] [--range 200000] [--excache 16M] [--reps 3]
        [--build NAME=PATH ...] [--config NAME:SETTINGS ...] [--about TEXT]
    python3 scripts/bench/shared.py --report-only   # the section again from results/shared.json

A build is a `splitos` binary with its `libsplitos_shim.so` next to it (copy both out of
target/release before rebuilding); the default is this tree's release build. SETTINGS are
`section.key=value` pairs joined by `;` that go into the cluster's configuration, for example
`pcomponent.fault_spin_us=0;transport.shm.spin_us=0`; the default is one configuration with
none.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import ROOT, SPLITOS, machine, replace_section

CLOCK = os.sysconf("SC_CLK_TCK")


def program(n):
    return [sys.executable, "-c", f"x=[str(i*i) for i in range({n})]; d={{k:len(k) for k in x}}; print(sum(d.values()))"]


def toml(excache, settings):
    """The cluster's configuration: one pComponent with `excache`, two mComponents, then the
    settings (`pcomponent.KEY`, `mcomponent.KEY` for every mComponent, `transport.shm.KEY`)."""
    sec = {"pcomponent": [f'excache = "{excache}"'], "mcomponent": [], "transport.shm": []}
    for s in filter(None, settings.split(";")):
        key, value = s.split("=", 1)
        where, key = key.rsplit(".", 1)
        value = value if value.lstrip("-").isdigit() or value in ("true", "false") else json.dumps(value)
        sec[where].append(f"{key} = {value}")
    out = ["[[pcomponent]]", *sec["pcomponent"], *(["[[mcomponent]]", *sec["mcomponent"]] * 2)]
    if sec["transport.shm"]:
        out += ["[transport.shm]", *sec["transport.shm"]]
    return "\n".join(out) + "\n"


def cpu_of(pids):
    total = 0
    for p in pids:
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
        except OSError:
            pass
    return total / CLOCK


def on_cluster(splitos, config, n, rng, expected):
    """Starts a cluster, runs `n` programs at once on it, then one alone, each of which must
    print `expected` (the native output); returns each of the
    `n` runs' counters (with `wall_s` and whether `run` printed its ExCache hint), the alone
    run's, and the components' CPU seconds during the `n` runs."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, SPLITOS_STATE_DIR=d)
        conf = os.path.join(d, "c.toml")
        open(conf, "w").write(config)
        subprocess.run([splitos, "cluster", "up", "--config", conf], env=env, check=True, capture_output=True)
        try:
            pids = json.load(open(os.path.join(d, "cluster.json")))["pids"]
            stats = [os.path.join(d, f"s{i}.json") for i in range(n + 1)]
            c0 = cpu_of(pids)
            procs = [subprocess.Popen([splitos, "run", "--stats-json", stats[i], "--", *program(rng)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
            outs = [p.communicate() for p in procs]
            cpu = cpu_of(pids) - c0
            alone = subprocess.run([splitos, "run", "-q", "--stats-json", stats[n], "--", *program(rng)], env=env, capture_output=True, text=True)
        finally:
            subprocess.run([splitos, "cluster", "down", "--force"], env=env, capture_output=True)
        results = [(p.returncode, o, e) for p, (o, e) in zip(procs, outs)] + [(alone.returncode, alone.stdout, alone.stderr)]
        if any(r for r, _, _ in results) or {o for _, o, _ in results} != {expected}:
            raise SystemExit("a run failed or printed something else:\n" + "\n".join(f"exit {r}, stdout {o!r}, stderr {e[-500:]!r}" for r, o, e in results))
        runs = []
        for i, (_, err) in enumerate(outs):
            s = json.load(open(stats[i]))
            s["hint"] = next((l for l in err.splitlines() if l.startswith("splitos: hint:")), "")
            runs.append(s)
        return runs, json.load(open(stats[n])), cpu


def native(n, rng):
    t0 = time.monotonic()
    procs = [subprocess.Popen(program(rng), stdout=subprocess.DEVNULL) for _ in range(n)]
    for p in procs:
        p.wait()
    return time.monotonic() - t0


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", type=int, default=4)
    ap.add_argument("--range", type=int, default=200000, help="strings each program makes")
    ap.add_argument("--excache", default="16M")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--build", action="append", default=[], help="NAME=PATH of a splitos binary (repeatable)")
    ap.add_argument("--config", action="append", default=[], help="NAME:SETTINGS (repeatable)")
    ap.add_argument("--about", default="", help="what the builds are, for the report")
    ap.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    ap.add_argument("--report-only", action="store_true", help="write the report of results/shared.json again")
    args = ap.parse_args()
    out = os.path.join(ROOT, "results", "shared.json")
    if args.report_only:
        report(json.load(open(out)), args.no_docs)
        return
    # Only the release build is needed (benchlib.ensure_env would also set up the plotting environment).
    if not os.path.exists(SPLITOS):
        subprocess.run(["cargo", "build", "--release", "--workspace", "--quiet"], cwd=ROOT, check=True)
    builds = [b.split("=", 1) for b in args.build] or [["this tree", SPLITOS]]
    configs = [c.split(":", 1) for c in args.config] or [["defaults", ""]]
    cases = [(b, c) for b in builds for c in configs]
    data = {(b[0], c[0]): {"runs": [], "alone": [], "cpu": []} for b, c in cases}
    nat = []
    expected = subprocess.run(program(args.range), capture_output=True, text=True, check=True).stdout
    # Build names, not paths: the results name no file of this machine.
    params = dict(vars(args), build=[b[0] for b in builds])
    res = {"machine": machine(), "params": params, "load_before": os.getloadavg()}
    for rep in range(args.reps):
        nat.append(native(args.programs, args.range))
        # Alternate the order, so that no case always runs on a warmer (or busier) machine.
        for (bname, path), (cname, settings) in (cases if rep % 2 == 0 else cases[::-1]):
            runs, alone, cpu = on_cluster(path, toml(args.excache, settings), args.programs, args.range, expected)
            d = data[(bname, cname)]
            d["runs"] += runs
            d["alone"].append(alone)
            d["cpu"].append(cpu)
        print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)
    res["load_after"] = os.getloadavg()
    res["native_s"] = summary(nat)
    res["cases"] = []
    for (bname, _), (cname, settings) in cases:
        d = data[(bname, cname)]
        misses = sum(r["misses"] for r in d["runs"])
        res["cases"].append({
            "build": bname, "config": cname, "settings": settings,
            **{k: summary([r[src] for r in d["runs"]]) for k, src in (("wall_s", "wall_s"), ("misses", "misses"), ("miss_p50_ns", "miss_ns_p50"), ("miss_p99_ns", "miss_ns_p99"))},
            "alone_wall_s": summary([r["wall_s"] for r in d["alone"]]), "alone_misses": summary([r["misses"] for r in d["alone"]]),
            "alone_miss_p50_ns": summary([r["miss_ns_p50"] for r in d["alone"]]),
            "component_cpu_us_per_miss": sum(d["cpu"]) * 1e6 / max(misses, 1),
            "hinted": sum(bool(r["hint"]) for r in d["runs"]), "programs": len(d["runs"]), "hint": next((r["hint"] for r in d["runs"] if r["hint"]), ""),
        })
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=2)
    report(res, args.no_docs)


def report(res, no_docs):
    m, args = res["machine"], argparse.Namespace(**res["params"])
    rng = lambda s, f=lambda x: f"{x:.1f}": f"{f(s['median'])} ({f(s['min'])}–{f(s['max'])})"
    us = lambda x: f"{x / 1000:.0f}"
    k = lambda x: f"{x / 1000:.0f}k"
    lines = [
        "<!-- shared:begin (generated by scripts/bench/shared.py; do not edit by hand) -->",
        "## Shared ExCache: programs thrashing one small cache",
        "",
        f"{args.programs} copies of a CPython program ({args.range} strings in a list and a dict) at once on one pComponent with a {args.excache} ExCache "
        f"and two mComponents, each configuration on a fresh `cluster up`, {args.reps} runs interleaved. Machine: {m['cores']} cores ({m['cpu']}), "
        f"Linux {m['kernel']}, load average {res['load_before'][0]:.1f} before and {res['load_after'][0]:.1f} after (a shared machine: compare rows, "
        f"not runs of different days). Natively the {args.programs} take {rng(res['native_s'], lambda x: f'{x:.2f}')} s together. "
        "Per program: median (min–max) over programs and runs; \"alone\" is one copy on the same cluster afterwards; CPU is the components' "
        "(pComponent, mComponents) per miss of the shared runs." + (f" Builds: {args.about}" if args.about else ""),
        "",
        "| build | settings | wall s | misses | miss p50 µs | miss p99 µs | CPU µs / miss | alone: wall s, misses, p50 µs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in res["cases"]:
        lines.append(f"| {c['build']} | {c['config']} | {rng(c['wall_s'])} | {rng(c['misses'], k)} | {rng(c['miss_p50_ns'], us)} | {rng(c['miss_p99_ns'], us)} | "
                     f"{c['component_cpu_us_per_miss']:.0f} | {c['alone_wall_s']['median']:.1f}, {k(c['alone_misses']['median'])}, {us(c['alone_miss_p50_ns']['median'])} |")
    lines += ["", "What `run` told the user on stderr:", ""]
    lines += [f"- {c['build']}, {c['config']}: {c['hinted']} of {c['programs']} programs got a hint" + (f", such as `{c['hint']}`" if c["hint"] else "") for c in res["cases"]]
    lines += ["<!-- shared:end -->"]
    print("\n".join(lines))
    if not no_docs:
        replace_section(os.path.join(ROOT, "docs"), "shared", lines)


if __name__ == "__main__":
    main()
