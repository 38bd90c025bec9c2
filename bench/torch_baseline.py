#!/usr/bin/env python3
"""Torch BF16 baseline of the MoE layer and the ceilings, measured in the same run as mxmoe.

For each model shape and token count: BF16 expert weights, routing (the model's kind),
token-expert pairs sorted by expert, torch._grouped_mm for both GEMMs with the activation
between them, routing-weighted index_add combine -- the whole layer captured in a CUDA graph,
L2 flushed before each replay, median of N replays. Also measures the two ceilings:
device copy bandwidth (bytes read + written) and a sustained bf16 8192^3 matmul rate.

    python3 bench/torch_baseline.py --json OUT.json [--shapes ...] [--tokens 1,8,...]
"""
import argparse
import json
import statistics
import sys

import torch

SHAPES = {
    # name: (E, H, I, k, routing, activation)   (docs/models.md)
    "gpt-oss-120b": (128, 2880, 2880, 4, "topk_softmax", "swiglu_clamped"),
    "qwen3-30b-a3b": (128, 2048, 768, 8, "softmax_topk", "silu_mul"),
    "kimi-k2": (384, 7168, 2048, 8, "sigmoid_topk", "silu_mul"),
    # grouped routing simplified to plain sigmoid top-k: its cost is negligible next to the GEMMs
    "deepseek-v3": (256, 7168, 2048, 8, "sigmoid_topk", "silu_mul"),
    "gpt-oss-20b": (32, 2880, 2880, 4, "topk_softmax", "swiglu_clamped"),
    "deepseek-v4-flash-like": (256, 4096, 2048, 6, "softmax_topk", "silu_mul"),
}


def timed(fn, iters, flush):
    start = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        if flush is not None:
            flush.zero_()
        start[i].record()
        fn(i)
        end[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in zip(start, end)]  # microseconds


def copy_tbps():
    n = 1 << 30
    a = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(5):
        b.copy_(a)
    t = timed(lambda i: b.copy_(a), 20, None)
    return 2 * n / (statistics.median(t) * 1e-6) / 1e12


def bf16_tflops():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):
        torch.mm(a, b, out=c)
    reps = 50  # sustained: ~60 ms of back-to-back products, as a layer stack would see
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        torch.mm(a, b, out=c)
    e.record()
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (s.elapsed_time(e) * 1e-3) / 1e12


def make_layer(E, H, I, k, routing, act):
    g = torch.Generator(device="cuda").manual_seed(0)
    w13 = (torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02)
    w2 = (torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02)
    # _grouped_mm wants mat_b [E, K, N]; a transposed view keeps K contiguous (the fast layout)
    w13_t, w2_t = w13.transpose(1, 2), w2.transpose(1, 2)
    bias = torch.randn(E, device="cuda") * 0.1

    def forward(x, logits):
        T = x.shape[0]
        if routing == "topk_softmax":
            vals, ids = torch.topk(logits, k, dim=-1)
            wts = torch.softmax(vals, dim=-1)
        elif routing == "softmax_topk":
            p = torch.softmax(logits, dim=-1)
            wts, ids = torch.topk(p, k, dim=-1)
            wts = wts / wts.sum(-1, keepdim=True)
        else:
            s = torch.sigmoid(logits)
            _, ids = torch.topk(s + bias, k, dim=-1)
            wts = torch.gather(s, 1, ids)
            wts = wts / wts.sum(-1, keepdim=True) * 2.827  # Kimi-K2's factor; its value does not move the timing
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(E, device="cuda", dtype=torch.int32).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        token = order // k
        xs = x[token]
        h = torch._grouped_mm(xs, w13_t, offs=offs)
        gate, up = h[:, :I], h[:, I:]
        if act == "swiglu_clamped":
            gate = gate.clamp(max=7.0)
            up = up.clamp(-7.0, 7.0)
            a = gate * torch.sigmoid(1.702 * gate) * (up + 1)
        else:
            a = torch.nn.functional.silu(gate) * up
        y = torch._grouped_mm(a, w2_t, offs=offs)
        y = y * wts.flatten()[order].unsqueeze(1).to(y.dtype)
        out = torch.zeros(T, H, device="cuda", dtype=torch.float32)
        out.index_add_(0, token, y.float())
        return out.to(torch.bfloat16)

    return forward


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default="1,8,32,64,128,512,2048,8192,16384")
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    res["copy_tbps"] = copy_tbps()
    res["bf16_tflops"] = bf16_tflops()
    print(f"torch {torch.__version__} on {res['gpu']}: copy {res['copy_tbps']:.2f} TB/s, "
          f"bf16 mm {res['bf16_tflops']:.0f} TFLOP/s", flush=True)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    rows, failed = [], []  # failed: the points that raised (e.g. out of memory), with the error
    sets = 4
    for name in a.shapes.split(","):
        E, H, I, k, routing, act = SHAPES[name]
        fwd = make_layer(E, H, I, k, routing, act)
        for T in [int(t) for t in a.tokens.split(",")]:
            try:
                xs = [torch.randn(T, H, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
                ls = [torch.randn(T, E, device="cuda") for _ in range(sets)]
                graphs = []
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for i in range(sets):
                        fwd(xs[i], ls[i])  # warm-up outside capture
                torch.cuda.current_stream().wait_stream(s)
                for i in range(sets):
                    gr = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(gr):
                        fwd(xs[i], ls[i])
                    graphs.append(gr)
                for gr in graphs:
                    gr.replay()
                t = timed(lambda i: graphs[i % sets].replay(), a.iters, flush)
                us = statistics.median(t)
                del graphs
            except Exception as e:  # report, keep going: the summary shows the point as missing, with why
                print(f"{name} T={T}: torch baseline failed: {e}", file=sys.stderr, flush=True)
                why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                failed.append({"shape": name, "tokens": T, "error": why[:160]})
                continue
            rows.append({"shape": name, "tokens": T, "us": us})
            print(f"torch bf16 {name:14s} T={T:6d} {us:10.1f} us", flush=True)
        del fwd
        torch.cuda.empty_cache()
    res["rows"] = rows
    res["failed"] = failed
    with open(a.json, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
