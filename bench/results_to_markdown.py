#!/usr/bin/env python3
"""Markdown tables for docs/performance.md from bench_moe and/or bench_quantize JSON files:
python3 bench/results_to_markdown.py [MOE.json] [QUANTIZE.json] ..."""
import json
import sys


def moe_table(d):
    print(f"GPU {d['gpu']}, commit {d['commit']}, {d['date']}; ceilings measured in the same run: "
          f"copy {d['copy_tbps']:.2f} TB/s, bf16 matmul {d.get('bf16_tflops') or 0:.0f} TFLOP/s.\n")
    print("| shape | T | touched experts | µs | floor µs | % of floor | torch BF16 µs | speed-up vs torch | TFLOP/s | GB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in d["rows"]:
        t = r.get("torch_bf16_us")
        print(f"| {r['shape']} | {r['tokens']} | {r['touched_experts']:.0f} | {r['us']:.1f} | {r['floor_us']:.1f} | "
              f"{100 * r['floor_us'] / r['us']:.0f}% | {t or float('nan'):.1f} | "
              f"{(t / r['us']) if t else float('nan'):.2f}x | {r['tflops']:.1f} | {r['gbps']:.0f} |")


def quantize_table(q):
    print(f"\n{q['gpu']}, {q.get('input', 'bf16')} input, copy {q['copy_tbps'] * 1000:.0f} GB/s (read + written).\n")
    print("| op | rule | scales | statistics | MiB in | µs | GB/s | of copy | back-to-back µs |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for r in q["rows"]:
        b2b = r.get("us_back_to_back")
        print(f"| {r['op']} | {r['rule']} | {r['layout']} | {r.get('stats', 'yes' if r['op'] == 'quantize' else '-')} | "
              f"{r['mib_in']:.0f} | {r['us']:.1f} | {r['gbps']:.0f} | {100 * r['frac_copy']:.1f}% | "
              f"{b2b if b2b is not None else float('nan'):.1f} |")


if __name__ == "__main__":
    # Each argument is a bench_moe or a bench_quantize JSON (told apart by their rows).
    for path in sys.argv[1:]:
        d = json.load(open(path))
        (quantize_table if d.get("rows") and "rule" in d["rows"][0] else moe_table)(d)
