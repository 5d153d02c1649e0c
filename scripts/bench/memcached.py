#!/usr/bin/env python3
"""memcached (Debian's memcached 1.6) under splitos, ThymesisFlow's section VI-E scaled to this
machine, side by side with native runs in one run. memcached gets --mem MiB; after a preload
that sets every key once (the key space is 1.5 times what memcached holds, as in the paper),
`splitos loadgen` offers ETC-sized GETs and SETs (30:1, Zipf 1.0 keys) at a fixed open-loop
rate and reports mean, p90 and p99 latency. Configurations:

- local: memcached natively;
- splitos, ExCache fits: twice memcached's memory;
- single: the ExCache a quarter of memcached's memory, TCP with one link (and over shared
  memory, the embedded cluster's default);
- bonded: the same with two TCP links (`--links 2`);
- interleaved: the same with `--interleave 1:2` (half of the pages local: more than the
  ExCache holds, so 6 of every set's 8 ways are pinned);
- scale-out: two native memcached of half the memory each, keys sharded by the client.

Every configuration runs once per repetition in a fresh random order; each GET's value is
checked by the load generator. Writes results/memcached.json, docs/memcached.png (the GET
latency CDF, as the paper's figure 8) and the "memcached" section of docs/benchmarks.md.

    python3 scripts/bench/memcached.py [--reps 3] [--mem 64] [--rate 2000] [--duration 10]
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

from benchlib import ROOT, SPLITOS, ensure_env, free_ports, machine, machine_line, memcached_stats as stats, replace_section, wait_port

# Bytes memcached spends per ETC item (key, value, header and slab rounding), measured with
# `stats` after a preload; sizes the key space at 1.5 times what memcached holds.
ITEM_BYTES = 416


def configs(mem):
    quarter = f"{mem // 4}M"
    return [
        ("local (native)", None, []),
        ("splitos, ExCache fits", f"{2 * mem}M", ["--transport", "tcp"]),
        ("single, TCP", quarter, ["--transport", "tcp", "--links", "1"]),
        ("single, shared memory", quarter, ["--transport", "shm"]),
        ("bonded, TCP 2 links", quarter, ["--transport", "tcp", "--links", "2"]),
        ("interleaved 1:2, TCP", quarter, ["--transport", "tcp", "--interleave", "1:2"]),
        ("scale-out (2 native, sharded)", None, ["scale-out"]),
    ]


def memcached_cmd(port, mem):
    return ["memcached", "-u", "root", "-l", "127.0.0.1", "-p", str(port), "-m", str(mem), "-t", "2", "-c", "4096"]


def one_run(label, excache, flags, args, keys, seed, tmp):
    """Starts the configuration's memcached, drives it with `splitos loadgen`, stops it, and
    returns the load generator's report with the server's and (under splitos) the run's counters."""
    scale_out = flags == ["scale-out"]
    ports = free_ports(2 if scale_out else 1)
    mem = args.mem // 2 if scale_out else args.mem
    stats_file = os.path.join(tmp, "stats.json")
    if os.path.exists(stats_file):
        os.unlink(stats_file)
    procs = []
    try:
        for i, p in enumerate(ports):
            cmd = memcached_cmd(p, mem)
            if excache is not None:
                cmd = [SPLITOS, "run", "--embedded", "--quiet", "--excache", excache, *flags, "--stats-json", stats_file, "--", *cmd]
            log = os.path.join(tmp, f"server{i}.log")
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w")))
            wait_port(p, procs[-1], label, log)
        gen = [SPLITOS, "loadgen", "--json", "--keys", str(keys), "--rate", str(args.rate), "--duration", str(args.duration), "--clients", str(args.clients), "--seed", str(seed)]
        for p in ports:
            gen += ["--server", f"127.0.0.1:{p}"]
        r = subprocess.run(gen, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"{label}: the load generator failed: {r.stderr[-2000:]}")
        server = [stats(p) for p in ports]
        for s in server:
            os.kill(int(s["pid"]), signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out = json.loads(r.stdout)
    out["evictions"] = sum(int(s["evictions"]) for s in server)
    if excache is not None:
        run = json.load(open(stats_file))
        out["excache_misses"] = run["misses"]
        out["miss_ns_p50"] = run["miss_ns_p50"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mem", type=int, default=64, help="memcached's memory, MiB (-m)")
    ap.add_argument("--rate", type=int, default=2000, help="requests per second offered (open loop)")
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(ROOT, "results"))
    ap.add_argument("--docs", default=os.path.join(ROOT, "docs"))
    args = ap.parse_args()
    if not shutil.which("memcached"):
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "memcached"], check=True, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    ensure_env()
    keys = args.mem * 1024 * 1024 * 3 // 2 // ITEM_BYTES
    res = {"machine": machine(), "load_before": os.getloadavg()[0], "reps": args.reps, "mem_mib": args.mem, "keys": keys, "rate": args.rate, "duration_s": args.duration, "clients": args.clients, "memcached": subprocess.run(["memcached", "-V"], capture_output=True, text=True).stdout.strip(), "rows": []}
    cfgs = configs(args.mem)
    samples = {label: [] for label, _, _ in cfgs}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            order = list(cfgs)
            random.shuffle(order)
            for label, excache, flags in order:
                # Each repetition sends another request stream, the same for every configuration.
                samples[label].append(one_run(label, excache, flags, args, keys, args.seed + rep, tmp))
                print(f"rep {rep + 1}: {label}: GET mean {samples[label][-1]['get']['mean_us']} us", file=sys.stderr)
    for label, excache, flags in cfgs:
        runs = samples[label]
        med = lambda f: statistics.median(f(r) for r in runs)
        row = {"config": label, "excache": excache or "-", "flags": flags}
        for op in ("get", "set"):
            for k in ("mean_us", "p90_us", "p99_us"):
                row[f"{op}_{k}"] = med(lambda r: r[op][k])
        row["get_mean_range"] = (min(r["get"]["mean_us"] for r in runs), max(r["get"]["mean_us"] for r in runs))
        row["throughput_per_s"] = med(lambda r: r["throughput_per_s"])
        row["hit_ratio"] = med(lambda r: r["hit_ratio"])
        row["preload_s"] = med(lambda r: r["preload"]["seconds"])
        if excache is not None:
            row["excache_misses"] = med(lambda r: r["excache_misses"])
        # The run whose GET mean is the median one stands for the configuration in the CDF.
        row["get_cdf"] = sorted(runs, key=lambda r: r["get"]["mean_us"])[len(runs) // 2]["get"]["cdf"]
        res["rows"].append(row)
    res["load_after"] = os.getloadavg()[0]
    os.makedirs(args.out, exist_ok=True)
    json.dump(res, open(os.path.join(args.out, "memcached.json"), "w"), indent=1)
    plot(res, args.docs)
    report(res, args.docs)


def plot(res, docs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in res["rows"]:
        cdf = r["get_cdf"]
        ax.plot([us for _, us in cdf], [p / 100 for p, _ in cdf], marker=".", label=r["config"])
    ax.set_xscale("log")
    ax.set_xlabel("GET latency (µs, log scale)")
    ax.set_ylabel("fraction of GETs")
    ax.set_title(f"memcached, ETC load at {res['rate']} requests/s (median run of {res['reps']})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(docs, "memcached.png"), dpi=120)


def report(res, docs):
    local = next(r for r in res["rows"] if r["config"].startswith("local"))
    lines = [
        "<!-- memcached:begin (generated by scripts/bench/memcached.py; do not edit by hand) -->",
        "## memcached (ThymesisFlow's section VI-E)",
        "",
        machine_line(res) +
        f"{res['memcached']} with {res['mem_mib']} MiB (`-m`, 2 threads), {res['keys']:,} keys (1.5 times what it holds), preloaded once; "
        f"then `splitos loadgen` offers {res['rate']:,} requests per second for {res['duration_s']:.0f} s from {res['clients']} clients (open loop, latency counted from each request's due time): "
        "Facebook ETC key and value sizes, GET:SET 30:1, Zipf 1.0 keys. Medians of "
        f"{res['reps']} runs per configuration in a fresh random order each repetition; every value read back was checked. "
        "Under splitos memcached runs unmodified on the embedded cluster (one pComponent, two mComponents); "
        "single, bonded and interleaved have an ExCache of a quarter of memcached's memory. "
        "Scale-out: two native memcached of half the memory each, the client sharding keys between them.",
        "",
        "| configuration | ExCache | GET mean µs (min–max) | GET p90 | GET p99 | SET mean | SET p90 | × local (GET mean) | hit ratio | ExCache misses | preload s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lo, hi = r["get_mean_range"]
        misses = f"{r['excache_misses']:,.0f}" if "excache_misses" in r else "-"
        lines.append(
            f"| {r['config']} | {r['excache']} | {r['get_mean_us']:.0f} ({lo:.0f}–{hi:.0f}) | {r['get_p90_us']:.0f} | {r['get_p99_us']:.0f} | "
            f"{r['set_mean_us']:.0f} | {r['set_p90_us']:.0f} | {r['get_mean_us'] / local['get_mean_us']:.2f} | {r['hit_ratio']:.3f} | {misses} | {r['preload_s']:.1f} |"
        )
    lines += ["", "![memcached GET latency CDF](memcached.png)", "", "<!-- memcached:end -->"]
    replace_section(docs, "memcached", lines)


if __name__ == "__main__":
    main()
