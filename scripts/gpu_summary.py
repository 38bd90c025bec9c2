#!/usr/bin/env python3
"""Short summary table of a scripts/gpu_all.sh run: test counts, sanitizer verdicts,
quantize throughput and the MoE layer against its floor, the torch BF16 baseline and the peer
(bench/peer_triton.py: peer µs and mxmoe/peer per point, or why the peer did not run)."""
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
    peer = m.get("peer")
    p = load("peer.json") or {}
    peer_rows = {(r["shape"], r["tokens"]): r for r in p.get("rows", [])}
    print(f"  {'shape':14s} {'T':>6s} {'us':>9s} {'floor%':>7s} {'torch_us':>9s} {'vs torch':>8s} {'peer_us':>9s} "
          f"{'mx/peer':>7s} {'TFLOP/s':>8s}")
    tj = load("torch.json")
    torch_failed = {(r["shape"], r["tokens"]): r.get("error", "?") for r in (tj or {}).get("failed", [])}
    missing, torch_missing = [], []
    for r in m["rows"]:
        tu, pu = r.get("torch_bf16_us"), r.get("peer_us")
        print(f"  {r['shape']:14s} {r['tokens']:6d} {r['us']:9.1f} {100 * r['floor_us'] / r['us']:6.0f}% "
              + (f"{tu:9.1f} {tu / r['us']:7.2f}x " if tu else f"{'-':>9s} {'-':>8s} ")
              + (f"{pu:9.1f} {r['us'] / pu:7.2f}" if pu else f"{'-':>9s} {'-':>7s}") + f" {r['tflops']:8.1f}")
        if peer and not pu:
            why = peer_rows.get((r["shape"], r["tokens"]), {}).get("error", "no peer result for this point")
            missing.append(f"{r['shape']} T={r['tokens']}: {why}")
        if tj is not None and not tu:
            torch_missing.append(f"{r['shape']} T={r['tokens']}: "
                                 + torch_failed.get((r["shape"], r["tokens"]), "no torch result for this point"))
    if tj is None and not any(r.get("torch_bf16_us") for r in m["rows"]):
        print("  torch BF16 baseline not measured in this run (no torch.json)")
    for line in torch_missing:
        print(f"  torch did not run at {line}")
    if peer:
        print(f"  peer: {peer.get('name', '?')}, {peer.get('version', '?')}; mx/peer = mxmoe us / peer us")
        rel = [(r["rel_l2"], r["shape"], r["tokens"]) for r in p.get("rows", []) if r.get("rel_l2") is not None]
        if rel:
            worst = max(rel)
            print(f"  peer rel-L2 vs the float64 reference: max {worst[0]:.2e} ({worst[1]} T={worst[2]}) over "
                  f"{len(rel)} points (a subset of tokens, see bench/peer_triton.py)")
        for line in missing:
            print(f"  peer did not run at {line}")
        if p and not p.get("complete", True):
            print("  peer run incomplete: it was cut short (see log.txt)")
    else:
        print(f"  peer did not run: {m.get('peer_reason') or p.get('reason') or 'no peer in this run'}")
elif load("peer.json"):
    p = load("peer.json")
    print("peer without the MoE benchmark (no bench_moe.json in this run):")
    if not p.get("available"):
        print(f"  peer did not run: {p.get('reason', '?')}")
    for r in p.get("rows", []):
        print(f"  {r['shape']:22s} {r['tokens']:6d} " + (f"{r['us']:9.1f} us" if "us" in r else f"failed: {r.get('error')}"))
cv = load("convert.json")
if cv:
    print(f"checkpoint conversion ({cv['file_bytes'] / 1e9:.2f} GB BF16, cat {cv['read_gb_s']:.2f} GB/s):")
    for r in cv.get("runs", []):
        print(f"  quantize --device {r['device']:4s} exit {r['exit_code']}: {r['wall_s']:7.2f} s, "
              f"{r['wall_gb_s']:.2f} GB/s ({100 * r['vs_read']:.0f}% of read), peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB")
py = load("python.json")
if py:
    counts = py.get("tests", {}).get("counts", {})
    print(f"Python on the GPU: {py.get('status')}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    for f in py.get("tests", {}).get("failures", []):
        print(f"  FAILED {f['test']}")
    o = py.get("overhead", {})
    if "us_per_call" in o:
        print(f"  overhead T=1: C++ call {o['us_per_call']['cxx']:.2f} us; added " +
              ", ".join(f"{k} {v:+.2f}" for k, v in o["added_us"].items()) + " us")
    else:
        print(f"  overhead: {o.get('skipped') or 'failed, see python.log'}")
