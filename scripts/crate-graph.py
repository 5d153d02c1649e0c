#!/usr/bin/env python3
"""The workspace's crates and what each depends on of the others, from `cargo metadata`
(normal dependencies), as the table in docs/architecture.md between its crate-graph markers.

    scripts/crate-graph.py           print the table
    scripts/crate-graph.py --write   put it in docs/architecture.md
    scripts/crate-graph.py --check   exit 1 if docs/architecture.md has another (test.sh runs this)

It also fails if the graph has a cycle, which cargo refuses anyway, so that the order it prints
(each crate above everything it depends on) always exists.
"""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- crate-graph: scripts/crate-graph.py --write -->", "<!-- /crate-graph -->"


def graph():
    meta = json.loads(subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1"], cwd=ROOT, check=True, stdout=subprocess.PIPE).stdout)
    names = {p["name"] for p in meta["packages"]}
    return {p["name"]: sorted({d["name"] for d in p["dependencies"] if d["name"] in names and d["kind"] is None}) for p in meta["packages"]}


def layers(deps):
    """Each crate's height: 0 for a crate that depends on none, else one above its highest."""
    height = {}

    def h(name, seen=()):
        if name in seen:
            sys.exit(f"crate-graph: a cycle through {name}")
        if name not in height:
            height[name] = 1 + max((h(d, seen + (name,)) for d in deps[name]), default=-1)
        return height[name]

    for n in deps:
        h(n)
    return height


def table():
    deps = graph()
    height = layers(deps)
    order = sorted(deps, key=lambda n: (-height[n], n))
    rows = ["| crate | depends on (of the workspace) |", "|---|---|"]
    for n in order:
        ds = sorted(deps[n], key=lambda d: (-height[d], d))
        rows.append(f"| `{n}` | {', '.join(f'`{d}`' for d in ds) or 'nothing'} |")
    return "\n".join(rows)


def main():
    t = table()
    if len(sys.argv) == 1:
        print(t)
        return
    doc = DOC.read_text()
    if BEGIN not in doc or END not in doc:
        sys.exit(f"crate-graph: {DOC} has no {BEGIN} ... {END} markers")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{t}\n{END}{tail}"
    if sys.argv[1] == "--write":
        DOC.write_text(new)
    elif sys.argv[1] == "--check":
        if new != doc:
            sys.exit("crate-graph: the crate table in docs/architecture.md is not cargo metadata's; run scripts/crate-graph.py --write")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
