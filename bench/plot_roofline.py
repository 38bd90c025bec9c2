#!/usr/bin/env python3
"""Roofline plot of a bench_moe JSON: time per layer vs tokens, per shape, with the floor
(max of the bandwidth and bf16 compute limits measured in the same run) and the torch BF16
baseline.   python3 bench/plot_roofline.py RESULTS.json OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    src, dst = sys.argv[1], sys.argv[2]
    data = json.load(open(src))
    shapes = sorted({r["shape"] for r in data["rows"]})
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4.5), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        rows = sorted((r for r in data["rows"] if r["shape"] == shape), key=lambda r: r["tokens"])
        t = [r["tokens"] for r in rows]
        ax.plot(t, [r["us"] for r in rows], "o-", label="mxmoe W4A16 (MXFP4)")
        ax.plot(t, [r["floor_us"] for r in rows], "k--", label="MXFP4 floor")
        tb = [(r["tokens"], r["torch_bf16_us"]) for r in rows if r.get("torch_bf16_us")]
        if tb:
            ax.plot(*zip(*tb), "s:", label="torch BF16 grouped_mm")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens T")
        ax.set_ylabel("µs per layer")
        ax.set_title(shape)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    bf16 = data.get("bf16_tflops")
    fig.suptitle(f"{data['gpu']} — copy {data['copy_tbps']:.2f} TB/s, bf16 "
                 f"{bf16:.0f} TFLOP/s — commit {data['commit']} — {data['date']}" if bf16 else data["gpu"])
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main()
