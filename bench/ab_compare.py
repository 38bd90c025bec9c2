#!/usr/bin/env python3
"""Same-run A/B of MoE layer builds from bench_moe JSON files (scripts/ab_moe.sh writes them).

    python3 bench/ab_compare.py DIR [--base NAME] [--builds A,B,...] [--json OUT.json]

DIR holds <build>_<round>.json files, one bench_moe --json per build and round, run alternating
(round 1 of every build, then round 2, ...), so that a drift of the GPU's clocks or temperature hits
every build alike. Per (shape, T) it prints the base build's best round in µs, each other build's
best round over the base's best (the figure the performance log records), and each build's own
round spread (max / min over its rounds). The run's noise is the largest round spread of any build
at any point; a ratio further from 1 than that is marked '*': a change the noise of this run does
not explain (with two rounds a point's own spread is too small a sample to judge by). Where the
run-wide noise is set by one erratic point, a ratio not marked '*' is marked '<' or '>' when each
build has at least three rounds and every round of the build is faster (slower) than every round of
the base: with three rounds each, noise alone orders them so in one case of ten. --builds names the builds
and their column order (default: every build with results, base first); a named build without
results gets dashes and a note. With --json it writes
{"base", "builds", "rounds", "noise", "points": [{"shape", "tokens", "us": {build: [rounds]},
"ratio": {build: r}, "beyond_noise": {build: bool}, "separated": {build: -1, 0 or 1}}], "clocks": {build: {round: {...}}}}.
Where DIR also holds runs.txt ("build round start end", epoch seconds) and clocks.csv (nvidia-smi
--query-gpu=timestamp,clocks.sm,power.draw,... --format=csv,noheader,nounits), both written by
scripts/ab_moe.sh, the table ends with each run's median and lowest SM clock and highest power.
Standard library only.
"""
import argparse
import json
import os
import re
import statistics
import sys
import time

NAME = re.compile(r"^(?P<build>[A-Za-z0-9][A-Za-z0-9.-]*)_(?P<round>\d+)\.json$")


def load_runs(directory):
    """{build: {round: {(shape, tokens): us}}} from DIR/<build>_<round>.json."""
    runs = {}
    for name in sorted(os.listdir(directory)):
        m = NAME.match(name)
        if not m:
            continue
        with open(os.path.join(directory, name)) as f:
            rows = json.load(f).get("rows", [])
        points = {(r["shape"], int(r["tokens"])): float(r["us"]) for r in rows if isinstance(r.get("us"), (int, float))}
        runs.setdefault(m["build"], {})[int(m["round"])] = points
    return runs


def clock_samples(path):
    """[(epoch seconds, SM MHz, watts or None)] from nvidia-smi's csv,noheader,nounits lines; its
    timestamps are the machine's local time, as `date +%s` in runs.txt is."""
    samples = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        stamp, _, frac = parts[0].partition(".")
        try:
            t = time.mktime(time.strptime(stamp, "%Y/%m/%d %H:%M:%S")) + float("0." + (frac or "0"))
            mhz = float(parts[1])
        except ValueError:
            continue
        try:
            watts = float(parts[2])
        except ValueError:
            watts = None
        samples.append((t, mhz, watts))
    return samples


def clock_summary(directory):
    """{build: {round: {"sm_mhz_median", "sm_mhz_min", "power_w_max", "samples"}}} for the runs in
    DIR/runs.txt with samples in DIR/clocks.csv; {} without those files."""
    runs_path, clocks_path = os.path.join(directory, "runs.txt"), os.path.join(directory, "clocks.csv")
    if not (os.path.exists(runs_path) and os.path.exists(clocks_path)):
        return {}
    samples = clock_samples(clocks_path)
    out = {}
    for line in open(runs_path):
        parts = line.split()
        if len(parts) != 4:
            continue
        build, rnd, t0, t1 = parts[0], int(parts[1]), float(parts[2]), float(parts[3])
        seg = [s for s in samples if t0 <= s[0] <= t1]
        if not seg:
            continue
        watts = [s[2] for s in seg if s[2] is not None]
        out.setdefault(build, {})[rnd] = {"sm_mhz_median": statistics.median(s[1] for s in seg),
                                          "sm_mhz_min": min(s[1] for s in seg),
                                          "power_w_max": max(watts) if watts else None, "samples": len(seg)}
    return out


def print_clocks(clocks, builds, out=sys.stdout):
    if not clocks:
        return
    print("SM clock per run (median / lowest MHz, highest W):", file=out)
    for b in builds:
        runs = clocks.get(b, {})
        cells = [f"r{r} {c['sm_mhz_median']:.0f}/{c['sm_mhz_min']:.0f}"
                 + (f" {c['power_w_max']:.0f} W" if c["power_w_max"] is not None else "") for r, c in sorted(runs.items())]
        print(f"  {b:12s} " + ("; ".join(cells) if cells else "no samples"), file=out)


def compare(runs, base, builds=None):
    """Rows of the comparison: one per (shape, T) the base build measured, in the base's order."""
    if base not in runs:
        raise ValueError(f"--base: no {base}_<round>.json among the builds {sorted(runs)}")
    others = [b for b in (builds or sorted(runs)) if b != base]
    keys = sorted({k for rnd in runs[base].values() for k in rnd})
    points = []
    for key in keys:
        us = {b: [runs[b][r][key] for r in sorted(runs.get(b, {})) if key in runs[b][r]] for b in [base] + others}
        if not us[base]:
            continue
        best = {b: min(v) for b, v in us.items() if v}
        spread = {b: max(v) / min(v) for b, v in us.items() if v}
        ratio = {b: best[b] / best[base] for b in others if b in best}
        points.append({"shape": key[0], "tokens": key[1], "us": us, "ratio": ratio, "spread": spread})
    noise = max((sp - 1.0 for p in points for sp in p["spread"].values()), default=0.0)
    for p in points:
        p["beyond_noise"] = {b: abs(r - 1.0) > noise for b, r in p["ratio"].items()}
        p["separated"] = {b: separated(p["us"][b], p["us"][base]) for b in p["ratio"]}
    return others, points, noise


def separated(build, base, min_rounds=3):
    """-1 if every round of build beat every round of base, 1 if every one lost, else 0."""
    if len(build) < min_rounds or len(base) < min_rounds:
        return 0
    if max(build) < min(base):
        return -1
    if min(build) > max(base):
        return 1
    return 0


def print_table(base, others, points, noise, out=sys.stdout):
    head = f"{'shape':24s} {'T':>6s} {base + ' us':>12s} {'spread':>7s}"
    for b in others:
        head += f" {b + '/' + base:>14s} {'spread':>7s}"
    print(head, file=out)
    for p in points:
        line = f"{p['shape']:24s} {p['tokens']:6d} {min(p['us'][base]):12.1f} {p['spread'][base]:7.3f}"
        for b in others:
            if b in p["ratio"]:
                mark = "*" if p["beyond_noise"][b] else {-1: "<", 0: " ", 1: ">"}[p["separated"][b]]
                line += f" {p['ratio'][b]:13.3f}{mark} {p['spread'][b]:7.3f}"
            else:
                line += f" {'-':>14s} {'-':>7s}"
        print(line, file=out)
    print(f"best round over {base}'s best round; spread = a build's max / min over its rounds; "
          f"* = further from 1 than the run's noise, the largest spread ({noise:.1%}); "
          f"< / > = every round faster / slower than every round of {base} (3+ rounds each)", file=out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="folder of <build>_<round>.json bench_moe results")
    ap.add_argument("--base", default="base", help="the build the others are divided by (default: base)")
    ap.add_argument("--builds", help="the builds, comma-separated, in column order (default: all with results)")
    ap.add_argument("--json", help="write the comparison here")
    a = ap.parse_args(argv)
    builds = [b for b in a.builds.split(",") if b] if a.builds else None
    runs = load_runs(a.dir)
    if not runs:
        print(f"ab_compare: no <build>_<round>.json in {a.dir}", file=sys.stderr)
        return 2
    try:
        others, points, noise = compare(runs, a.base, builds)
    except ValueError as e:
        print(f"ab_compare: {e}", file=sys.stderr)
        return 2
    print_table(a.base, others, points, noise)
    for b in others:
        if b not in runs:
            print(f"no results for build {b}")
    clocks = clock_summary(a.dir)
    print_clocks(clocks, [a.base] + others)
    if a.json:
        rounds = {b: sorted(r) for b, r in runs.items()}
        with open(a.json, "w") as f:
            json.dump({"base": a.base, "builds": [a.base] + others, "rounds": rounds, "noise": noise,
                       "points": [{k: v for k, v in p.items() if k != "spread"} for p in points],
                       "clocks": clocks}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
