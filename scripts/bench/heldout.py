#!/usr/bin/env python3
"""A held-out program for the memory path: a real server under its own benchmark client, which
none of the memory path's levers was tuned on. redis-server (Debian's, with jemalloc) is loaded
with KEYS values through `redis-cli --pipe`, then serves `redis-benchmark` GETs of random keys
over its Unix socket; the server runs natively, under splitos (`splitos run --embedded` with
an ExCache of a share of its working set) and under Linux swapping to zram in a memory cgroup
of the same share plus its local footprint, the client always natively and outside the limit.
Configurations are interleaved run by run. Reports per share the loading time, the GET rate
and its latency percentiles beside native and Linux+zram, remote misses beside the kernel's
swap-ins, and checks that every run's data set has native's digest (`DEBUG DIGEST`); writes
results/heldout.json and the "heldout" section of docs/benchmarks.md (--no-doc: only the JSON
and the terminal).

    python3 scripts/bench/heldout.py [--keys 400000] [--value 256] [--requests 200000]
        [--fractions 0.5,0.25] [--reps 3] [--with "default="]

The suite's batch programs that focus.py does not run by default (perl, xz, the C chained hash
table) are held out the same way: `focus.py --only perl --only xz --only "C chained"`.
Needs root (memory cgroups, swap devices).
"""
import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import suite
from benchlib import ROOT, ensure_env, machine, publish, splitos_configs

SERVER = ["redis-server", "--port", "0", "--save", "", "--appendonly", "no", "--enable-debug-command", "local", "--daemonize", "no"]


def write_load(path, keys, value):
    """The SETs that load the data set, in the protocol `redis-cli --pipe` sends: keys as
    redis-benchmark names them (`key:` and 12 digits), values derived from the key."""
    with open(path, "wb") as f:
        for i in range(keys):
            k = b"key:%012d" % i
            v = ((b"%012d" % (i * 7919 % 1000003)) * (value // 12 + 1))[:value]
            f.write(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v))


def cli(sock, *args, timeout=60):
    return subprocess.run(["redis-cli", "-s", sock, *args], capture_output=True, text=True, timeout=timeout).stdout.strip()


@contextlib.contextmanager
def served(prefix, preexec=None):
    """redis-server started under `prefix` in a directory of its own, once it answers: yields
    the process, its socket and its directory; shut down (killed if it does not go) after."""
    with tempfile.TemporaryDirectory(prefix="splitos-heldout-") as d:
        sock, log = os.path.join(d, "redis.sock"), os.path.join(d, "redis.log")
        p = subprocess.Popen([*prefix, *SERVER, "--unixsocket", sock, "--dir", d, "--logfile", log, "--pidfile", os.path.join(d, "redis.pid")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, preexec_fn=preexec)
        try:
            deadline = time.monotonic() + 60
            while cli(sock, "ping", timeout=10) != "PONG":
                if p.poll() is not None or time.monotonic() > deadline:
                    log_tail = open(log).read()[-1500:] if os.path.exists(log) else ""
                    sys.exit(f"redis-server did not answer: {p.stderr.read().decode(errors='replace')[-1500:]} {log_tail}")
                time.sleep(0.05)
            yield p, sock, d
            cli(sock, "shutdown", "nosave")
            p.wait(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
            p.wait()


def load_into(sock, load):
    """Sends the data set; returns how long it took and redis-cli's summary."""
    t0 = time.monotonic()
    with open(load, "rb") as f:
        out = subprocess.run(["redis-cli", "-s", sock, "--pipe"], stdin=f, capture_output=True, text=True, timeout=600).stdout
    return time.monotonic() - t0, out


def one_run(prefix, load, keys, requests, preexec=None):
    """Loads and benchmarks one server; returns what was measured, and its peak RSS (native)."""
    with served(prefix, preexec) as (p, sock, d):
        load_s, out = load_into(sock, load)
        t0 = time.monotonic()
        csv = subprocess.run(["redis-benchmark", "-s", sock, "-t", "get", "-n", str(requests), "-r", str(keys), "-c", "8", "--csv"],
                             capture_output=True, text=True, timeout=1200).stdout
        bench_s = time.monotonic() - t0
        row = next(l for l in csv.splitlines() if l.startswith('"GET"'))
        rps, avg, _, p50, p95, p99, mx = (float(x.strip('"')) for x in row.split(",")[1:])
        digest = cli(sock, "debug", "digest")
        rss = 0
        with contextlib.suppress(OSError, ValueError, StopIteration):
            pid = open(os.path.join(d, "redis.pid")).read().strip()
            rss = int(next(l.split()[1] for l in open(f"/proc/{pid}/status") if l.startswith("VmHWM")))
    return {"load_s": load_s, "bench_s": bench_s, "rps": rps, "avg_ms": avg, "p50_ms": p50, "p95_ms": p95, "p99_ms": p99, "max_ms": mx,
            "loaded": f"errors: 0, replies: {keys}" in out, "digest": digest, "code": p.returncode}, rss


def local_footprint(load):
    """What a memory cgroup charges a native server beyond its anonymous memory and the inactive
    file pages (its code and libraries, kernel memory): Linux's limit adds it, as the suite's
    does (suite.local_footprint_bytes)."""
    with suite.memory_cgroup(64 << 30) as (pre, _):
        cg = os.path.join(suite.CGROUP_ROOT, f"splitos-bench-{os.getpid()}")
        with served(pre) as (_, sock, _):
            load_into(sock, load)
            stat = dict(l.split() for l in open(os.path.join(cg, "memory.stat")))
            usage = int(open(os.path.join(cg, "memory.usage_in_bytes")).read())
    return max(usage - int(stat.get("rss", 0)) - int(stat.get("inactive_file", 0)), 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=400000, help="keys loaded (default 400000)")
    ap.add_argument("--value", type=int, default=256, help="bytes per value (default 256)")
    ap.add_argument("--requests", type=int, default=200000, help="GETs redis-benchmark sends (default 200000)")
    ap.add_argument("--fractions", default="0.5,0.25", help="ExCache shares of the working set, comma-separated (default 0.5,0.25)")
    ap.add_argument("--with", dest="configs", action="append", default=[], help='LABEL=OPTIONS: a splitos configuration (repeatable; default "default=")')
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every configuration, interleaved (default 3)")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "heldout.json"), help="where the JSON goes")
    ap.add_argument("--no-doc", action="store_true", help="do not write the section of docs/benchmarks.md")
    ap.add_argument("--report", action="store_true", help="measure nothing: write the section again from the JSON at --out")
    args = ap.parse_args()
    if args.report:
        publish("heldout", "scripts/bench/heldout.py", report(json.load(open(args.out))), args.no_doc)
        return
    if os.geteuid() != 0:
        sys.exit("heldout.py needs root: memory cgroups and swap devices")
    ensure_env()
    configs = splitos_configs(args.configs)
    fractions = [float(f) for f in args.fractions.split(",")]
    res = {"machine": machine(), "load_before": os.getloadavg()[0], "reps": args.reps, "keys": args.keys, "value": args.value,
           "requests": args.requests, "configs": {l: o for l, o in configs}, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="splitos-heldout-load-") as tmp:
        load = os.path.join(tmp, "load.resp")
        write_load(load, args.keys, args.value)
        local = local_footprint(load)
        res["local_footprint_bytes"] = local
        for rep in range(args.reps):
            run, rss = one_run([], load, args.keys, args.requests)
            res["runs"].setdefault("native", []).append(run)
            res.setdefault("working_set_kib", rss)
            ws = res["working_set_kib"]
            for f in fractions:
                for label, opts in configs:
                    with tempfile.NamedTemporaryFile(suffix=".json") as st:
                        run, _ = one_run(suite.splitos_prefix(int(ws * f), st.name, opts), load, args.keys, args.requests)
                        stats = json.load(open(st.name)) if os.path.getsize(st.name) else {}
                    run.update({k: stats.get(k) for k in ("misses", "plocal_fills", "wp_faults", "miss_ns_p50", "miss_ns_mean")})
                    res["runs"].setdefault(f"{label} {f}", []).append(run)
                limit = int(ws * f) * 1024 + local
                with suite.linux_swapping("zram", max(2 * ws // 1024, 64), limit) as (pre, seen):
                    run, _ = one_run(pre, load, args.keys, args.requests, suite.four_kib_pages)
                run.update(seen)
                res["runs"].setdefault(f"zram {f}", []).append(run)
            print(f"repetition {rep + 1} of {args.reps} done", file=sys.stderr, flush=True)
    res["load_after"] = os.getloadavg()[0]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    json.dump(res, open(args.out, "w"), indent=2)
    publish("heldout", "scripts/bench/heldout.py", report(res), args.no_doc)


def report(res):
    """The section: per configuration, loading time and GET rate over native's (medians and
    spread), the GETs' latency percentiles, remote misses beside the kernel's swap-ins, and
    whether every run's data set was native's."""
    m, runs = res["machine"], res["runs"]
    digest = runs["native"][0]["digest"]
    med = lambda key, f: statistics.median(f(x) for x in runs[key])
    native_load, native_rps = med("native", lambda x: x["load_s"]), med("native", lambda x: x["rps"])
    out = ["## A held-out program: redis-server under redis-benchmark (heldout.py)", "",
           f"{m['cores']} vCPUs ({m['cpu']}), {m['memory_mib']} MiB, Linux {m['kernel']}; load average {res['load_before']:.2f} before, "
           f"{res.get('load_after', 0):.2f} after; medians of {res['reps']} interleaved runs (min-max). redis-server loaded with "
           f"{res['keys']:,} values of {res['value']} bytes (`redis-cli --pipe`), then {res['requests']:,} GETs of random keys from "
           f"`redis-benchmark -c 8` over its Unix socket; working set (its peak RSS natively) {res['working_set_kib'] // 1024} MiB. "
           "Configurations (`splitos run` options beside `--excache SHARE`): "
           + "; ".join(f"`{label}`: {' '.join(o) or 'the defaults'}" for label, o in res["configs"].items())
           + ". zram: the server in a memory cgroup of the same share plus its local footprint "
           f"({res['local_footprint_bytes'] // (1 << 20)} MiB), swapping to zram; the client runs outside it. None of the memory "
           "path's levers was tuned on this program.", "",
           "| configuration | loading, s (over native) | GETs/s (of native) | GET p50 / p99 ms | remote misses | zram swap-ins | data set as native's |",
           "|---|---|---|---|---|---|---|"]
    for key, rs in runs.items():
        loads = sorted(x["load_s"] for x in rs)
        rates = sorted(x["rps"] for x in rs)
        lm, rm = statistics.median(loads), statistics.median(rates)
        remote = [x["misses"] - x["plocal_fills"] for x in rs if x.get("plocal_fills") is not None]
        swap = statistics.median(x["swap_ins"] for x in rs) if "swap_ins" in rs[0] else None
        same = all(x["digest"] == digest and x["loaded"] for x in rs)
        out.append(f"| {key} | {lm:.2f} ({loads[0]:.2f}-{loads[-1]:.2f}; {lm / native_load:.2f}x) | {rm:,.0f} ({rates[0]:,.0f}-{rates[-1]:,.0f}; {rm / native_rps:.2f}) | "
                   f"{statistics.median(x['p50_ms'] for x in rs):.3f} / {statistics.median(x['p99_ms'] for x in rs):.3f} | "
                   f"{f'{statistics.median(remote):,.0f}' if remote else ''} | {f'{swap:,.0f}' if swap is not None else ''} | {'yes' if same else 'NO'} |")
    shares = sorted({k.rsplit(' ', 1)[1] for k in runs if k != "native"}, reverse=True)
    lines = []
    for s in shares:
        z = runs.get(f"zram {s}")
        for label in res["configs"]:
            o = runs.get(f"{label} {s}")
            if z and o:
                zl, ol = statistics.median(x["load_s"] for x in z), statistics.median(x["load_s"] for x in o)
                zr, orr = statistics.median(x["rps"] for x in z), statistics.median(x["rps"] for x in o)
                lines.append(f"at {float(s):.0%}, `{label}` loads in {ol / zl:.2f} times Linux+zram's time and serves {orr / zr:.2f} times its GET rate")
    if lines:
        out += ["", "Against Linux+zram: " + "; ".join(lines) + "."]
    return out


if __name__ == "__main__":
    main()
