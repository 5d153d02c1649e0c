#!/usr/bin/env python3
"""Live migration (ThymesisFlow's detach, issue "elastic memory"): the time to move 1 GiB of a
running program's vRegions off an mComponent, and how much a second program that runs
meanwhile slows down. Each repetition starts a cluster of two mComponents (the second
standby), a program holding GIB of heap on the first, then runs a workload alone on the
cluster, attaches the second mComponent and runs the workload again while `memory detach`
moves everything off the first (the workload's own vRegions and home too). The workload also
runs natively. Reports medians and spread of the detach time, the throughput of the move, and
the workload's time alone and during the move. Both programs' outputs must equal their native
runs'. Writes results/migrate.json and the "Live migration" section of docs/benchmarks.md.

    python3 scripts/bench/migrate.py [--reps 3] [--gib 1]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchlib import ROOT, SPLITOS, ensure_env, machine, machine_line, replace_section

CONFIG = """[cluster]
vregion_size = "64M"
[[pcomponent]]
excache = "{excache}"
[[mcomponent]]
capacity = "{cap}"
[[mcomponent]]
capacity = "{cap}"
standby = true
"""


def timed(cmd, env=None, stdin=None):
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=stdin)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}")
    return time.monotonic() - t0, r.stdout


def one(tmp, hold, work, gib, expected_hold, expected_work):
    state = tempfile.mkdtemp(dir=tmp)
    env = dict(os.environ, SPLITOS_STATE_DIR=state, SPLITOS_DATA_DIR=os.path.join(state, "data"))
    cfg = os.path.join(state, "cluster.toml")
    open(cfg, "w").write(CONFIG.format(excache="64M", cap=f"{gib * 2 + 1}G"))
    subprocess.run([SPLITOS, "cluster", "up", "--config", cfg], env=env, check=True, capture_output=True)
    try:
        status = lambda: json.loads(subprocess.run([SPLITOS, "cluster", "status", "--json"], env=env, check=True, capture_output=True, text=True).stdout)
        mems = [c for c in status()["components"] if c["role"] == "mcomponent"]
        first = next(m["id"] for m in mems if not m["cordoned"])
        standby = next(m["id"] for m in mems if m["cordoned"])
        holder = subprocess.Popen([SPLITOS, "run", "--quiet", "--", hold, str(gib << 10)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if holder.stdout.readline() != "ready\n":
            sys.exit("the holding program did not start")
        alone, out = timed([SPLITOS, "run", "--quiet", "--", *work], env)
        if out != expected_work:
            sys.exit("the workload's output differs from its native run")
        subprocess.run([SPLITOS, "memory", "attach", str(standby)], env=env, check=True, capture_output=True)
        result = {}

        def detach():
            result["detach_s"], result["said"] = timed([SPLITOS, "memory", "detach", str(first), "--timeout", "900"], env)

        mover = threading.Thread(target=detach)
        mover.start()
        during, out = timed([SPLITOS, "run", "--quiet", "--", *work], env)
        mover.join()
        if out != expected_work:
            sys.exit("the workload's output during the move differs from its native run")
        if "detached in" not in result.get("said", ""):
            sys.exit(f"the detach did not finish: {result}")
        holder.stdin.close()
        if holder.stdout.read() != expected_hold or holder.wait() != 0:
            sys.exit("the holding program's output differs from its native run")
        return {"alone_s": alone, "during_s": during, "detach_s": result["detach_s"]}
    finally:
        subprocess.run([SPLITOS, "cluster", "down"], env=env, capture_output=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gib", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(ROOT, "results"))
    ap.add_argument("--docs", default=os.path.join(ROOT, "docs"))
    args = ap.parse_args()
    ensure_env()
    res = {"machine": machine(), "load_before": os.getloadavg()[0], "reps": args.reps, "gib": args.gib, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        hold, touch = os.path.join(tmp, "hold"), os.path.join(tmp, "memtouch")
        for name, out in (("hold", hold), ("memtouch", touch)):
            subprocess.run(["gcc", "-O2", "-o", out, os.path.join(ROOT, "tests", "programs", f"{name}.c")], check=True)
        work = [touch, "128"]
        expected_hold = subprocess.run([hold, str(args.gib << 10)], input="", capture_output=True, text=True, check=True).stdout.removeprefix("ready\n")
        native = []
        for _ in range(args.reps):
            t, expected_work = timed(work)
            native.append(t)
            res["runs"].append(one(tmp, hold, work, args.gib, expected_hold, expected_work))
            print("one repetition done", file=sys.stderr)
        res["native_s"] = statistics.median(native)
    res["load_after"] = os.getloadavg()[0]
    os.makedirs(args.out, exist_ok=True)
    json.dump(res, open(os.path.join(args.out, "migrate.json"), "w"), indent=1)
    report(res, args.docs)


def report(res, docs):
    runs = res["runs"]
    med = lambda k: statistics.median(r[k] for r in runs)
    rng = lambda k: f"{min(r[k] for r in runs):.1f}–{max(r[k] for r in runs):.1f}"
    moved = res["gib"] * (1 << 30)
    lines = [
        "<!-- migrate:begin (generated by scripts/bench/migrate.py; do not edit by hand) -->",
        "## Live migration",
        "",
        machine_line(res) +
        f"Medians (min–max) of {res['reps']} repetitions, each on a fresh cluster (shared-memory transport, 64 MiB vRegions, no replication). "
        f"A program holds {res['gib']} GiB of heap on one mComponent; a second is attached and `memory detach` moves everything off the first. "
        "The workload (memtouch 128: sequential writes, a read pass and random read-modify-writes over 128 MiB with a 64 MiB ExCache) runs alone, then again during the move.",
        "",
        "| detach s | MB/s moved | workload native s | alone s | during the move s | slowdown during the move |",
        "|---|---|---|---|---|---|",
        f"| {med('detach_s'):.1f} ({rng('detach_s')}) | {moved / med('detach_s') / 1e6:.0f} | {res['native_s']:.2f} | {med('alone_s'):.2f} ({rng('alone_s')}) | {med('during_s'):.2f} ({rng('during_s')}) | {med('during_s') / med('alone_s'):.2f}× |",
        "",
        "<!-- migrate:end -->",
    ]
    replace_section(docs, "migrate", lines)


if __name__ == "__main__":
    main()
