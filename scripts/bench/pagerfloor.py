#!/usr/bin/env python3
"""The floor of paging from user space on this machine, beside the kernel's own.

Runs scripts/bench/pager.c (a program making random read-modify-writes of its pages, with
some arithmetic between them) natively, under Linux with a memory cgroup of half its pages
swapping to zram, and under the cheapest userfaultfd pagers there can be, whose "remote"
memory is a local buffer: no network, no bookkeeping, no checksum (the configurations are
MODES below). Interleaved repetitions; reports each configuration's time and µs over native
per miss (per swap-in for Linux). Then the same for a program's first touches of new memory
(scripts/bench/firsttouch.c, FIRST_TOUCH below): natively in anonymous memory and in a shared
memfd, under the cheapest userfaultfd pager of a memfd (one UFFDIO_COPY of a window of zeros
per first touch), and under splitos. Then what it costs a pager to take pages out of a program's
page tables, as evicting and sampling lines do (scripts/bench/unmap.c, UNMAP_HOW below), with
the program waiting or running on the other CPU. Needs root (memory cgroup, swap device).
Results go to results/pagerfloor.json and the "Paging floor" section of docs/benchmarks.md;
--parts measures some parts again and keeps the others' results.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite  # noqa: E402
from benchlib import ROOT, SPLITOS, machine, publish  # noqa: E402

PAGER_SRC = os.path.join(ROOT, "scripts", "bench", "pager.c")
# What each configuration of the pager is, for the report.
MODES = {
    "native": "natively, all in memory",
    "zram": "Linux, half in a memory cgroup, swapping to zram",
    "inline": "handler thread polling on the other CPU; it evicts (copy, punch) and installs (UFFDIO_COPY) on each miss",
    "bg": "as inline, and a second thread takes victims out ahead (splice, punch, read), 32 at a time",
    "samecpu": "handler on the program's CPU, sleeping until a fault; evicts and installs on each miss",
    "samecpu-bg": "as samecpu, and bg's evictor on the other CPU",
    "sigbus": "no handler thread: the faulting thread evicts and installs in its own SIGBUS handler",
}

FIRST_TOUCH_SRC = os.path.join(ROOT, "scripts", "bench", "firsttouch.c")
# splitos's window of fresh lines for a first touch that continues a run of them: its
# fault-around and pre-allocation defaults (16 + 64).
WINDOW = 80
FIRST_TOUCH = {
    "anon": "natively, private anonymous memory (a program's heap)",
    "shmem": "natively, a shared mapping of a memfd (what a pager's heap must be), filled by the kernel page by page",
    "uffd": f"the memfd under a userfaultfd handler that answers each first touch with {WINDOW} pages of zeros in one UFFDIO_COPY",
    "splitos": "anonymous memory under `splitos run --embedded` with its defaults (the program's own time)",
}


UNMAP_SRC = os.path.join(ROOT, "scripts", "bench", "unmap.c")
# How a pager takes pages out, and where the program is meanwhile (unmap.c says each).
UNMAP_HOW = {
    "pageout": "`process_madvise(MADV_PAGEOUT)` of 32 scattered pages per call; the pages stay in the memfd (sampling's unmap)",
    "pageout-run": "`process_madvise(MADV_PAGEOUT)` of 32 neighbouring pages in one range",
    "punch": "`fallocate(PUNCH_HOLE)` of one scattered page per call (an eviction's)",
    "punch-run": "`fallocate(PUNCH_HOLE)` of 32 neighbouring pages in one call (a run of victims leaving together)",
}
UNMAP_WHERE = {
    "waits": "the program blocked, as while it waits for its miss",
    "other": "the program running on the other CPU",
}
PARTS = ("pager", "first-touch", "unmap")


def build(tmp, src=PAGER_SRC, name="pager"):
    exe = os.path.join(tmp, name)
    subprocess.run(["gcc", "-O2", "-pthread", "-o", exe, src], check=True)
    return exe


def first_touch(exe, mode, mib):
    """One timed pass of first touches over `mib` MiB in `mode` (FIRST_TOUCH)."""
    args = [exe, "anon" if mode == "splitos" else mode, str(mib), str(WINDOW)]
    if mode == "splitos":
        args = [SPLITOS, "run", "--embedded", "--quiet", "--", *args]
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)


def unmap(exe, how, where, pages):
    """One timed pass of unmap.c: µs per page for `how` with the program `where`."""
    out = subprocess.run([exe, how, where, str(pages), "32", "5"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def run(exe, mode, pages, accesses, work, local):
    resident = pages // 2
    args = [exe, "native" if mode == "zram" else mode, str(pages), str(resident), str(accesses), str(work)]
    if mode != "zram":
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
        return json.loads(out)
    with suite.linux_swapping("zram", max(2 * pages * 4 // 1024, 64), resident * 4096 + local) as (pre, seen):
        out = subprocess.run(pre + args, capture_output=True, text=True, preexec_fn=suite.four_kib_pages)
    if out.returncode != 0 or seen["oom"]:
        return {"mode": "zram", "failed": True, "oom": seen["oom"]}
    # `misses` is the timed phase's major faults; the whole run's swap-ins also count the
    # checksum that reads every page back after it.
    return {**json.loads(out.stdout), "mode": "zram", "swap_ins": seen["swap_ins"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=16384, help="pages of the program's memory (default 16384: 64 MiB); half stay resident")
    ap.add_argument("--accesses", type=int, default=400000, help="random accesses timed (default 400000)")
    ap.add_argument("--work", default="0,200,1000", help="rounds of arithmetic after each access, comma-separated (default 0,200,1000)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions (default 3)")
    ap.add_argument("--first-touch-mib", type=int, default=256, help="MiB of new memory the first-touch runs touch (default 256)")
    ap.add_argument("--unmap-pages", type=int, default=16384, help="pages each unmap run takes out, five times (default 16384)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"parts to measure, comma-separated, of {', '.join(PARTS)} (default all); "
                    "the others' results are kept from --out")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "pagerfloor.json"))
    ap.add_argument("--no-doc", action="store_true", help="do not write the section of docs/benchmarks.md")
    ap.add_argument("--report", action="store_true", help="measure nothing: write the section again from the JSON at --out")
    args = ap.parse_args()
    if args.report:
        write_report(json.load(open(args.out)), args.no_doc)
        return
    if os.geteuid() != 0:
        sys.exit("pagerfloor.py needs root: a memory cgroup and a swap device")
    parts = set(args.parts.split(","))
    if parts - set(PARTS):
        sys.exit(f"unknown parts {sorted(parts - set(PARTS))}: the parts are {', '.join(PARTS)}")
    res = json.load(open(args.out)) if parts != set(PARTS) and os.path.exists(args.out) else {}
    res.update({"machine": machine()})
    res.setdefault("load_before", {}).update({p: os.getloadavg()[0] for p in parts})
    if "pager" in parts:
        res.update({"pages": args.pages, "accesses": args.accesses, "runs": {}})
    if "first-touch" in parts:
        res.update({"first_touch_mib": args.first_touch_mib, "first_touch": {}})
    if "unmap" in parts:
        res.update({"unmap_pages": args.unmap_pages, "unmap": {}})
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(tmp)
        touch = build(tmp, FIRST_TOUCH_SRC, "firsttouch")
        unmapper = build(tmp, UNMAP_SRC, "unmap")
        # What a cgroup charges the program beyond its pages (code, stack, page tables), added
        # to Linux's limit as the pagers keep it outside the resident pages.
        local = suite.local_footprint_bytes([exe, "native", str(args.pages), str(args.pages // 2), "1000", "0"], None)
        res["local_footprint_bytes"] = local
        for rep in range(args.reps):
            for work in [int(w) for w in args.work.split(",")] if "pager" in parts else []:
                native_sum = None
                for mode in MODES:
                    r = run(exe, mode, args.pages, args.accesses, work, local)
                    if mode == "native":
                        native_sum = r["sum"]
                    elif "sum" in r and r["sum"] != native_sum:
                        sys.exit(f"{mode} at {work}: memory differs from the native run's ({r['sum']} against {native_sum})")
                    res["runs"].setdefault(f"{work}", {}).setdefault(mode, []).append(r)
            for mode in FIRST_TOUCH if "first-touch" in parts else []:
                res["first_touch"].setdefault(mode, []).append(first_touch(touch, mode, args.first_touch_mib))
            for how in UNMAP_HOW if "unmap" in parts else []:
                for where in UNMAP_WHERE:
                    res["unmap"].setdefault(f"{how} {where}", []).append(unmap(unmapper, how, where, args.unmap_pages))
            print(f"repetition {rep + 1} of {args.reps} done", file=sys.stderr, flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    json.dump(res, open(args.out, "w"), indent=2)
    write_report(res, args.no_doc)


def write_report(res, no_doc):
    publish("pagerfloor", "scripts/bench/pagerfloor.py", ["## Paging floor", "", *report(res)], no_doc)


def report(res):
    lines = [f"Machine: {suite_machine(res)}."]
    if res.get("runs"):
        lines += [""] + pager_report(res)
    if res.get("first_touch"):
        lines += ["", *first_touch_report(res)]
    if res.get("unmap"):
        lines += ["", *unmap_report(res)]
    return lines


def pager_report(res):
    lines = [f"{res['pages']:,} pages, half resident, {res['accesses']:,} random "
             f"read-modify-writes timed; medians of {len(next(iter(res['runs'].values()))['native'])} interleaved runs (min-max of the per-miss figure). Configurations:", ""]
    lines += [f"- `{m}`: {what}" for m, what in MODES.items()]
    lines += ["", "| arithmetic per access | configuration | s | misses (swap-ins) | µs over native per miss | time over zram |", "|---|---|---|---|---|---|"]
    for work, by in res["runs"].items():
        nat = statistics.median(r["s"] for r in by["native"])
        zram_ok = not any(r.get("failed") for r in by["zram"])
        zram = statistics.median(r["s"] for r in by["zram"]) if zram_ok else None
        for mode in MODES:
            rs = by.get(mode)
            if not rs:
                continue
            if any(r.get("failed") for r in rs):
                lines.append(f"| {work} | {mode} | failed | | | |")
                continue
            s = statistics.median(r["s"] for r in rs)
            per = [(r["s"] - nat) / r["misses"] * 1e6 for r in rs if r["misses"]]
            per_s = f"{statistics.median(per):.1f} ({min(per):.1f}-{max(per):.1f})" if per else ""
            over = f"{s / zram:.2f}" if zram and mode != "native" else ""
            misses = f"{statistics.median(r['misses'] for r in rs):,.0f}" if mode != "native" else ""
            lines.append(f"| {work} | {mode} | {s:.3f} | {misses} | {per_s} | {over} |")
    per = {m: statistics.median(per_miss(res, m)) for m in ("zram", "inline", "samecpu", "sigbus")}
    lines += ["", f"Per miss, over all arithmetic: zram {per['zram']:.1f} µs, the pager on the faulting CPU {per['samecpu']:.1f} µs "
              f"({per['samecpu'] / per['zram']:.2f}x), from another CPU {per['inline']:.1f} µs ({per['inline'] / per['zram']:.2f}x), "
              f"in the faulting thread {per['sigbus']:.1f} µs ({per['sigbus'] / per['zram']:.2f}x). A pager that any program can run "
              "under cannot take the last (a system call that reads into a missing page fails instead of waiting: "
              "[excache.md](excache.md#fault-delivery)), so the faulting-CPU figure is what a userfaultfd pager pays on this "
              "machine for a miss that copies nothing over a network and keeps no books; splitos's own per miss is in the "
              "focus section."]
    return lines


def first_touch_report(res):
    ft = res["first_touch"]
    pages = ft["anon"][0]["pages"]
    us = {m: [r["s"] / r["pages"] * 1e6 for r in rs] for m, rs in ft.items()}
    med = {m: statistics.median(v) for m, v in us.items()}
    lines = [f"First touches: one write to each page of {res['first_touch_mib']} MiB ({pages:,} pages) of new memory, in order, "
             f"timed by the program (scripts/bench/firsttouch.c); medians of {len(ft['anon'])} interleaved runs. Configurations:", ""]
    lines += [f"- `{m}`: {what}" for m, what in FIRST_TOUCH.items()]
    lines += ["", "| configuration | µs per page (min-max) | over anonymous memory | traps |", "|---|---|---|---|"]
    for m in FIRST_TOUCH:
        traps = f"{statistics.median(r['faults'] for r in ft[m]):,.0f}" if m == "uffd" else ""
        lines.append(f"| {m} | {med[m]:.2f} ({min(us[m]):.2f}-{max(us[m]):.2f}) | {med[m] / med['anon']:.2f} | {traps} |")
    lines += ["", f"A heap that a pager can read and punch is a shared memfd, whose pages the kernel fills at "
              f"{med['shmem'] / med['anon']:.2f}x the cost of anonymous memory; a pager that fills a window per trap "
              f"pays {med['uffd'] / med['anon']:.2f}x, and splitos {med['splitos'] / med['uffd']:.2f}x that pager. A program "
              "that does little but touch new memory "
              f"{'cannot' if med['uffd'] / med['anon'] > 1.05 else 'can'} come within 1.05x of native under a userfaultfd "
              "pager of a memfd on this machine."]
    return lines


def unmap_report(res):
    um = res["unmap"]
    med = {k: statistics.median(r["us_per_page"] for r in rs) for k, rs in um.items()}
    reps = len(next(iter(um.values())))
    lines = [f"Taking pages out of a program: a pager process takes each of {res['unmap_pages']:,} written pages of a program's "
             f"shared memfd out of its page tables, five times, timed (scripts/bench/unmap.c); medians of {reps} interleaved runs "
             "(min-max), µs per page. How:", ""]
    lines += [f"- `{h}`: {what}" for h, what in UNMAP_HOW.items()]
    lines += ["", "| how | " + " | ".join(f"{w}: {what}" for w, what in UNMAP_WHERE.items()) + " |", "|---|---|---|"]
    for h in UNMAP_HOW:
        cells = []
        for w in UNMAP_WHERE:
            v = [r["us_per_page"] for r in um[f"{h} {w}"]]
            cells.append(f"{med[f'{h} {w}']:.2f} ({min(v):.2f}-{max(v):.2f})")
        lines.append(f"| {h} | " + " | ".join(cells) + " |")
    lines += ["", f"A page taken out of a program that runs on the other CPU costs {med['pageout other']:.1f} µs (sampling's unmap) and "
              f"{med['punch other']:.1f} µs (an eviction's punch), against {med['pageout waits']:.1f} and {med['punch waits']:.1f} "
              "while it waits: each flushes the other CPU's TLB with an interrupt, and 32 scattered pages in one call flush "
              f"one by one, as reclaim's path flushes a dirty page before it tries to write it ({med['pageout-run other']:.1f} µs a "
              f"page even for neighbours); a punch of 32 neighbours shares one flush ({med['punch-run other']:.2f} µs a page). The kernel's "
              "reclaim batches the flushes of 32 scattered pages in one interrupt, and reads and clears a page's accessed "
              "bit without a flush at all (x86), so it can look at every page it might evict. A pager in user space sees a "
              "read only by taking the page out and finding it mapped again, and a victim it takes out while a thread of "
              "the program runs elsewhere costs it an interrupt."]
    return lines


def per_miss(res, mode):
    """Every run's µs over its work's native median per miss, for `mode`."""
    out = []
    for by in res["runs"].values():
        if any(r.get("failed") for r in by.get(mode, [])):
            continue
        nat = statistics.median(r["s"] for r in by["native"])
        out += [(r["s"] - nat) / r["misses"] * 1e6 for r in by.get(mode, []) if r.get("misses")]
    return out


def suite_machine(res):
    m = res["machine"]
    loads = ", ".join(f"{load:.2f} before the {part} runs" for part, load in res["load_before"].items())
    return f"{m.get('cores')} vCPUs ({m.get('cpu')}), {m.get('memory_mib')} MiB, Linux {m.get('kernel')}; load {loads}"


if __name__ == "__main__":
    main()
