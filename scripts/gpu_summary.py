#!/usr/bin/env python3
"""Short summary table of a scripts/gpu_all.sh run: test counts, sanitizer verdicts,
quantize throughput and the MoE layer against its floor and the torch BF16 baseline."""
import json
import os
import re
import sys

out = sys.argv[1]


def load(name):
    p = os.path.join(out, name)
    return json.load(open(p)) if os.path.exists(p) else None


print("\n================ mxmoe GPU summary ================")
t = load("gpu_tests.json")
if t:
    print(f"GPU tests: {t['tests'] - t['failures'] - t.get('disabled', 0)} passed, {t['failures']} failed "
          f"({t['tests']} total)")
    for s in t["testsuites"]:
        for c in s["testsuite"]:
            if c.get("failures"):
                print(f"  FAILED {s['name']}.{c['name']}")
log = open(os.path.join(out, "log.txt")).read() if os.path.exists(os.path.join(out, "log.txt")) else ""
for tool in ("memcheck", "racecheck"):
    m = re.search(rf"sanitizer {tool} exit (\d+)", log)
    if m:
        part = log.split(f"compute-sanitizer {tool}")[-1]
        errs = re.findall(r"(?:ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error)", part)
        errs = [a or b for a, b in errs]
        print(f"compute-sanitizer {tool}: exit {m.group(1)}, errors {errs[-1] if errs else '?'}")
q = load("bench_quantize.json")
if q:
    print(f"quantize / dequantize, {q.get('input', '?')} input (copy {q.get('copy_tbps', 0):.2f} TB/s), >= 256 MiB:")
    print(f"  {'op':10s} {'rule':6s} {'scales':12s} {'stats':5s} {'MiB':>6s} {'us':>9s} {'GB/s':>7s} {'of copy':>8s}")
    for r in q.get("rows", []):
        if r.get("mib_in", 0) >= 256:
            print(f"  {r['op']:10s} {r['rule']:6s} {r['layout']:12s} {r.get('stats', '-'):5s} {r['mib_in']:6.0f} "
                  f"{r['us']:9.1f} {r['gbps']:7.0f} {100 * r['frac_copy']:7.1f}%")
m = load("bench_moe.json")
if m:
    print(f"MoE layer ({m['gpu']}, copy {m['copy_tbps']:.2f} TB/s, bf16 {m.get('bf16_tflops') or 0:.0f} TFLOP/s):")
    print(f"  {'shape':14s} {'T':>6s} {'us':>9s} {'floor%':>7s} {'torch_us':>9s} {'vs torch':>8s} {'TFLOP/s':>8s}")
    for r in m["rows"]:
        tu = r.get("torch_bf16_us")
        print(f"  {r['shape']:14s} {r['tokens']:6d} {r['us']:9.1f} {100 * r['floor_us'] / r['us']:6.0f}% "
              f"{tu or 0:9.1f} {(tu / r['us']) if tu else 0:7.2f}x {r['tflops']:8.1f}")
