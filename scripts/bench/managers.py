#!/usr/bin/env python3
"""The global managers at datacenter scale (issue "reliability you can show", part 3): the
real `splitos gm`, keeping its state in a real etcd (TLS, one member), under thousands of
components that `splitos bench-managers` plays over the wire protocol: each registers, then
heartbeats at the period the managers tell it; one pComponent per host, one sComponent on every tenth host, the
rest mComponents; placement questions (a new process's home, a vRegion's owner) at a steady
rate; four mComponents falling silent halfway through the window.

Each size runs in two configurations, interleaved: the default `[cluster] heartbeats_per_s`
(8,000: beyond 2,400 components the managers lengthen every component's period) and
`heartbeats_per_s = 0` ("fixed": every component beats every 300 ms whatever the size, as
before the period was told).

For each number of components (hosts = components / 10, one connection per host) it reports
the managers' CPU (percent of one core) and resident memory, their state writes per second,
the heartbeat and placement latencies, and how long after a silent mComponent's last answered
heartbeat the managers named it lost, against the configured silence limit (reclaim_dead_ms)
plus one second. Each size runs --reps times, sizes in a fresh random order each repetition;
medians with their spread. The simulated components run on the same machine as the managers
and compete with them for its cores.

Each size also runs in the simulator (`splitos bench-managers --simulated`): the same managers'
code in one process, in simulated time, with the components played beside it and the state in
memory, so that the managers' own work is measured apart from the transport, etcd and the
load generator. --only-simulated runs just those and keeps the last over-the-wire results.

Writes results/managers.json, docs/managers-scale.png and the "managers-scale" section of
docs/benchmarks.md.

    python3 scripts/bench/managers.py [--reps 3] [--sizes 1000,2500,5000,10000] [--seconds 20] [--only-simulated]
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import ROOT, SPLITOS, ensure_env, free_ports, machine, machine_line, publish, wait_port

RECLAIM_DEAD_MS = 5000

CONFIG = """[cluster]
etcd = ["https://127.0.0.1:{etcd}"]
reclaim_dead_ms = {reclaim}
heartbeats_per_s = {per_s}
[[gm]]
listen = "127.0.0.1:{gm}"
[[pcomponent]]
excache = "16M"
[[mcomponent]]
capacity = "64M"
"""


def run(cmd, env):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-3000:]}")
    return r.stdout


# The over-the-wire configurations: results key, `[cluster] heartbeats_per_s`.
CONFIGS = (("sizes", 8000), ("fixed", 0))


def one(tmp, n, seconds, per_s):
    """One run at `n` components: a fresh etcd and cluster, the load, then both stopped."""
    state = tempfile.mkdtemp(dir=tmp)
    env = dict(os.environ, SPLITOS_STATE_DIR=state, SPLITOS_DATA_DIR=os.path.join(state, "data"))
    run([SPLITOS, "cluster", "etcd-cert", "--ip", "127.0.0.1", "--out", os.path.join(state, "etcd-tls")], env)
    client, peer, gm = free_ports(3)
    tls = os.path.join(state, "etcd-tls")
    log = os.path.join(state, "etcd.log")
    etcd = subprocess.Popen(
        ["etcd", "--name", "a", "--data-dir", os.path.join(state, "etcd"),
         "--listen-client-urls", f"https://127.0.0.1:{client}", "--advertise-client-urls", f"https://127.0.0.1:{client}",
         "--listen-peer-urls", f"https://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"https://127.0.0.1:{peer}",
         "--initial-cluster", f"a=https://127.0.0.1:{peer}", "--initial-cluster-state", "new",
         "--client-cert-auth", "--trusted-ca-file", f"{tls}/ca.pem", "--cert-file", f"{tls}/etcd.pem", "--key-file", f"{tls}/etcd.key",
         "--peer-client-cert-auth", "--peer-trusted-ca-file", f"{tls}/ca.pem", "--peer-cert-file", f"{tls}/etcd.pem", "--peer-key-file", f"{tls}/etcd.key",
         "--auto-compaction-retention", "1"],
        stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_port(client, etcd, "etcd", log)
        cfg = os.path.join(state, "cluster.toml")
        open(cfg, "w").write(CONFIG.format(etcd=client, gm=gm, reclaim=RECLAIM_DEAD_MS, per_s=per_s))
        run([SPLITOS, "cluster", "up", "--config", cfg], env)
        try:
            st = json.load(open(os.path.join(state, "cluster.json")))
            gm_pid = st["pids"][0]
            out = run([SPLITOS, "bench-managers", "--gm", st["gm"], "--gm-pid", str(gm_pid),
                       "--components", str(n), "--hosts", str(max(1, n // 10)), "--seconds", str(seconds)], env)
            return json.loads(out)
        finally:
            subprocess.run([SPLITOS, "cluster", "down", "--force"], capture_output=True, env=env)
    finally:
        os.killpg(etcd.pid, signal.SIGKILL)
        etcd.wait()
        shutil.rmtree(state, ignore_errors=True)


def simulated(n, seconds):
    """One run at `n` components in the simulator."""
    env = dict(os.environ, SPLITOS_LOG="warn")
    return json.loads(run([SPLITOS, "bench-managers", "--simulated", "--components", str(n),
                           "--hosts", str(max(1, n // 10)), "--seconds", str(seconds)], env))


def med(runs, f):
    xs = [f(r) for r in runs]
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None, None
    return statistics.median(xs), min(xs), max(xs)


def fmt(t, digits=1):
    m, lo, hi = t
    if m is None:
        return "-"
    return f"{m:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sizes = sorted(res["sizes"], key=int)
    xs = [int(s) for s in sizes]
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    for key, label in (("sizes", "over the wire (etcd, TCP)"), ("fixed", "over the wire, 300 ms at every size"),
                       ("simulated", "in the simulator")):
        if not all(res.get(key, {}).get(s) for s in sizes):
            continue
        cpu = [med(res[key][s], lambda r: r["gm"]["cpu_percent_of_one_core"]) for s in sizes]
        ax[0].errorbar(xs, [c[0] for c in cpu], yerr=[[c[0] - c[1] for c in cpu], [c[2] - c[0] for c in cpu]], marker="o", label=label)
    ax[0].axhline(20, color="grey", ls="--", label="goal: 20% of one core")
    ax[0].set(xlabel="components", ylabel="managers' CPU, % of one core", title="CPU")
    ax[0].legend()
    for i, (key, label) in enumerate((("beats", "heartbeat"), ("home", "placement: home"), ("owner", "placement: owner"))):
        get = (lambda r: r["beats"]["latency"]["p99_us"]) if key == "beats" else (lambda r, k=key: r["picks"][k]["p99_us"])
        ax[1].plot(xs, [med(res["sizes"][s], get)[0] for s in sizes], marker="o", color=f"C{i}", label=label)
        ax[1].plot(xs, [med(res["simulated"][s], get)[0] for s in sizes], marker="o", ls="--", color=f"C{i}", label=label + " (simulator)")
    ax[1].set(xlabel="components", ylabel="p99 latency (us)", yscale="log", title="Decisions")
    ax[1].legend()
    for key, label, ls in (("sizes", "over the wire", "-"), ("simulated", "in the simulator", "--")):
        fo = [med(res[key][s], lambda r: max(r["failover"]["delays_ms"]) if r["failover"]["delays_ms"] else None) for s in sizes]
        ax[2].plot(xs, [f[0] for f in fo], marker="o", ls=ls, label=f"slowest of 4 named lost, {label}")
    ax[2].axhline(RECLAIM_DEAD_MS + 1000, color="grey", ls="--", label="goal: silence limit + 1 s")
    ax[2].set(xlabel="components", ylabel="ms after its last answered heartbeat", title="Failover")
    ax[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def report(res):
    sizes = sorted(res["sizes"], key=int)
    lines = [
        "## The managers at datacenter scale",
        "",
        machine_line(res) + f"The real `splitos gm` with its state in etcd (TLS, one member), loaded by `splitos bench-managers`: "
        "components on loopback hosts of their own (one pComponent per host, one sComponent on every tenth, the rest mComponents; "
        "ten per host, one connection per host) registering, then heartbeating at the period the managers tell them "
        "(`[cluster] heartbeats_per_s` = 8,000, the default: 300 ms up to 2,400 components, then longer by steps of 100 ms, up to reclaim_dead_ms / 4; "
        "rows *fixed*: `heartbeats_per_s = 0`, every 300 ms at every size, as before the period was told, run interleaved with the others); "
        f"{res['picks_per_s']} placement questions a second (a home, an owner in turn); four mComponents falling silent halfway through "
        f"a {res['seconds']} s window; silence limit `reclaim_dead_ms` = {RECLAIM_DEAD_MS}. "
        f"Medians of {res['reps']} runs per size (sizes in a fresh random order each repetition), spread in parentheses. "
        "The simulated components share the machine's two cores with the managers and etcd.",
        "",
        "| components | period (ms) | managers' CPU (% of one core) | RSS (MiB) | state writes/s | heartbeats/s (of expected) | heartbeat p99 (us) | home p99 (us) | owner p99 (us) | registration (/s) | failover, slowest (ms) | wrongly lost |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s, key in [(s, key) for s in sizes for key, _ in CONFIGS if res.get(key, {}).get(s)]:
        runs = res[key][s]
        lines.append("| " + " | ".join([
            s if key == "sizes" else f"{s}, *fixed*",
            f"{runs[0]['heartbeat_ms']}",
            fmt(med(runs, lambda r: r["gm"]["cpu_percent_of_one_core"])),
            fmt(med(runs, lambda r: r["gm"]["rss_mib"]), 0),
            fmt(med(runs, lambda r: r["gm"]["state_writes_per_s"]), 2),
            f"{fmt(med(runs, lambda r: r['beats']['per_s']), 0)} ({runs[0]['beats']['expected_per_s']:.0f})",
            fmt(med(runs, lambda r: r["beats"]["latency"]["p99_us"]), 0),
            fmt(med(runs, lambda r: r["picks"]["home"]["p99_us"]), 0),
            fmt(med(runs, lambda r: r["picks"]["owner"]["p99_us"]), 0),
            fmt(med(runs, lambda r: r["register"]["per_s"]), 0),
            fmt(med(runs, lambda r: max(r["failover"]["delays_ms"]) if r["failover"]["delays_ms"] else None), 0),
            fmt(med(runs, lambda r: r["wrongly_lost"]), 0),
        ]) + " |")
    lines += [
        "",
        f"In the simulator (`splitos bench-managers --simulated`, run {res['sim_reps']} times per size beside the above): the same managers' code in one process, "
        "in simulated time, the components played beside it and the state in memory, so that only the managers' own work is timed "
        "(the time each request took them, on the host's clock); no transport, etcd or load generator shares the core.",
        "",
        "| components | managers' CPU (% of one core) | state writes/s | heartbeat p50 / p99 (us) | home p50 / p99 (us) | owner p50 / p99 (us) | failover, slowest (ms) | wrongly lost |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in sizes:
        runs = res["simulated"][s]
        pair = lambda f, g: f"{med(runs, f)[0]:.1f} / {med(runs, g)[0]:.1f}"
        lines.append("| " + " | ".join([
            s,
            fmt(med(runs, lambda r: r["gm"]["cpu_percent_of_one_core"])),
            fmt(med(runs, lambda r: r["gm"]["state_writes_per_s"]), 2),
            pair(lambda r: r["beats"]["latency"]["p50_us"], lambda r: r["beats"]["latency"]["p99_us"]),
            pair(lambda r: r["picks"]["home"]["p50_us"], lambda r: r["picks"]["home"]["p99_us"]),
            pair(lambda r: r["picks"]["owner"]["p50_us"], lambda r: r["picks"]["owner"]["p99_us"]),
            fmt(med(runs, lambda r: max(r["failover"]["delays_ms"]) if r["failover"]["delays_ms"] else None), 0),
            fmt(med(runs, lambda r: r["wrongly_lost"]), 0),
        ]) + " |")
    lines += ["", "![managers at scale](managers-scale.png)"]
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default="1000,2500,5000,10000")
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--no-doc", action="store_true", help="print the report; leave results/ and docs/ alone")
    ap.add_argument("--only-simulated", action="store_true",
                    help="run only the simulator's runs; the over-the-wire results are the last ones in results/managers.json")
    a = ap.parse_args()
    ensure_env()
    sizes = [int(s) for s in a.sizes.split(",")]
    saved = os.path.join(ROOT, "results", "managers.json")
    if a.only_simulated:
        res = json.load(open(saved))
        res["load_before"] = os.getloadavg()[0]
        missing = [n for n in sizes if str(n) not in res["sizes"]]
        if missing:
            sys.exit(f"--only-simulated: {saved} has no over-the-wire runs of {missing} components")
    else:
        res = {"machine": machine(), "load_before": os.getloadavg()[0], "reps": a.reps, "seconds": a.seconds,
               "picks_per_s": 50, "reclaim_dead_ms": RECLAIM_DEAD_MS,
               **{key: {str(n): [] for n in sizes} for key, _ in CONFIGS}}
    res["simulated"] = {str(n): [] for n in sizes}
    res["sim_reps"] = a.reps
    with tempfile.TemporaryDirectory(prefix="splitos-managers-") as tmp:
        for rep in range(a.reps):
            for n in random.sample(sizes, len(sizes)):
                t0 = time.monotonic()
                for key, per_s in ([] if a.only_simulated else random.sample(CONFIGS, len(CONFIGS))):
                    # The last run's threads and etcd gone from the load average first.
                    time.sleep(10)
                    r = one(tmp, n, a.seconds, per_s)
                    res[key][str(n)].append(r)
                    print(f"rep {rep + 1}, {n} components, heartbeats_per_s {per_s}: period {r['heartbeat_ms']} ms, "
                          f"managers' CPU {r['gm']['cpu_percent_of_one_core']:.1f}% of a core, "
                          f"beats {r['beats']['per_s']:.0f}/s of {r['beats']['expected_per_s']:.0f}, wrongly lost {r['wrongly_lost']}, "
                          f"failover {r['failover']['delays_ms']} ms, errors {r['errors']} ({time.monotonic() - t0:.0f} s)", flush=True)
                r = simulated(n, a.seconds)
                res["simulated"][str(n)].append(r)
                print(f"rep {rep + 1}, {n} components in the simulator: managers' CPU {r['gm']['cpu_percent_of_one_core']:.2f}% of a core, "
                      f"wrongly lost {r['wrongly_lost']}, failover {r['failover']['delays_ms']} ms, errors {r['errors']} ({r['wall_s']:.0f} s)", flush=True)
    res["load_after"] = os.getloadavg()[0]
    lines = report(res)
    if not a.no_doc:
        json.dump(res, open(os.path.join(ROOT, "results", "managers.json"), "w"), indent=1)
        plot(res, os.path.join(ROOT, "docs", "managers-scale.png"))
    publish("managers-scale", "scripts/bench/managers.py", lines, a.no_doc)


if __name__ == "__main__":
    main()
