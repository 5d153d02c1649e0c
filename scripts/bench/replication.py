#!/usr/bin/env python3
"""LegoOS figure 14 with replication: what keeping heap memory safe from the loss of an
mComponent costs, on this machine, side by side with no replication in the same run.

- Slowdown of the suite's workloads with an ExCache of 25% of their working set, five
  mComponents, `--replication none`, `replica`, `log` and `ec` (ec:4) interleaved (against native
  runs in the same run; every output checked against the native one).
- Memory on the mComponents per scheme, for a program holding 256 MiB.
- Time to rebuild what an mComponent held (per GiB), from the moment it is killed and from
  the moment the homes start copying (replica), replaying backups (log) or rebuilding from
  parity (ec).
- How long a program stalls when an mComponent that holds its pages dies under it (the
  longest single memory access), against the longest access of runs where nothing dies.

    python3 scripts/bench/replication.py [--reps N] [--all] [--out DIR]

Writes DIR/replication.json and the section of DIR/benchmarks.md (default: results/ and docs/).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from benchlib import ROOT, SPLITOS, ensure_env, machine, replace_section
from suite import geomean, med, run, splitos_prefix, working_set_kib, workloads

SCHEMES = ("none", "replica", "log", "ec")
# Set members per scheme, and mComponents enough for a set and one to rebuild onto.
MEMBERS = {"none": 1, "replica": 2, "log": 2, "ec": 5}
MCOMPS = 5
STALL_RUNS = ("none", "replica", "log", "ec", "replica-killed", "log-killed", "ec-killed", "none-killed")
QUICK_SET = ("wordcount (tr, sort, uniq -c)", "sqlite3 (in-memory database)", "node (word-pair Map)")


def build(name):
    out = os.path.join(tempfile.gettempdir(), f"splitos-bench-{name}")
    src = os.path.join(ROOT, "scripts", "bench", f"{name}.c") if name == "stall" else os.path.join(ROOT, "tests", "programs", f"{name}.c")
    subprocess.run(["gcc", "-O2", "-o", out, src], check=True)
    return out


class Cluster:
    """A `splitos cluster up` in a private state directory, stopped on exit."""

    def __init__(self, mcomps, replication, extra=""):
        self.dir = tempfile.mkdtemp(prefix="splitos-bench-repl-")
        self.env = dict(os.environ, SPLITOS_STATE_DIR=self.dir, SPLITOS_DATA_DIR=os.path.join(self.dir, "data"))
        cfg = os.path.join(self.dir, "cluster.toml")
        with open(cfg, "w") as f:
            f.write(f'[cluster]\nreplication = "{replication}"\nreclaim_dead_ms = 1000\n{extra}[[pcomponent]]\nexcache = "16M"\n[[scomponent]]\n' + "[[mcomponent]]\n" * mcomps)
        up = subprocess.run([SPLITOS, "cluster", "up", "--config", cfg], env=self.env, capture_output=True, text=True)
        if up.returncode != 0:
            sys.exit(f"cluster up ({mcomps} mComponents, {replication}) failed: {up.stderr.strip()}")

    def status(self):
        out = subprocess.run([SPLITOS, "cluster", "status", "--json"], env=self.env, check=True, capture_output=True).stdout
        return [c for c in json.loads(out)["components"]]

    def backup_bytes(self):
        return sum(c["stats"]["backup_files"]["bytes"] for c in self.status() if c["role"] == "scomponent" and c["stats"])

    def settled(self):
        """Every logger's log on its sComponent, and no vRegion left unprotected."""
        ms = self.mcomps()
        return all(m["stats"]["backup_log"]["queued_bytes"] == 0 and not any(p["unprotected_vregions"] for p in m["stats"]["owned_processes"]) for m in ms)

    def mcomps(self):
        return [c for c in self.status() if c["role"] == "mcomponent" and c["alive"] and c["stats"]]

    def spawn(self, cmd):
        return subprocess.Popen([SPLITOS, "run", "--", *cmd], env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def pid_of(self, addr):
        port = addr.rsplit(":", 1)[1]
        out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True).stdout
        return int(out.split("pid=")[1].split(",")[0])

    def home(self, pid):
        for m in self.mcomps():
            for p in m["stats"]["home_processes"]:
                if p["pid"] == pid:
                    return m, p
        return None, None

    def down(self):
        subprocess.run([SPLITOS, "cluster", "down"], env=self.env, capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def program_pid(c):
    return next(x for x in c.status() if x["role"] == "pcomponent")["stats"]["processes"][0]["pid"]


def victim(c, pid):
    """The live mComponent, other than the home, that is at the first place (the primary, or
    the first data place) of most of the process's vRegions."""
    home, p = c.home(pid)
    counts = {}
    for v in p["vregions"]:
        if v["owners"] and v["owners"][0] != home["id"]:
            counts[v["owners"][0]] = counts.get(v["owners"][0], 0) + 1
    target = max(counts, key=counts.get)
    return next(m for m in c.mcomps() if m["id"] == target)


def whole(c, pid, copies):
    live = {m["id"] for m in c.mcomps()}
    _, p = c.home(pid)
    return p is not None and all(len(v["owners"]) == copies and set(v["owners"]) <= live for v in p["vregions"])


def slowdowns(reps, names, bar):
    wl = workloads(False)
    res = {}
    for name in names:
        spec = wl[name]
        env = spec.get("env")
        ws = working_set_kib(spec["cmd"], env)
        r = res[name] = {"working_set_kib": ws, "native_s": [], **{s: [] for s in SCHEMES}, "flushes": {s: [] for s in SCHEMES}, "mismatches": []}
        for _ in range(reps):
            secs, digest, code, _, err = run(spec["cmd"], env)
            if code != 0:
                sys.exit(f"{name} failed natively: {err.decode()[-300:]}")
            r["native_s"].append(secs)
            bar.update()
            for s in SCHEMES:
                with tempfile.NamedTemporaryFile(suffix=".json") as st:
                    secs2, d2, code2, _, err2 = run(spec["cmd"], env, splitos_prefix(ws // 4, st.name, ["--mcomponents", str(MCOMPS), "--replication", s]))
                    stats = json.load(open(st.name)) if os.path.getsize(st.name) else {}
                if code2 != 0 or d2 != digest:
                    r["mismatches"].append(f"{s}: exit {code2}: {err2.decode()[-300:]}")
                r[s].append(secs2)
                r["flushes"][s].append(sum(m.get("flushes", 0) for m in stats.get("mcomponents", [])))
                bar.update()
    return res


def memory(hold):
    out = {}
    for s in SCHEMES:
        c = Cluster(MCOMPS, s)
        try:
            p = c.spawn([hold, "256"])
            assert p.stdout.readline() == "ready\n"
            wait_settled(c)
            out[s] = {"mcomponents": sum(m["stats"]["used"] for m in c.mcomps()), "backup_files": c.backup_bytes()}
            p.stdin.close()
            p.wait()
        finally:
            c.down()
    return out


def wait_settled(c):
    t0 = time.monotonic()
    while not c.settled():
        if time.monotonic() - t0 > 120:
            sys.exit("the backup logs did not reach the sComponent within two minutes")
        time.sleep(0.1)


def work_done(c, skip=None):
    """Pages copied to new members and pages replayed from backups, over the mComponents."""
    return sum(m["stats"]["rebuild"]["copied_pages"] + m["stats"]["log_promoted_pages"] for m in c.mcomps() if m["id"] != skip)


def rebuild(hold, mib, scheme):
    """Kills the mComponent at the first place of most sets of a program holding `mib` MiB;
    returns seconds from the kill to the first rebuilt page, from there to every vRegion whole
    again, and the bytes rebuilt."""
    c = Cluster(MEMBERS[scheme] + 1, scheme, 'vregion_size = "64M"\n')
    try:
        p = c.spawn([hold, str(mib)])
        assert p.stdout.readline() == "ready\n"
        pid = program_pid(c)
        # A lost primary is replayed from its logger's backup only when that backup is whole.
        wait_settled(c)
        v = victim(c, pid)
        copied0 = work_done(c)
        promoted0 = sum(m["stats"]["log_promoted_pages"] for m in c.mcomps())
        os.kill(c.pid_of(v["addr"]), signal.SIGKILL)
        t0 = time.monotonic()
        started = None
        while time.monotonic() - t0 < 120:
            copied = work_done(c, v["id"])
            if started is None and copied > copied0:
                started = time.monotonic()
            if started is not None and whole(c, pid, MEMBERS[scheme]):
                done = time.monotonic()
                break
            time.sleep(0.02)
        else:
            sys.exit("the rebuild did not finish within two minutes")
        copied = sum(m["stats"]["rebuild"]["copied_pages"] for m in c.mcomps()) - (copied0 - promoted0)
        promoted = sum(m["stats"]["log_promoted_pages"] for m in c.mcomps()) - promoted0
        p.stdin.close()
        out = p.stdout.read()
        p.wait()
        want = subprocess.run([hold, str(mib)], input="", capture_output=True, text=True).stdout
        if "ready\n" + out != want:
            sys.exit(f"hold {mib} printed {out!r} after the rebuild, natively {want!r}")
        return {"detect_s": started - t0, "copy_s": done - started, "bytes": copied * 4096, "replayed_bytes": promoted * 4096}
    finally:
        c.down()


def stall(prog, scheme, kill):
    """The stall program's report when an mComponent holding its pages is killed a second
    into its access loop (or nothing is killed)."""
    c = Cluster(MEMBERS[scheme] + 1, scheme, 'vregion_size = "16M"\n')
    try:
        p = c.spawn([prog, "128", "4"])
        assert p.stdout.readline() == "ready\n"
        if kill:
            wait_settled(c)
            pid = program_pid(c)
            v = victim(c, pid)
            time.sleep(1)
            os.kill(c.pid_of(v["addr"]), signal.SIGKILL)
        out, err = p.communicate(timeout=120)
        if p.returncode != 0:
            return {"failed": err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}"}
        return json.loads(out.strip().splitlines()[-1])
    finally:
        c.down()


def plot(res, docs):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [3, 1.3]})
    names = list(res["slowdown"])
    width = 0.8 / len(SCHEMES)
    for i, s in enumerate(SCHEMES):
        vals = [med(res["slowdown"][n][s]) / med(res["slowdown"][n]["native_s"]) for n in names]
        a.bar([x + i * width for x in range(len(names))], vals, width, label=s)
    a.set_xticks([x + width * (len(SCHEMES) - 1) / 2 for x in range(len(names))])
    a.set_xticklabels([n.split(" (")[0] for n in names])
    a.set_ylabel("slowdown vs native (25% ExCache)")
    a.set_title("LegoOS figure 14 with replication schemes")
    a.legend(fontsize="small")
    mem = res["memory"]
    data = 256 << 20
    b.bar(range(len(SCHEMES)), [mem[s]["mcomponents"] / data for s in SCHEMES], 0.6, label="mComponents' memory")
    b.bar(range(len(SCHEMES)), [mem[s]["backup_files"] / data for s in SCHEMES], 0.6, bottom=[mem[s]["mcomponents"] / data for s in SCHEMES], label="sComponent's disk", color="tab:gray")
    b.set_xticks(range(len(SCHEMES)))
    b.set_xticklabels(SCHEMES)
    b.set_ylabel("bytes / data (hold 256)")
    b.set_title("Where the copies are")
    b.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(os.path.join(docs, "replication.png"), dpi=100)


def report(res, docs):
    m = res["machine"]
    lines = ["<!-- replication:begin (generated by scripts/bench/replication.py; do not edit by hand) -->",
             "## Replication: LegoOS figure 14 with schemes", "",
             f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_mib']} MiB, Linux {m['kernel']}. {MCOMPS} mComponents on this host (shared memory), `run --embedded --replication none|replica|log|ec` (`log` is LegoOS's: a primary and a logger that streams every write-back to a backup file on the sComponent; `ec` is ec:4: four data places and a parity place per vRegion), the schemes interleaved; medians of {res['reps']} run(s) (min–max), time divided by the native time of the same run. Every output was compared with the native run's.", "",
             "| workload | working set | native s | none 25% | replica 25% | log 25% | ec 25% | replica / none | log / none | ec / none | write-backs taken by mComponents (none → replica → log → ec) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios = {s: [] for s in SCHEMES}
    for name, r in res["slowdown"].items():
        nat = med(r["native_s"])
        cells = []
        for s in SCHEMES:
            xs = [t / nat for t in r[s]]
            ratios[s].append(med(xs))
            cells.append(f"{med(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})")
        flushes = " → ".join(f"{med(r['flushes'][s]):.0f}" for s in SCHEMES)
        lines.append(f"| {name} | {r['working_set_kib'] // 1024} MiB | {nat:.2f} | {' | '.join(cells)} | {med(r['replica']) / med(r['none']):.2f} | {med(r['log']) / med(r['none']):.2f} | {med(r['ec']) / med(r['none']):.2f} | {flushes} |")
    lines += ["", "Geometric mean: " + ", ".join(f"{s} {geomean(ratios[s]):.2f}x" for s in SCHEMES) + " native.", "", "![replication](replication.png)"]
    mism = [f"{n}: {x}" for n, r in res["slowdown"].items() for x in r["mismatches"]]
    if mism:
        lines += ["", "Runs whose output differed from native: " + "; ".join(mism)]
    mem = res["memory"]
    lines += ["", f"Memory on the mComponents for a program holding 256 MiB (`hold 256`, 16 MiB ExCache, {MCOMPS} mComponents):", "",
              "| scheme | bytes on mComponents | / the data (256 MiB) | backup files on the sComponent's disk |", "|---|---|---|---|"]
    for s in SCHEMES:
        lines.append(f"| {s} | {mem[s]['mcomponents'] / (1 << 20):.0f} MiB | {mem[s]['mcomponents'] / (256 << 20):.2f} | {mem[s]['backup_files'] / (1 << 20):.0f} MiB |")
    lines += ["", f"Rebuild: `hold {res['rebuild_mib']}` with 64 MiB vRegions on one mComponent more than a set has (three for replica and log, six for ec), once every backup log reached the sComponent; the mComponent at the first place of most of its sets killed with SIGKILL. For log, the loggers of the killed primary's vRegions replay their backups into pages (\"replayed\"), before new loggers get full copies (\"rebuilt\"). The homes hear of it from the global managers, who declare an mComponent lost after `reclaim_dead_ms` (here 1000 ms) and say so in their next heartbeat answers; a program that touches a lost member makes its pComponent report it at once instead. The program then read its whole heap back and printed its native output.", "",
              "| scheme | kill → rebuilding | replayed | rebuilt | time | per GiB rebuilt or replayed |", "|---|---|---|---|---|---|"]
    for s in ("replica", "log", "ec"):
        rb = res["rebuild"][s]
        gib = (rb["bytes"] + rb.get("replayed_bytes", 0)) / (1 << 30)
        lines.append(f"| {s} | {rb['detect_s']:.2f} s | {rb.get('replayed_bytes', 0) / (1 << 20):.0f} MiB | {rb['bytes'] / (1 << 20):.0f} MiB | {rb['copy_s']:.2f} s | {rb['copy_s'] / gib:.2f} s |")
    st = res["stall"]

    def fmt(r):
        return r["failed"] if "failed" in r else f"{r['max_us'] / 1000:.1f} ms longest, p99.9 {r['p999_us']:.0f} µs, {r['accesses']} accesses"
    lines += ["", "Stall: `stall 128 4` (random reads and writes of 128 MiB for 4 s, 16 MiB ExCache, 16 MiB vRegions, one mComponent more than a set has), timing every access; in the runs marked *killed*, the mComponent at the first place of most of its sets is killed a second into the loop.", "",
              "| run | longest access and p99.9 |", "|---|---|"]
    for k in STALL_RUNS:
        lines.append(f"| {k.replace('-killed', ', killed')} | {fmt(st[k])} |")
    lines += ["", "What this says: `replica` doubles the memory on mComponents and writes every dirty line back twice; both writes are under way at once (the primary's rides with the fetch), and misses still go to one mComponent. `ec` keeps one copy and a parity row per four pages (1.25x), and a write-back costs two hops in a row (the holder, then its change to the parity member) where `replica` costs two in parallel. On two cores every extra server thread competes with the program, the fault worker and the first server for the CPUs, which is most of the difference; on separate hosts `replica`'s second write costs the slower of two parallel round trips and `ec`'s a second round trip. `log` keeps one copy in memory, as `none` does, and the backup on the sComponent's disk; every write-back also goes to the logger, which copies it into its log and streams it to the sComponent, so on two cores the logger's streaming and the sComponent's writes take CPU from the program as `replica`'s second copy does, and more. A rebuild from parity reads every survivor's part of a row to write one page, so per GiB rebuilt it moves K times the bytes a replica copy does (the vRegion a program waits for is rebuilt first, the others in the background). A lost primary's loggers replay their backups from the sComponent's disk before new loggers get full copies: `log` pays a read of the backup and a copy. The stall when an mComponent dies is the time to notice it (a broken connection is seen at once; a host that stops answering is seen after the RPC timeout) plus the rebuild of the vRegions the program touches next.",
              "<!-- replication:end -->"]
    replace_section(docs, "replication", lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--all", action="store_true", help="every workload of the suite (default: wordcount, sqlite3, node)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root, as the suite does")
    ensure_env()
    from tqdm import tqdm
    out_dir = args.out or os.path.join(ROOT, "results")
    docs_dir = args.out or os.path.join(ROOT, "docs")
    names = list(workloads(False)) if args.all else list(QUICK_SET)
    hold, prog = build("hold"), build("stall")
    res = {"machine": machine(), "reps": args.reps}
    bar = tqdm(total=len(names) * args.reps * (1 + len(SCHEMES)), unit="run", file=sys.stderr, dynamic_ncols=True)
    res["slowdown"] = slowdowns(args.reps, names, bar)
    bar.close()
    res["memory"] = memory(hold)
    res["rebuild_mib"] = 1024
    res["rebuild"] = {s: rebuild(hold, 1024, s) for s in ("replica", "log", "ec")}
    res["stall"] = {k: stall(prog, k.split("-")[0], k.endswith("killed")) for k in STALL_RUNS}
    os.makedirs(out_dir, exist_ok=True)
    json.dump(res, open(os.path.join(out_dir, "replication.json"), "w"), indent=1)
    report(res, docs_dir)
    plot(res, docs_dir)
    print(json.dumps({k: res[k] for k in ("memory", "rebuild", "stall")}, indent=1))


if __name__ == "__main__":
    main()
