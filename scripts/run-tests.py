#!/usr/bin/env python3
"""Runs the workspace's tests side by side, one process per end-to-end test.

The end-to-end tests spend most of their time waiting on the components and programs they
start, so one at a time (what `cargo test` does across test binaries) leaves a 2-core
machine mostly idle. This runner builds once (linted: the workspace's crates are compiled by clippy's
driver), lists every test, and runs them from a pool of `--jobs` slots, longest first (by the
times of the last run, kept in target/, or else by tests/test-times.json), each in a session
and a control group of its own that is ended if it outlives `--timeout`, and whose CPU time is
reported. Unit-test binaries run whole, as `cargo test` would run them.

Tests whose result depends on having the machine to themselves (they measure timing or
change machine-wide settings such as swap) are listed in tests/alone.txt: they run after the
pool drains, one at a time, with nothing else beside them; those on one line of
tests/apart.txt run in the pool but never beside one another. Nothing is skipped: every test of
every binary runs, and a test that fails is reported with its whole output.
"""

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMES = ROOT / "target" / "test-times.json"
# The times a fresh clone schedules by, until it has run the tests once (refreshed by copying
# target/test-times.json here when tests were added or their times changed much).
KNOWN_TIMES = ROOT / "tests" / "test-times.json"
# The CPU time each test and all it started used, where the machine lets the runner measure it.
CPU = ROOT / "target" / "test-cpu.json"
ALONE = ROOT / "tests" / "alone.txt"
APART = ROOT / "tests" / "apart.txt"
# Where a failed test's cluster leaves its logs (CARGO_TARGET_TMPDIR/failed/<test>).
FAILED = ROOT / "target" / "tmp" / "failed"


def print_warnings(test):
    """The warnings and errors its components logged, for a failed test whose cluster kept its
    logs (tests/e2e/common.rs copies them to FAILED when a test panics): what a failure seen once
    in a loaded run is explained by."""
    kept = FAILED / test.split("::", 1)[-1].replace("::", "-")
    for log in sorted(kept.glob("*.log")):
        lines = [line for line in log.read_text(errors="replace").splitlines() if " WARN " in line or " ERROR " in line]
        if lines:
            print(f"-- {log.name}: {len(lines)} warnings and errors, the last {min(len(lines), 25)}:")
            print("\n".join(lines[-25:]))


def lint_env():
    """The environment under which cargo compiles the workspace's own crates with clippy's driver
    instead of rustc, warnings denied, as `cargo clippy -- -D warnings` does: the build that the
    tests run is also the lint, and the dependencies are not compiled a second time only to be
    type-checked (that took a fifth of the test command's time). The driver leaves MIR
    optimisations out (its lints read the MIR); LLVM's are all there."""
    sysroot = subprocess.run(["rustc", "--print", "sysroot"], cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
    driver = Path(sysroot) / "bin" / "clippy-driver"
    if not driver.exists():
        sys.exit(f"run-tests: no {driver}: `rustup component add clippy` (scripts/setup.sh does)")
    return {**os.environ, "RUSTC_WORKSPACE_WRAPPER": str(driver), "CLIPPY_ARGS": "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"}


def build(cargo_args):
    """Builds every library, program, benchmark and test (the programs the tests start, the shim,
    every test binary) in one go, linted (`lint_env`), so that the dependencies are built once,
    with the features the tests' own dependencies add; returns (name, kind, executable, cwd) for
    each test binary."""
    # Not --all-targets: that also builds each library as a benchmark harness, the shim's
    # among them, which is tested only loaded into programs (test = false). The libraries' test
    # harnesses are linted as theirs would be; `--bench '*'` takes the benchmark programs.
    cmd = ["cargo", "build", "--release", "--workspace", "--lib", "--bins", "--tests", "--bench", "*", "--message-format=json-render-diagnostics", *cargo_args]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=lint_env())
    if proc.returncode != 0:
        sys.exit(f"run-tests: the build or its lints failed ({' '.join(cmd)})")
    bins = []
    for line in proc.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("profile", {}).get("test") or not msg.get("executable"):
            continue
        target = msg["target"]
        if "bench" in target["kind"]:
            continue  # built to be linted; a benchmark is run by hand (cargo bench)
        kind = "e2e" if "test" in target["kind"] else "unit"
        name = target["name"] if kind == "e2e" else f"{target['name']}:{target['kind'][0]}"
        bins.append((name, kind, msg["executable"], str(Path(msg["manifest_path"]).parent)))
    return bins


def list_tests(exe, cwd):
    out = subprocess.run([exe, "--list", "--format", "terse"], cwd=cwd, stdout=subprocess.PIPE, text=True, check=True).stdout
    return [line[: -len(": test")] for line in out.splitlines() if line.endswith(": test")]


def jobs_of(bins, filters):
    """One job per end-to-end test, one per unit-test binary."""
    jobs = []
    for name, kind, exe, cwd in bins:
        if kind == "unit":
            if not filters or any(f in name for f in filters):
                jobs.append({"id": name, "argv": [exe], "cwd": cwd})
            continue
        for test in list_tests(exe, cwd):
            tid = f"{name}::{test}"
            if filters and not any(f in tid for f in filters):
                continue
            jobs.append({"id": tid, "argv": [exe, "--exact", test, "--test-threads", "1"], "cwd": cwd})
    return jobs


def patterns(path):
    """The lines of `path` without comments and blank lines."""
    if not path.exists():
        return []
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def clashes(job, running, apart):
    """Whether `job` may not start beside the `running` jobs: it matches one part of a line of
    tests/apart.txt and a running one matches another part of it."""
    for parts in apart:
        mine = {p for p in parts if p in job["id"]}
        if mine and any(p in r.job["id"] and p not in mine for r in running for p in parts):
            return True
    return False


def comm_of(pid):
    """A process's name and the first words of its command line."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return " ".join(a.decode(errors="replace") for a in argv[:2] if a) or str(pid)
    except OSError:
        return str(pid)


class Group:
    """A control group of the test's own, where the machine lets us make one: what the test and
    everything it started used of the CPUs (the pool is bound by CPU on small machines, so that
    is what a test costs the others), and whatever it left running, even processes that left its
    session (daemons), to be ended. cgroup v2, or v1's cpuacct hierarchy."""

    V2 = Path("/sys/fs/cgroup")
    V1 = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self, name):
        self.path = None
        root = self.V2 if (self.V2 / "cgroup.controllers").exists() else self.V1
        if not (root / "cgroup.procs").exists():
            return
        path = root / "splitos-tests" / name
        try:
            path.mkdir(parents=True, exist_ok=True)
            self.path = path
        except OSError:
            pass

    @classmethod
    def remove_parent(cls):
        """Removes the groups' parent once empty (another runner's tests may still be in it)."""
        for root in (cls.V2, cls.V1):
            with contextlib.suppress(OSError):
                (root / "splitos-tests").rmdir()

    def join(self):
        """Run in the test's process before it starts the test."""
        if self.path:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def cpu_s(self):
        try:
            if (self.path / "cpu.stat").exists():
                usec = next(int(l.split()[1]) for l in (self.path / "cpu.stat").read_text().splitlines() if l.startswith("usage_usec "))
                return usec / 1e6
            return int((self.path / "cpuacct.usage").read_text()) / 1e9
        except (OSError, TypeError, StopIteration, ValueError):
            return None

    def pids(self):
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, TypeError):
            return []

    def close(self):
        """Ends what is left in the group, then removes it."""
        if not self.path:
            return
        for _ in range(100):
            left = self.pids()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        try:
            self.path.rmdir()
        except OSError as e:
            print(f"run-tests: could not remove {self.path}: {e}", flush=True)


class Running:
    def __init__(self, job, log_dir):
        self.job = job
        name = job["id"].replace("/", "_").replace(":", "_")
        self.log = open(log_dir / (name + ".log"), "w+b")
        self.group = Group(name)
        self.start = time.monotonic()
        # A session of its own: on a timeout the test and everything it started are ended.
        self.proc = subprocess.Popen(job["argv"], cwd=job["cwd"], stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=self.group.join)

    def elapsed(self):
        return time.monotonic() - self.start

    def left_behind(self):
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def end(self):
        """Ends what the test left running; returns the CPU time the test used, if known."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        # Components the test started in process groups of their own end when it does (an
        # embedded cluster's on their parent's death, a test cluster's when it is dropped), but
        # not at once: a moment to exit on their own, and only those still there are named.
        left = self.group.pids()
        for _ in range(40):
            if not left:
                break
            time.sleep(0.05)
            left = self.group.pids()
        if left:
            names = sorted(comm_of(pid) for pid in left)
            print(f"run-tests: {self.job['id']} left {len(left)} processes running 2 s after it ended ({', '.join(names)}); ending them", flush=True)
        cpu = self.group.cpu_s()
        self.group.close()
        return cpu

    def output(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")


def run(jobs, slots, timeout, log_dir, results, apart=()):
    """Runs `jobs` (in the order given, but none beside a job it must stay `apart` from)
    `slots` at a time; fills `results`."""
    pending = list(jobs)
    running = []
    while pending or running:
        while len(running) < slots:
            job = next((j for j in pending if not clashes(j, running, apart)), None)
            if job is None:
                break
            pending.remove(job)
            running.append(Running(job, log_dir))
        time.sleep(0.05)
        for r in list(running):
            code = r.proc.poll()
            timed_out = code is None and r.elapsed() > timeout
            if code is None and not timed_out:
                continue
            if not timed_out and r.left_behind():
                print(f"run-tests: {r.job['id']} left processes running; ending them", flush=True)
            cpu = r.end()
            running.remove(r)
            ok = code == 0 and not timed_out
            secs = r.elapsed()
            results[r.job["id"]] = {"ok": ok, "secs": secs, "cpu": cpu, "timed_out": timed_out, "output": "" if ok else r.output()}
            status = "PASS" if ok else ("TIMEOUT" if timed_out else "FAIL")
            used = f"{cpu:6.1f}s CPU" if cpu is not None else ""
            print(f"{status:7} {secs:7.1f}s {used} {r.job['id']}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("filters", nargs="*", help="run only tests whose name (`e2e::quota::...`, `splitos_rpc:lib`) contains one of these")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("SPLITOS_TEST_JOBS", 2 * (os.cpu_count() or 1) + 2)), help="tests run at once (default: twice the cores, plus two; env SPLITOS_TEST_JOBS)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds after which a test is ended and counted as failed")
    args = ap.parse_args()

    t0 = time.monotonic()
    bins = build([])
    built = time.monotonic() - t0
    jobs = jobs_of(bins, args.filters)
    known = TIMES if TIMES.exists() else KNOWN_TIMES
    times = json.loads(known.read_text()) if known.exists() else {}
    alone = patterns(ALONE)
    apart = [line.split() for line in patterns(APART)]
    solo = [j for j in jobs if any(p in j["id"] for p in alone)]
    pool = [j for j in jobs if j not in solo]
    # Longest first; a test never timed yet counts as long, so it does not start last.
    pool.sort(key=lambda j: -times.get(j["id"], 120))
    shutil.rmtree(FAILED, ignore_errors=True)
    log_dir = ROOT / "target" / "test-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"run-tests: built in {built:.0f} s; {len(pool)} jobs {args.jobs} at a time, then {len(solo)} alone", flush=True)

    results = {}
    run(pool, args.jobs, args.timeout, log_dir, results, apart)
    run(solo, 1, args.timeout, log_dir, results)
    Group.remove_parent()

    times.update({k: round(v["secs"], 1) for k, v in results.items()})
    TIMES.write_text(json.dumps(times, indent=1, sort_keys=True))
    failed = [k for k, v in results.items() if not v["ok"]]
    for k in failed:
        print(f"\n==== {k} ====\n{results[k]['output'][-20000:]}")
        print_warnings(k)
    slowest = sorted(results.items(), key=lambda kv: -kv[1]["secs"])[:10]
    print("\nslowest: " + ", ".join(f"{k} {v['secs']:.0f}s" for k, v in slowest))
    used = {k: v["cpu"] for k, v in results.items() if v["cpu"] is not None}
    if used:
        CPU.write_text(json.dumps({k: round(v, 1) for k, v in used.items()}, indent=1, sort_keys=True))
        hungriest = sorted(used.items(), key=lambda kv: -kv[1])[:10]
        print(f"CPU: {sum(used.values()):.0f} s in all; most: " + ", ".join(f"{k} {v:.0f}s" for k, v in hungriest))
    total = time.monotonic() - t0
    print(f"run-tests: {len(results) - len(failed)} passed, {len(failed)} failed, in {total:.0f} s (build {built:.0f} s)")
    if failed:
        print("failed:\n  " + "\n  ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
