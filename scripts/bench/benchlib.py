"""What the benchmark scripts share: where things are, their Python environment, the machine
description and the generated sections of docs/benchmarks.md."""
import argparse
import json
import os
import platform
import random
import re
import resource
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPLITOS = os.environ.get("SPLITOS_BIN") or os.path.join(ROOT, "target", "release", "splitos")
WORK = os.path.join(ROOT, ".bench")
VENV = os.path.join(WORK, "venv")
VPY = os.path.join(VENV, "bin", "python")


def prepare_env():
    """Debian packages, the release build and the Python environment in .bench/, made once
    (a lock keeps two callers from installing at once: scripts/test.sh prepares the environment
    while the tests build)."""
    import fcntl

    os.makedirs(WORK, exist_ok=True)
    with open(os.path.join(WORK, "env.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        need = [pkg for cmd, pkg in (("xz", "xz-utils"), ("sqlite3", "sqlite3"), ("mkswap", "util-linux"), ("gcc", "gcc")) if not shutil.which(cmd)]
        if need:
            subprocess.run(["apt-get", "update", "-qq"], check=True)
            subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *need], check=True, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        if not os.path.exists(VPY):
            subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        probe = subprocess.run([VPY, "-c", "import sklearn, matplotlib, tqdm"], capture_output=True)
        if probe.returncode != 0:
            subprocess.run([VPY, "-m", "pip", "install", "-q", "scikit-learn", "matplotlib", "tqdm"], check=True)


def ensure_env():
    """The environment (`prepare_env`) and the release build; then re-runs the calling script
    inside that environment."""
    prepare_env()
    if not os.path.exists(SPLITOS):
        subprocess.run(["cargo", "build", "--release", "--workspace", "--quiet"], cwd=ROOT, check=True)
    if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        os.execv(VPY, [VPY, *sys.argv])


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = int(next(l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal"))) // 1024
    return {"cores": os.cpu_count(), "cpu": cpu, "memory_mib": mem, "kernel": platform.release()}


def replace_section(docs, tag, lines):
    """Puts `lines` (which begin with `<!-- TAG:begin` and end with `<!-- TAG:end -->`) into
    DOCS/benchmarks.md in place of the section's previous version, or at its end."""
    path = os.path.join(docs, "benchmarks.md")
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n\n"
    block = "\n".join(lines) + "\n"
    if f"<!-- {tag}:begin" in text:
        head, rest = text.split(f"<!-- {tag}:begin", 1)
        text = head + block + rest.split(f"<!-- {tag}:end -->", 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    open(path, "w").write(text)


def miss_workloads(tmp):
    """The miss-path workloads of levers.py and transport.py, one per access pattern, as
    (name, command, ExCache): CPython word counting (pointer chasing: dicts and objects) with a
    cache that fits its working set and with a quarter of it (as measured natively), random
    pages, a sequential scan and a strided scan (one field of every 12 KiB record) in C."""
    rnd = os.path.join(tmp, "randpages")
    subprocess.run(["gcc", "-O2", "-o", rnd, os.path.join(ROOT, "tests", "programs", "randpages.c")], check=True)
    seq = os.path.join(tmp, "seqload")
    subprocess.run(["gcc", "-O2", "-pthread", "-o", seq, os.path.join(ROOT, "scripts", "bench", "seqload.c")], check=True)
    col = os.path.join(tmp, "columns")
    subprocess.run(["gcc", "-O2", "-o", col, os.path.join(ROOT, "tests", "programs", "columns.c")], check=True)
    wordfreq = [sys.executable, os.path.join(ROOT, "scripts", "workloads", "wordfreq.py"), "400000"]
    return [
        ("wordfreq (CPython), fits", wordfreq, "256M"),
        ("wordfreq (CPython) at 25%", wordfreq, "22M"),
        ("random pages (C) at 25%", [rnd, "64", "3"], "16M"),
        ("sequential scan (C) at 1/16", [seq, "64", "1"], "4M"),
        ("strided records (C) at 1/8", [col, "64", "4"], "8M"),
    ]


def cpu_of_children():
    """User + system seconds of every child waited for so far (and of theirs they waited for)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def idle_polling_s():
    """Seconds the CPUs have spent polling in the idle loop (cpuidle's POLL state) since boot:
    the CPU time idle polling costs, which the idle task, not the program, is charged with."""
    total = 0
    for cpu in os.listdir("/sys/devices/system/cpu"):
        path = f"/sys/devices/system/cpu/{cpu}/cpuidle/state0/time"
        if cpu.startswith("cpu") and os.path.exists(path) and open(f"/sys/devices/system/cpu/{cpu}/cpuidle/state0/name").read().strip() == "POLL":
            total += int(open(path).read())
    return total / 1e6


def run_splitos(cmd, excache=None, flags=()):
    """Runs `cmd` natively (no `excache`), or under `splitos run` on an embedded cluster with
    that ExCache and `flags`. Returns (wall s, CPU s of it and its children, stdout, the run's
    counters from --stats-json with `idle_polling_s` (the CPUs' time polling while idle during
    the run) added, empty natively); a failed run ends the script."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        full = cmd if excache is None else [SPLITOS, "run", "--embedded", "--quiet", "--excache", excache, *flags, "--stats-json", f.name, "--", *cmd]
        c0, p0 = cpu_of_children(), idle_polling_s()
        t0 = time.monotonic()
        r = subprocess.run(full, capture_output=True, text=True)
        wall = time.monotonic() - t0
        cpu = cpu_of_children() - c0
        if r.returncode != 0:
            sys.exit(f"{' '.join(full)} failed ({r.returncode}): {r.stderr[-2000:]}")
        stats = json.load(open(f.name)) if excache is not None else {}
        if stats:
            stats["idle_polling_s"] = idle_polling_s() - p0
    return wall, cpu, r.stdout, stats


def side_by_side(workloads, configs, reps, sample, only=""):
    """Each (name, command, ExCache) of `workloads` natively, then under every (label, flags) of
    `configs` in a fresh random order each repetition, every output checked against the native
    run's. `sample(wall, cpu, stats)` gives what one run records (a dict with `wall_s`). One row
    per workload: the native medians and, per configuration, the medians of what was recorded
    with the wall time's min and max."""
    rows = []
    for name, cmd, ex in workloads:
        if only not in name:
            continue
        native, native_cpu, expected = [], [], None
        samples = {label: [] for label, _ in configs}
        for _ in range(reps):
            wall, cpu, out, _ = run_splitos(cmd)
            native.append(wall)
            native_cpu.append(cpu)
            expected = expected or out
            order = list(configs)
            random.shuffle(order)
            for label, flags in order:
                wall, cpu, out, stats = run_splitos(cmd, ex, flags)
                if out != expected:
                    sys.exit(f"{name} under {label}: output differs from the native run")
                samples[label].append(sample(wall, cpu, stats))
        row = {"workload": name, "excache": ex, "native_s": statistics.median(native), "native_cpu_s": statistics.median(native_cpu), "configs": {}}
        for label, runs in samples.items():
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            med["wall_min_s"] = min(r["wall_s"] for r in runs)
            med["wall_max_s"] = max(r["wall_s"] for r in runs)
            row["configs"][label] = med
        rows.append(row)
        print(f"{name} done", file=sys.stderr)
    return rows


def side_by_side_main(doc, name, workloads, configs, sample, report, precheck=None):
    """The command line of a side-by-side benchmark (`--reps`, `--only`, `--out`, `--docs`) and
    its run: [`side_by_side`] over `workloads(tmp)` and `configs` with `sample`, the machine and
    its load average before and after, written to OUT/NAME.json, then `report(res, docs)`.
    `precheck()`, if given, may end the script before anything runs."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="", help="run only the workloads whose name contains this")
    ap.add_argument("--out", default=os.path.join(ROOT, "results"))
    ap.add_argument("--docs", default=os.path.join(ROOT, "docs"))
    args = ap.parse_args()
    ensure_env()
    if precheck:
        precheck()
    res = {"machine": machine(), "load_before": os.getloadavg()[0], "reps": args.reps, "defaults": run_defaults()}
    with tempfile.TemporaryDirectory() as tmp:
        res["workloads"] = side_by_side(workloads(tmp), configs, args.reps, sample, args.only)
    res["load_after"] = os.getloadavg()[0]
    os.makedirs(args.out, exist_ok=True)
    json.dump(res, open(os.path.join(args.out, f"{name}.json"), "w"), indent=1)
    report(res, args.docs)


def run_defaults():
    """The default of each `splitos run` option, as its --help gives it (`{"heap-call-spin-us":
    "20", ...}`): a report states the defaults it measured, not those of when it was written."""
    out = subprocess.run([SPLITOS, "run", "--help"], stdout=subprocess.PIPE, text=True, check=True).stdout
    defaults, opt = {}, None
    for line in out.splitlines():
        m = re.match(r"\s+--([a-z0-9-]+)", line)
        if m:
            opt = m.group(1)
        d = re.search(r"\[default: ([^\]]+)\]", line)
        if d and opt:
            defaults[opt] = d.group(1)
    return defaults


def splitos_configs(specs):
    """The `--with LABEL=OPTIONS` arguments of an A/B benchmark as (label, `splitos run`
    options) pairs; none given measures the defaults alone."""
    configs = []
    for c in specs or ["default="]:
        label, sep, opts = c.partition("=")
        if not sep or not label:
            sys.exit(f"--with wants LABEL=OPTIONS, got {c!r}")
        configs.append((label, shlex.split(opts)))
    return configs


def publish(tag, script, lines, no_doc):
    """Prints a report and, unless `no_doc`, puts it in docs/benchmarks.md as the section `tag`,
    marked as generated by `script` (a path under scripts/bench)."""
    print("\n".join(lines))
    if not no_doc:
        replace_section(os.path.join(ROOT, "docs"), tag, [f"<!-- {tag}:begin (generated by {script}; do not edit by hand) -->", *lines, f"<!-- {tag}:end -->"])


def machine_line(res):
    """The report's first sentence: the machine and its load average around the run."""
    m = res["machine"]
    return f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_mib']} MiB, Linux {m['kernel']}; load average {res['load_before']:.1f} before, {res['load_after']:.1f} after. "


def free_ports(n):
    """`n` distinct free loopback ports (held open together while chosen)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_port(port, proc, what, log):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited ({proc.returncode}) before it listened: {open(log).read()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"{what} did not listen on port {port} within 60 s")


def memcached_stats(port):
    """A memcached server's own `stats`, a name-to-value map."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"stats\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return dict(l.split()[1:3] for l in data.decode().splitlines() if l.startswith("STAT ") and len(l.split()) >= 3)


if __name__ == "__main__":
    prepare_env()
