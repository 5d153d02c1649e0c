#!/usr/bin/env python3
"""The nComponent paper's evaluation (section 4) on this machine: a program's TCP through an
nComponent against native Linux sockets, in the same run.

Three hosts (network namespaces): `p` runs the global managers, an mComponent and the
pComponent, and has no route out; `n` runs the nComponent and is linked to `out`, a plain
Linux host that runs the servers. The baseline is the same client run natively on `n` (the
host that owns the link); the splitos run is that client on `p`, its sockets on `n`.

- Round-trip latency (p50, p99) and throughput for 128 B to 64 KiB messages (DDIO path).
- Connect time.
- CPU per byte sent: the client's, and under splitos the pComponent's and nComponent's too.
- The streaming word count (figure 9): a mapper sends every word of a corpus to a reducer on
  `out`, which counts them; the reducer's answers must match.

The pComponent's ExCache is 1 GiB, as the paper's extCache: the mapper's heap fits, so its
time is the network's.

    python3 scripts/bench/network.py [--reps N] [--out DIR]

Writes DIR/network.json, docs/network.png and the section of docs/benchmarks.md.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import ROOT, SPLITOS, ensure_env, machine, replace_section

SIZES = (128, 512, 2048, 8192, 65536)
TAG = "spnb"
RACK, OUTSIDE = "10.203.1", "10.203.2"


def ip(*args):
    subprocess.run(["ip", *args], check=True)


def make_hosts():
    """p and n on a bridge with the caller at .254 (to reach the global managers); n and out
    on a link of their own. No namespace has a default route."""
    teardown()
    ip("link", "add", f"{TAG}br", "type", "bridge")
    ip("addr", "add", f"{RACK}.254/24", "dev", f"{TAG}br")
    ip("link", "set", f"{TAG}br", "up")
    for i, h in enumerate(("p", "n"), 1):
        ip("netns", "add", f"{TAG}-{h}")
        ip("link", "add", f"{TAG}o{i}", "type", "veth", "peer", "name", f"{TAG}i{i}")
        ip("link", "set", f"{TAG}i{i}", "netns", f"{TAG}-{h}")
        ip("link", "set", f"{TAG}o{i}", "master", f"{TAG}br", "up")
        ip("-n", f"{TAG}-{h}", "addr", "add", f"{RACK}.{i}/24", "dev", f"{TAG}i{i}")
        ip("-n", f"{TAG}-{h}", "link", "set", f"{TAG}i{i}", "up")
        ip("-n", f"{TAG}-{h}", "link", "set", "lo", "up")
    ip("netns", "add", f"{TAG}-out")
    ip("link", "add", f"{TAG}x", "type", "veth", "peer", "name", f"{TAG}y")
    ip("link", "set", f"{TAG}x", "netns", f"{TAG}-n")
    ip("link", "set", f"{TAG}y", "netns", f"{TAG}-out")
    ip("-n", f"{TAG}-n", "addr", "add", f"{OUTSIDE}.1/24", "dev", f"{TAG}x")
    ip("-n", f"{TAG}-out", "addr", "add", f"{OUTSIDE}.2/24", "dev", f"{TAG}y")
    for ns, dev in ((f"{TAG}-n", f"{TAG}x"), (f"{TAG}-out", f"{TAG}y")):
        ip("-n", ns, "link", "set", dev, "up")
        ip("-n", ns, "link", "set", "lo", "up")


def teardown():
    for h in ("p", "n", "out"):
        pids = subprocess.run(["ip", "netns", "pids", f"{TAG}-{h}"], capture_output=True, text=True).stdout.split()
        for pid in pids:
            subprocess.run(["kill", "-9", pid], capture_output=True)
        subprocess.run(["ip", "netns", "del", f"{TAG}-{h}"], capture_output=True)
    subprocess.run(["ip", "link", "del", f"{TAG}br"], capture_output=True)


def in_host(h, cmd):
    return ["ip", "netns", "exec", f"{TAG}-{h}", *cmd]


def cpu_ticks(pids):
    total = 0
    for pid in pids:
        try:
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Rack:
    def __init__(self, state):
        os.makedirs(state)
        self.env = dict(os.environ, SPLITOS_STATE_DIR=state, SPLITOS_DATA_DIR=os.path.join(state, "data"))
        self.env.pop("SPLITOS_GM", None)
        cfg = os.path.join(state, "cluster.toml")
        ns = lambda h: f'listen = "{RACK}.{1 if h == "p" else 2}:0"\nnetns = "{TAG}-{h}"\n'
        open(cfg, "w").write(f'[cluster]\ngm = "{RACK}.1:0"\nnetns = "{TAG}-p"\n[[pcomponent]]\n{ns("p")}excache = "1G"\n[[mcomponent]]\n{ns("p")}[[ncomponent]]\n{ns("n")}')
        subprocess.run([SPLITOS, "cluster", "up", "--config", cfg], env=self.env, check=True, capture_output=True)
        st = json.loads(subprocess.run([SPLITOS, "cluster", "status", "--json"], env=self.env, check=True, capture_output=True, text=True).stdout)
        self.component_pids = json.load(open(os.path.join(state, "cluster.json")))["pids"]
        self.ncomp = next(c for c in st["components"] if c["role"] == "ncomponent")["addr"]

    def cmd(self, config, prog):
        return in_host("n", prog) if config == "native" else in_host("p", [SPLITOS, "run", "--", *prog])

    def run(self, config, prog):
        """Runs `prog` (its output one JSON line); returns it with the CPU seconds it took
        (under splitos with the components' own)."""
        c0, k0 = children_cpu(), cpu_ticks(self.component_pids)
        out = subprocess.run(self.cmd(config, prog), env=self.env, check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        r["cpu_s"] = children_cpu() - c0 + (cpu_ticks(self.component_pids) - k0 if config == "splitos" else 0)
        return r

    def down(self):
        subprocess.run([SPLITOS, "cluster", "down"], env=self.env, capture_output=True)


MAPPER = r"""
import socket, sys
words = open(sys.argv[3]).read().split()
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
w = s.makefile("w", buffering=1 << 16)
for word in words:
    w.write(word + "\n")
w.flush()
s.shutdown(socket.SHUT_WR)
s.recv(1)
"""

REDUCER = r"""
import collections, socket, sys
l = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
c, _ = l.accept()
counts = collections.Counter(c.makefile("r", buffering=1 << 16).read().split())
c.sendall(b"k")
print(sum(counts.values()), len(counts), counts.most_common(5), flush=True)
"""


def corpus(path, words):
    vocab = [f"w{i * 7919 % 50021}" for i in range(20000)]
    with open(path, "w") as f:
        for i in range(words):
            f.write(vocab[(i * i + 7 * i) % len(vocab)] + (" " if i % 12 else "\n"))


def word_count(rack, config, text, port):
    red = subprocess.Popen(in_host("out", [sys.executable, "-c", REDUCER, str(port)]), stdout=subprocess.PIPE, text=True)
    assert red.stdout.readline().strip() == "ready"
    t0 = time.time()
    subprocess.run(rack.cmd(config, [shutil.which("python3") or sys.executable, "-c", MAPPER, f"{OUTSIDE}.2", str(port), text]), env=rack.env, check=True, capture_output=True)
    secs = time.time() - t0
    answer = red.stdout.readline().strip()
    red.wait(timeout=30)
    return secs, answer


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "results"))
    args = ap.parse_args()
    ensure_env()
    tmp = tempfile.mkdtemp(prefix="splitos-netbench-")
    nb = os.path.join(tmp, "netbench")
    subprocess.run(["gcc", "-O2", "-pthread", "-o", nb, os.path.join(ROOT, "scripts", "bench", "netbench.c")], check=True)
    text = os.path.join(tmp, "corpus.txt")
    corpus(text, 2_000_000)
    make_hosts()
    rack = None
    server = None
    try:
        server = subprocess.Popen(in_host("out", [nb, "server", "9100"]))
        rack = Rack(os.path.join(tmp, "state"))
        dest = (f"{OUTSIDE}.2", "9100")
        raw = {c: {"rr": {}, "stream": {}, "connect": [], "wordcount": []} for c in ("native", "splitos")}
        answers = set()
        for rep in range(args.reps):
            for config in ("native", "splitos"):
                for size in SIZES:
                    raw[config]["rr"].setdefault(size, []).append(rack.run(config, [nb, "rr", *dest, str(size), "2000" if size < 65536 else "500"]))
                    raw[config]["stream"].setdefault(size, []).append(rack.run(config, [nb, "stream", *dest, str(size), "64"]))
                raw[config]["connect"].append(rack.run(config, [nb, "connect", *dest, "300"]))
                secs, answer = word_count(rack, config, text, 9200 + rep * 2 + (config == "splitos"))
                raw[config]["wordcount"].append(secs)
                answers.add(answer)
                print(f"rep {rep + 1}/{args.reps} {config}: done", file=sys.stderr, flush=True)
        assert len(answers) == 1, f"the reducer's answers differ: {answers}"
        ncomp_stats = json.loads(subprocess.run([SPLITOS, "cluster", "status", "--json"], env=rack.env, check=True, capture_output=True, text=True).stdout)
    finally:
        if rack:
            rack.down()
        if server:
            server.kill()
        teardown()
        shutil.rmtree(tmp, ignore_errors=True)
    report(args, raw, ncomp_stats, answers.pop())


def med(xs):
    return statistics.median(xs)


def spread(xs):
    return [min(xs), max(xs)]


def report(args, raw, status, answer):
    ncomp = next(c for c in status["components"] if c["role"] == "ncomponent")["stats"]
    res = {"machine": machine(), "reps": args.reps, "sizes": SIZES, "wordcount_answer": answer, "ncomponent": {k: ncomp[k] for k in ("sockets", "connects", "bytes_sent", "bytes_received")}, "configs": {}}
    for config, r in raw.items():
        res["configs"][config] = {
            "rr_p50_us": {s: med([x["p50_us"] for x in r["rr"][s]]) for s in SIZES},
            "rr_p99_us": {s: med([x["p99_us"] for x in r["rr"][s]]) for s in SIZES},
            "rr_p50_spread": {s: spread([x["p50_us"] for x in r["rr"][s]]) for s in SIZES},
            "stream_mb_s": {s: med([x["mb_per_s"] for x in r["stream"][s]]) for s in SIZES},
            "stream_spread": {s: spread([x["mb_per_s"] for x in r["stream"][s]]) for s in SIZES},
            "cpu_ns_per_byte": {s: med([x["cpu_s"] / x["bytes"] * 1e9 for x in r["stream"][s]]) for s in SIZES},
            "connect_p50_us": med([x["p50_us"] for x in r["connect"]]),
            "connect_p99_us": med([x["p99_us"] for x in r["connect"]]),
            "wordcount_s": med(r["wordcount"]),
            "wordcount_spread": spread(r["wordcount"]),
        }
    os.makedirs(args.out, exist_ok=True)
    json.dump(res, open(os.path.join(args.out, "network.json"), "w"), indent=1)
    plot(res)
    n, s = res["configs"]["native"], res["configs"]["splitos"]
    m = res["machine"]
    lines = [
        "<!-- network:begin (generated by scripts/bench/network.py; do not edit by hand) -->",
        "## Network: the nComponent (paper section 4)",
        "",
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_mib']} MiB, Linux {m['kernel']}. "
        f"{args.reps} interleaved repetitions, medians (spread: min-max of the medians). Hosts are network "
        "namespaces on this machine linked by veth pairs: the native client runs on the nComponent's "
        "host, the splitos client on the pComponent's, whose only way out is the nComponent. "
        "Data path: DDIO (bytes travel in the stub's requests). `python3 scripts/bench/network.py`.",
        "",
        "| message | rr p50 native (µs) | rr p50 splitos (µs) | ratio | rr p99 native | rr p99 splitos | MB/s native | MB/s splitos | ratio | CPU ns/B native | CPU ns/B splitos |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size in SIZES:
        lines.append(
            f"| {size} B | {n['rr_p50_us'][size]:.1f} | {s['rr_p50_us'][size]:.1f} | {s['rr_p50_us'][size] / n['rr_p50_us'][size]:.2f}x | {n['rr_p99_us'][size]:.1f} | {s['rr_p99_us'][size]:.1f} "
            f"| {n['stream_mb_s'][size]:.0f} | {s['stream_mb_s'][size]:.0f} | {s['stream_mb_s'][size] / n['stream_mb_s'][size]:.2f}x | {n['cpu_ns_per_byte'][size]:.2f} | {s['cpu_ns_per_byte'][size]:.2f} |"
        )
    lines += [
        "",
        f"- Connect: p50 {n['connect_p50_us']:.0f} µs native, {s['connect_p50_us']:.0f} µs under splitos "
        f"({s['connect_p50_us'] / n['connect_p50_us']:.2f}x); p99 {n['connect_p99_us']:.0f} and {s['connect_p99_us']:.0f} µs.",
        f"- Streaming word count (figure 9; a CPython mapper sends 2,000,000 words to a reducer on the outside host): "
        f"{n['wordcount_s']:.2f} s native, {s['wordcount_s']:.2f} s under splitos ({s['wordcount_s'] / n['wordcount_s']:.2f}x); "
        "the reducer's answers are identical.",
        "",
        "![latency and throughput](network.png)",
        "",
        "<!-- network:end -->",
    ]
    replace_section(os.path.join(ROOT, "docs"), "network", lines)


def plot(res):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for config, style in (("native", "o-"), ("splitos", "s-")):
        c = res["configs"][config]
        a.plot(SIZES, [c["rr_p50_us"][s] for s in SIZES], style, label=config)
        b.plot(SIZES, [c["stream_mb_s"][s] for s in SIZES], style, label=config)
    for ax, title, unit in ((a, "round trip, p50", "µs"), (b, "throughput", "MB/s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", "network.png"), dpi=110)


if __name__ == "__main__":
    main()
