#!/usr/bin/env python3
"""The nComponent paper's evaluation (section 4) on this machine: a program's TCP through an
nComponent against native Linux sockets, in the same run.

Three hosts (network namespaces): `p` runs the global managers, an mComponent and the
pComponent, and has no route out; `n` runs the nComponent and is linked to `out`, a plain
Linux host that runs the servers. The baseline is the same client run natively on `n` (the
host that owns the link); the splitos run is that client on `p`, its sockets on `n`.

- Round-trip latency (p50, p99) and throughput for 128 B to 64 KiB messages, on the DDIO
  path (bytes in the requests) and the DMA path (through socket buffers on the mComponent).
- Connect time.
- CPU per byte sent: the client's, and under splitos the pComponent's and nComponent's too.
- The streaming word count (figure 9): a mapper sends every word of a corpus to a reducer on
  `out`, which counts them; the reducer's answers must match.
- UDP round trips (p50, p99) for 128 B to 32 KiB datagrams, natively and through the
  nComponent, against an echo server on `out`.
- Intra-rack (figure 8): a client and a server of one vNode on one pComponent, connected by
  the shortcut and through the nComponent, and on two pComponents connected directly (the
  shortcut across pComponents), against both on native loopback.

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
UDP_SIZES = (128, 512, 2048, 8192, 32768)
CONFIGS = ("native", "ddio", "dma")
INTRA = ("loopback", "shortcut", "nocut", "remote")
# The pComponents of the rack, each with a program socket of its own: proc0 the DDIO path
# with the shortcut, proc1 the DMA path, proc2 the DDIO path without the shortcut, proc3 as
# proc0 (the other end of direct connections between pComponents).
PCOMPS = {"ddio": 0, "dma": 1, "nocut": 2, "remote": 3}
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
    def __init__(self, state, ncomp=""):
        """The rack's cluster, its state in `state`; `ncomp`: more lines of the nComponent's table."""
        os.makedirs(state)
        self.state = state
        self.env = dict(os.environ, SPLITOS_STATE_DIR=state, SPLITOS_DATA_DIR=os.path.join(state, "data"))
        self.env.pop("SPLITOS_GM", None)
        cfg = os.path.join(state, "cluster.toml")
        ns = lambda h: f'listen = "{RACK}.{1 if h == "p" else 2}:0"\nnetns = "{TAG}-{h}"\n'
        pcomps = "".join(f'[[pcomponent]]\n{ns("p")}excache = "1G"\n{extra}\n' for extra in ('net_path = "ddio"', 'net_path = "dma"\nnet_shortcut = false', 'net_shortcut = false', 'net_path = "ddio"'))
        open(cfg, "w").write(f'[cluster]\ngm = "{RACK}.1:0"\nnetns = "{TAG}-p"\n{pcomps}[[mcomponent]]\n{ns("p")}[[ncomponent]]\n{ns("n")}{ncomp}')
        subprocess.run([SPLITOS, "cluster", "up", "--config", cfg], env=self.env, check=True, capture_output=True)
        st = json.loads(subprocess.run([SPLITOS, "cluster", "status", "--json"], env=self.env, check=True, capture_output=True, text=True).stdout)
        self.component_pids = json.load(open(os.path.join(state, "cluster.json")))["pids"]
        self.ncomp = next(c for c in st["components"] if c["role"] == "ncomponent")["addr"]

    def cmd(self, config, prog):
        if config == "native":
            return in_host("n", prog)
        sock = os.path.join(self.state, "programs", f"proc{PCOMPS[config]}.sock")
        return in_host("p", [SPLITOS, "run", "--pcomponent", sock, "--", *prog])

    def run(self, config, prog):
        """Runs `prog` (its output one JSON line); returns it with the CPU seconds it took
        (under splitos with the components' own)."""
        c0, k0 = children_cpu(), cpu_ticks(self.component_pids)
        out = subprocess.run(self.cmd(config, prog), env=self.env, check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        r["cpu_s"] = children_cpu() - c0 + (cpu_ticks(self.component_pids) - k0 if config != "native" else 0)
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


def intra_rack(rack, nb, config, into, port):
    """Round trips and a stream between a client and a server on one host: both native on
    loopback (`n`), or both programs of the vNode on one pComponent (`p`), with the shortcut
    (proc0) or through the nComponent (proc2), or on two pComponents with the shortcut
    (server on proc0, client on proc3)."""
    server_at = {"loopback": "native", "shortcut": "ddio", "nocut": "nocut", "remote": "ddio"}[config]
    where = {"loopback": "native", "shortcut": "ddio", "nocut": "nocut", "remote": "remote"}[config]
    server = subprocess.Popen(rack.cmd(server_at, [nb, "server", str(port)]), env=rack.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        dest = ("127.0.0.1", str(port))
        for i in range(100):
            if subprocess.run(rack.cmd(where, [nb, "connect", *dest, "1"]), env=rack.env, capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        for size in SIZES:
            into["rr"].setdefault(size, []).append(rack.run(where, [nb, "rr", *dest, str(size), "2000" if size < 65536 else "500"]))
            into["stream"].setdefault(size, []).append(rack.run(where, [nb, "stream", *dest, str(size), "64"]))
    finally:
        server.kill()
        server.wait()


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
        userver = subprocess.Popen(in_host("out", [nb, "userver", "9101"]))
        rack = Rack(os.path.join(tmp, "state"))
        dest = (f"{OUTSIDE}.2", "9100")
        raw = {c: {"rr": {}, "stream": {}, "connect": [], "wordcount": [], "udp": {}} for c in CONFIGS}
        local = {c: {"rr": {}, "stream": {}} for c in INTRA}
        answers = set()
        for rep in range(args.reps):
            for i, config in enumerate(INTRA):
                intra_rack(rack, nb, config, local[config], 9300 + rep * len(INTRA) + i)
            for config in ("native", "ddio"):
                for size in UDP_SIZES:
                    raw[config]["udp"].setdefault(size, []).append(rack.run(config, [nb, "urr", f"{OUTSIDE}.2", "9101", str(size), "2000"]))
            for config in CONFIGS:
                for size in SIZES:
                    raw[config]["rr"].setdefault(size, []).append(rack.run(config, [nb, "rr", *dest, str(size), "2000" if size < 65536 else "500"]))
                    raw[config]["stream"].setdefault(size, []).append(rack.run(config, [nb, "stream", *dest, str(size), "64"]))
                raw[config]["connect"].append(rack.run(config, [nb, "connect", *dest, "300"]))
                secs, answer = word_count(rack, config, text, 9200 + rep * 3 + CONFIGS.index(config))
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
            userver.kill()
        teardown()
        shutil.rmtree(tmp, ignore_errors=True)
    report(args, raw, local, ncomp_stats, answers.pop())


def med(xs):
    return statistics.median(xs)


def spread(xs):
    return [min(xs), max(xs)]


def summary(r, cpu=True):
    out = {
        "rr_p50_us": {s: med([x["p50_us"] for x in r["rr"][s]]) for s in SIZES},
        "rr_p99_us": {s: med([x["p99_us"] for x in r["rr"][s]]) for s in SIZES},
        "rr_p50_spread": {s: spread([x["p50_us"] for x in r["rr"][s]]) for s in SIZES},
        "stream_mb_s": {s: med([x["mb_per_s"] for x in r["stream"][s]]) for s in SIZES},
        "stream_spread": {s: spread([x["mb_per_s"] for x in r["stream"][s]]) for s in SIZES},
    }
    if cpu:
        out["cpu_ns_per_byte"] = {s: med([x["cpu_s"] / x["bytes"] * 1e9 for x in r["stream"][s]]) for s in SIZES}
    return out


def report(args, raw, local, status, answer):
    ncomp = next(c for c in status["components"] if c["role"] == "ncomponent")["stats"]
    res = {"machine": machine(), "reps": args.reps, "sizes": SIZES, "wordcount_answer": answer, "ncomponent": {k: ncomp[k] for k in ("sockets", "connects", "wire_sent_bytes", "wire_received_bytes", "ddio_sent_bytes", "ddio_received_bytes", "dma_sent_bytes", "dma_received_bytes")}, "configs": {}, "intra_rack": {}}
    for config, r in raw.items():
        res["configs"][config] = summary(r) | {
            "connect_p50_us": med([x["p50_us"] for x in r["connect"]]),
            "connect_p99_us": med([x["p99_us"] for x in r["connect"]]),
            "wordcount_s": med(r["wordcount"]),
            "wordcount_spread": spread(r["wordcount"]),
        }
        if r["udp"]:
            res["configs"][config] |= {
                "udp_p50_us": {size: med([x["p50_us"] for x in r["udp"][size]]) for size in UDP_SIZES},
                "udp_p99_us": {size: med([x["p99_us"] for x in r["udp"][size]]) for size in UDP_SIZES},
            }
    for config, r in local.items():
        res["intra_rack"][config] = summary(r, cpu=False)
    os.makedirs(args.out, exist_ok=True)
    json.dump(res, open(os.path.join(args.out, "network.json"), "w"), indent=1)
    plot(res)
    c = res["configs"]
    n, d, a = c["native"], c["ddio"], c["dma"]
    m = res["machine"]
    x = lambda v, base: f"{v / base:.2f}x"
    lines = [
        "<!-- network:begin (generated by scripts/bench/network.py; do not edit by hand) -->",
        "## Network: the nComponent (paper section 4)",
        "",
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_mib']} MiB, Linux {m['kernel']}. "
        f"{args.reps} interleaved repetitions, medians. Hosts are network namespaces on this machine "
        "linked by veth pairs: the native client runs on the nComponent's host, the splitos client on "
        "the pComponent's, whose only way out is the nComponent; the server runs on a plain Linux host "
        "outside. DDIO: bytes travel in the stub's requests; DMA: through socket buffers on an "
        "mComponent. `python3 scripts/bench/network.py` (docs/network.md says what the gap is made of).",
        "",
        "Round trips (p50, µs; ratio to native) and p99:",
        "",
        "| message | native | DDIO | DMA | p99 native | p99 DDIO | p99 DMA |",
        "|---|---|---|---|---|---|---|",
    ]
    for size in SIZES:
        lines.append(f"| {size} B | {n['rr_p50_us'][size]:.1f} | {d['rr_p50_us'][size]:.1f} ({x(d['rr_p50_us'][size], n['rr_p50_us'][size])}) | {a['rr_p50_us'][size]:.1f} ({x(a['rr_p50_us'][size], n['rr_p50_us'][size])}) | {n['rr_p99_us'][size]:.1f} | {d['rr_p99_us'][size]:.1f} | {a['rr_p99_us'][size]:.1f} |")
    lines += ["", "Streams (MB/s; ratio to native) and CPU per byte sent (ns; under splitos with the pComponents' and the nComponent's):", "", "| writes of | native | DDIO | DMA | CPU native | CPU DDIO | CPU DMA |", "|---|---|---|---|---|---|---|"]
    for size in SIZES:
        lines.append(f"| {size} B | {n['stream_mb_s'][size]:.0f} | {d['stream_mb_s'][size]:.0f} ({x(d['stream_mb_s'][size], n['stream_mb_s'][size])}) | {a['stream_mb_s'][size]:.0f} ({x(a['stream_mb_s'][size], n['stream_mb_s'][size])}) | {n['cpu_ns_per_byte'][size]:.2f} | {d['cpu_ns_per_byte'][size]:.2f} | {a['cpu_ns_per_byte'][size]:.2f} |")
    lines += ["", "UDP round trips (p50 and p99, µs; ratio to native):", "", "| datagram | native | DDIO | p99 native | p99 DDIO |", "|---|---|---|---|---|"]
    for size in UDP_SIZES:
        un, ud = n["udp_p50_us"][size], d["udp_p50_us"][size]
        lines.append(f"| {size} B | {un:.1f} | {ud:.1f} ({x(ud, un)}) | {n['udp_p99_us'][size]:.1f} | {d['udp_p99_us'][size]:.1f} |")
    lb, sc, nc, rm = (res["intra_rack"][k] for k in INTRA)
    lines += [
        "",
        f"- Connect (socket, connect, TCP_NODELAY): p50 {n['connect_p50_us']:.0f} µs native, {d['connect_p50_us']:.0f} µs DDIO ({x(d['connect_p50_us'], n['connect_p50_us'])}), "
        f"{a['connect_p50_us']:.0f} µs DMA; p99 {n['connect_p99_us']:.0f}, {d['connect_p99_us']:.0f} and {a['connect_p99_us']:.0f} µs.",
        f"- Streaming word count (figure 9; a CPython mapper sends 2,000,000 words to a reducer outside): "
        f"{n['wordcount_s']:.2f} s native, {d['wordcount_s']:.2f} s DDIO ({x(d['wordcount_s'], n['wordcount_s'])}), {a['wordcount_s']:.2f} s DMA ({x(a['wordcount_s'], n['wordcount_s'])}); "
        "the reducer's answers are identical.",
        "",
        "Intra-rack (figure 8): a client and a server of one vNode on one pComponent, connected by the shortcut "
        "(through the pComponent) and through the nComponent, and on two pComponents connected directly "
        "(the shortcut across pComponents), against both natively on loopback:",
        "",
        "| message | rr p50 loopback | shortcut | two pComponents | via nComponent | MB/s loopback | shortcut | two pComponents | via nComponent |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for size in SIZES:
        lines.append(f"| {size} B | {lb['rr_p50_us'][size]:.1f} | {sc['rr_p50_us'][size]:.1f} | {rm['rr_p50_us'][size]:.1f} | {nc['rr_p50_us'][size]:.1f} | {lb['stream_mb_s'][size]:.0f} | {sc['stream_mb_s'][size]:.0f} | {rm['stream_mb_s'][size]:.0f} | {nc['stream_mb_s'][size]:.0f} |")
    lines += ["", "![latency and throughput](network.png)", "", "<!-- network:end -->"]
    replace_section(os.path.join(ROOT, "docs"), "network", lines)


def plot(res):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    series = [(f"{k} (outside)", res["configs"][k], st) for k, st in (("native", "o-"), ("ddio", "s-"), ("dma", "^-"))]
    series += [(f"{k} (intra-rack)", res["intra_rack"][k], st) for k, st in (("loopback", "o--"), ("shortcut", "s--"), ("remote", "d--"))]
    for label, c, style in series:
        a.plot(SIZES, [c["rr_p50_us"][s] for s in SIZES], style, label=label)
        b.plot(SIZES, [c["stream_mb_s"][s] for s in SIZES], style, label=label)
    for ax, title, unit in ((a, "round trip, p50", "µs"), (b, "throughput", "MB/s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", "network.png"), dpi=110)


if __name__ == "__main__":
    main()
