#!/usr/bin/env python3
"""The kernels of one MoE forward and their durations, from an Nsight Compute CSV
(`ncu --csv --print-units base --metrics gpu__time_duration.sum`, as scripts/profile_moe.sh runs it).

    python3 bench/ncu_durations.py PROFILE.csv [--json OUT.json]

The profile holds the layer's kernels in launch order, a forward and the start of the next one:
the forward ends where its first kernel comes again. Prints one line per kernel (name without
namespaces and arguments, µs) and their sum; --json writes {"kernels": [[name, us], ...],
"sum_us": ...}. Exit status 1 when the file holds no duration rows (ncu failed: its message is in
the file).
"""
import argparse
import csv
import json
import re
import sys


def short_name(name):
    """'void unnamed>::route_kernel<4>(const void *, ...)' -> 'route_kernel<4>'."""
    name = re.sub(r"^void ", "", name)
    depth, cut = 0, len(name)
    for i, c in enumerate(name):  # the argument list: the first '(' outside template brackets
        if c == "<":
            depth += 1
        elif c == ">":  # ncu writes an anonymous namespace as "unnamed>::", one '>' unopened
            depth = max(0, depth - 1)
        elif c == "(" and depth == 0:
            cut = i
            break
    name = name[:cut]
    head = name.split("<", 1)
    return head[0].split("::")[-1] + ("<" + head[1] if len(head) > 1 else "")


def first_forward(path):
    rows = [r for r in csv.reader(open(path, newline="")) if r]
    try:
        hdr = next(i for i, r in enumerate(rows) if "Kernel Name" in r and "Metric Value" in r)
    except StopIteration:
        return []
    names = rows[hdr]
    k, m, v = names.index("Kernel Name"), names.index("Metric Name"), names.index("Metric Value")
    kernels = []
    for r in rows[hdr + 1:]:
        if len(r) <= max(k, m, v) or r[m] != "gpu__time_duration.sum":
            continue
        name = short_name(r[k])
        if kernels and name == kernels[0][0]:
            break
        kernels.append((name, float(r[v].replace(",", "")) / 1000.0))
    return kernels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--json")
    a = ap.parse_args()
    kernels = first_forward(a.csv)
    if not kernels:
        print(f"ncu_durations: no kernel durations in {a.csv}", file=sys.stderr)
        return 1
    for name, us in kernels:
        print(f"  {name[:64]:64s} {us:10.1f} us")
    total = sum(us for _, us in kernels)
    print(f"  {'sum':64s} {total:10.1f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"kernels": [[n, round(u, 3)] for n, u in kernels], "sum_us": round(total, 3)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
