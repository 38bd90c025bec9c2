#!/usr/bin/env python3
"""Host time per MoE forward through each Python path, against the bare C ABI call.

    python python/benchmarks/overhead.py --device cuda --tokens 1     # on the GPU machine
    python python/benchmarks/overhead.py --device cpu --tokens 0      # CPU: T = 0 (no work)

Times, per call (median of --repeats runs of --iters calls, perf_counter, no synchronization
inside the loop, so on CUDA it is the time to enqueue while the GPU keeps up):
  c_abi      mxmoe_moe_forward through ctypes with every argument prepared beforehand: the C++
             call plus the ctypes call itself
  direct     mxmoe.moe_forward(layer, x, logits=..., out=..., workspace=...): tensor views
  alloc      mxmoe.moe_forward(layer, x, logits=...): plus allocating out (and the workspace)
  torch_op   mxmoe.torch.moe_forward: plus the PyTorch dispatcher (torch.ops.mxmoe.moe_forward)
  graph      CUDA only: one replay of a CUDA graph holding one forward (no Python per forward)
"Added" is each path minus c_abi. The shape is gpt-oss-20b's (E = 32, H = I = 2880, top-4) with
--experts experts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import mxmoe
import mxmoe.torch as mt
from mxmoe import _lib, _tensor


def per_call_us(fn, iters: int, repeats: int, sync) -> float:
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) / iters * 1e6)
        sync()
    return statistics.median(samples)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--hidden", type=int, default=2880)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()

    e, h, i, t = args.experts, args.hidden, args.hidden, args.tokens
    cfg = mxmoe.MoEConfig(e, h, i, routing="topk_softmax", top_k=min(4, e), activation="swiglu_clamped",
                          gate_up="interleaved")
    gu = mxmoe.quantize(torch.randn(e, 2 * i, h, dtype=torch.bfloat16) * 0.02)
    dn = mxmoe.quantize(torch.randn(e, h, i, dtype=torch.bfloat16) * 0.02)
    layer = mxmoe.prepare(cfg, device=args.device, gate_up_blocks=gu[0].view(e, 2 * i, h // 32, 16),
                          gate_up_scales=gu[1], down_blocks=dn[0].view(e, h, i // 32, 16), down_scales=dn[1])
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    x = torch.randn(t, h, device=dev).to(torch.bfloat16 if cuda else torch.float32)
    logits = torch.randn(t, e, device=dev)
    out = torch.empty_like(x)
    ws = torch.empty(max(layer.workspace_bytes(t), 1), dtype=torch.uint8, device=dev)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    views = [_tensor.view(v, "v") for v in (x, logits, out)]
    stream = torch.cuda.current_stream().cuda_stream if cuda else None
    handle, forward = layer._handle, _lib.lib.mxmoe_moe_forward
    nbytes = layer.workspace_bytes(t)

    def c_abi():
        forward(handle, views[0], views[1], None, None, views[2], ws.data_ptr(), nbytes, stream)

    paths = {
        "c_abi": c_abi,
        "direct": lambda: mxmoe.moe_forward(layer, x, logits=logits, out=out, workspace=ws),
        "alloc": lambda: mxmoe.moe_forward(layer, x, logits=logits),
        "torch_op": lambda: mt.moe_forward(layer, x, logits=logits),
    }
    if cuda:
        for _ in range(3):
            mt.moe_forward(layer, x, logits=logits)
        sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            mt.moe_forward(layer, x, logits=logits)
        paths["graph"] = graph.replay
    with torch.inference_mode():
        results = {name: per_call_us(fn, args.iters, args.repeats, sync) for name, fn in paths.items()}
    base = results["c_abi"]
    print(f"{args.device}, T = {t}, E = {e}, H = I = {h}: host time per forward (us)")
    for name, us in results.items():
        print(f"  {name:9s} {us:8.2f}   added {us - base:+8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "tokens": t, "experts": e, "hidden": h, "us_per_call": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
