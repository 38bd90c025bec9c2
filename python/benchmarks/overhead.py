#!/usr/bin/env python3
"""Host time per MoE forward through each Python path, against the bare C++ call, in one run.

    python python/benchmarks/overhead.py --device cuda --tokens 1     # on the GPU machine
    python python/benchmarks/overhead.py --device cpu --tokens 0      # CPU: T = 0 (no work)

Every path is timed the same way: batches of --iters calls (no synchronization inside a batch;
the device is synchronized before and after each), --repeats rounds, each round one batch of every
path in turn, the median per call. On CUDA that is the time to enqueue a forward; batches stay
short so that the GPU never holds the host back (--iters * kernels per forward is far below the
launch queue's depth). "added" is the median over the rounds of (path - cxx) in the same round:
the GPU machine's host drifts by several microseconds between leases and within one (2026-12-05:
torch's empty op 2.1 us in one lease, 3.6-4.2 in others), and timing the paths one after another
let that drift land on one path only.
  cxx         mxmoe::moe_forward called from a C++ loop (mxmoe_moe_forward_timed): the library
  c_abi       mxmoe_moe_forward through ctypes with every argument prepared beforehand
  hotpath     the extension's forward (mxmoe._hotpath.moe_forward) called directly, out and
              workspace given: the tensors read, the stream queried, the GIL released
  direct      mxmoe.moe_forward(layer, x, logits=..., out=..., workspace=...): plus its Python frame
  alloc       mxmoe.moe_forward(layer, x, logits=...): plus allocating out (CUDA: and the
              workspace the layer keeps for the stream, looked up)
  torch_noop  an empty operator of moe_forward's schema, defined and called the same way (its
              kernel, registered from Python, returns a preallocated tensor): what torch.library
              dispatch of a Python-registered kernel itself costs
  torch_op_py the same op with the kernel registered from Python as mxmoe.torch does without the
              C++ op library (the extension's torch_moe_forward: the alloc path inside dispatch)
  torch_op    mxmoe.torch.moe_forward: torch.ops.mxmoe.moe_forward with the kernel in use, the C++
              one of libmxmoe_torch.so when built (mxmoe.torch.NATIVE_OP; printed)
  torch_op_out mxmoe.torch.moe_forward(..., out=out): torch.ops.mxmoe.moe_forward_out into a
              preallocated output (no allocation per call)
  graph       CUDA only: one replay of a CUDA graph holding one forward (no Python per forward)
"added" is each path minus cxx: what Python adds to a forward; the target is <= 5 us for direct,
torch_op and torch_op_out on the GPU machine at T = 1; "ours" is torch_op minus torch_noop minus cxx (what mxmoe
adds inside the operator over an empty Python-registered one; negative when its kernel costs less
than that dispatch). The pieces (one call each, same timing): reading one tensor by the
extension (hotpath.torch_view: one to_dlpack capsule, packed), the same fields read from Python
attributes (the route the ctypes path took), torch.empty_like(x), torch's current-stream query
and torch.empty of the forward's workspace (CUDA: what a forward paid before the layer kept one
per stream). On CUDA it also prints the GPU time of one forward (CUDA events around graph replays). The
layer is synthetic (mxmoe.synthetic_layer) of the --preset shape with --experts experts. Without a
usable GPU, --device cuda prints SKIPPED with the reason (and writes it to --json) and exits 0.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time

import torch

import mxmoe
import mxmoe.torch as mt
from mxmoe import _lib, _tensor

TARGET_US = 5.0


def batch_us(fn, iters: int, sync) -> float:
    """Host time per call of one batch of `iters` calls."""
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    us = (time.perf_counter() - t0) / iters * 1e6
    sync()
    return us


def cxx_batch_us(call_args, iters: int, sync) -> float:
    """The same batch, timed inside the library's C++ loop."""
    seconds = ctypes.c_double()
    sync()
    _lib.check(_lib.lib.mxmoe_moe_forward_timed(*call_args, iters, ctypes.byref(seconds)))
    sync()
    return seconds.value / iters * 1e6


def interleaved_us(timers: dict, repeats: int) -> dict:
    """Per name, the per-call times of `repeats` rounds; a round times every batch once, in turn."""
    samples = {name: [] for name in timers}
    for _ in range(repeats):
        for name, timer in timers.items():
            samples[name].append(timer())
    return samples


def gpu_us_per_forward(graph, n: int = 200) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / n


def _bench_ops(out: torch.Tensor):
    """torch.ops.mxmoe_bench.noop and .moe_forward_py: moe_forward's schema, defined like
    mxmoe.torch defines its ops from Python (Library.define / impl for CPU and CUDA); noop's kernel
    returns ``out``, moe_forward_py's is the extension's torch_moe_forward (the kernel mxmoe.torch
    registers without the C++ op library)."""
    lib = torch.library.Library("mxmoe_bench", "DEF")
    schema = "(Tensor x, Tensor? logits, Tensor? topk_ids, Tensor? topk_weights, int layer) -> Tensor"
    lib.define("noop" + schema)
    lib.define("moe_forward_py" + schema)
    for key in ("CPU", "CUDA"):
        lib.impl("noop", lambda x, logits, topk_ids, topk_weights, layer: out, key)
        lib.impl("moe_forward_py", _lib.hotpath.torch_moe_forward, key)
    _bench_ops.lib = lib  # the registration lives as long as the Library object
    return torch.ops.mxmoe_bench.noop.default, torch.ops.mxmoe_bench.moe_forward_py.default


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--preset", default="gpt-oss-20b")
    p.add_argument("--experts", type=int, default=None, help="E instead of the preset's")
    p.add_argument("--iters", type=int, default=40, help="calls per timed batch")
    p.add_argument("--repeats", type=int, default=51, help="timed batches (the median is reported)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()

    def write(result: dict) -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda and (not mxmoe.cuda.available(dev.index or 0) or not torch.cuda.is_available()):
        why = mxmoe.cuda.why_unavailable(dev.index or 0) or "torch has no usable CUDA device"
        print(f"SKIPPED: overhead on {args.device}: {why}")
        write({"device": args.device, "skipped": why})
        return 0

    weights = mxmoe.synthetic_layer(args.preset, experts=args.experts)
    cfg = weights.config
    layer = weights.prepare(args.device)
    t = args.tokens
    x, logits = mxmoe.synthetic_inputs(weights, t, seed=1)
    x, logits = x.to(dev), logits.to(dev)
    if not cuda:
        x = x.float()
    out = torch.empty_like(x)
    nbytes = layer.workspace_bytes(t)
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=dev)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    views = [_tensor.view(v, "v") for v in (x, logits, out)]
    stream = torch.cuda.current_stream().cuda_stream if cuda else None
    handle, forward = layer._handle, _lib.lib.mxmoe_moe_forward
    call_args = (handle, views[0], views[1], None, None, views[2], ws.data_ptr(), nbytes, stream)
    hot = _lib.hotpath.moe_forward
    noop, op_py = _bench_ops(out)

    def c_abi():
        forward(*call_args)

    paths = {
        "c_abi": c_abi,
        "hotpath": lambda: hot(layer, x, logits, None, None, out, ws, None),
        "direct": lambda: mxmoe.moe_forward(layer, x, logits=logits, out=out, workspace=ws),
        "alloc": lambda: mxmoe.moe_forward(layer, x, logits=logits),
        "torch_noop": lambda: noop(x, logits, None, None, layer.id),
        "torch_op_py": lambda: op_py(x, logits, None, None, layer.id),
        "torch_op": lambda: mt.moe_forward(layer, x, logits=logits),
        "torch_op_out": lambda: mt.moe_forward(layer, x, logits=logits, out=out),
    }
    pieces = {
        "read_tensor": lambda: _tensor.torch_view(x, "x"),
        "read_attributes": lambda: (x.data_ptr(), x.dtype, x.is_cuda, x.shape, x.stride()),
        "empty_like": lambda: torch.empty_like(x),
    }
    if cuda:
        pieces["current_stream"] = lambda: _tensor.current_stream(x, None)
        pieces["empty_workspace"] = lambda: torch.empty(nbytes, dtype=torch.uint8, device=dev)
    graph = None
    if cuda:
        for _ in range(3):
            mt.moe_forward(layer, x, logits=logits)
        sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            mt.moe_forward(layer, x, logits=logits)
        paths["graph"] = graph.replay
    with torch.inference_mode():
        for fn in paths.values():  # warm-up: first calls, the caching allocator
            for _ in range(args.iters):
                fn()
        sync()
        timers = {"cxx": lambda: cxx_batch_us(call_args, args.iters, sync)}
        timers.update({name: (lambda fn=fn: batch_us(fn, args.iters, sync)) for name, fn in paths.items()})
        samples = interleaved_us(timers, args.repeats)
        piece_samples = interleaved_us({name: (lambda fn=fn: batch_us(fn, args.iters, lambda: None))
                                        for name, fn in pieces.items()}, args.repeats)
    results = {name: statistics.median(v) for name, v in samples.items()}
    piece_us = {name: statistics.median(v) for name, v in piece_samples.items()}

    def added_in_rounds(name: str, minus: tuple = ("cxx",)) -> float:
        return statistics.median(
            x - sum(samples[m][r] for m in minus) for r, x in enumerate(samples[name]))

    added = {name: added_in_rounds(name) for name in results if name != "cxx"}
    ours = added_in_rounds("torch_op", ("torch_noop", "cxx"))
    gpu_us = gpu_us_per_forward(graph) if cuda else None
    where = f"{args.device} ({mxmoe.cuda.device_name(dev.index or 0)})" if cuda else "cpu"
    print(f"{where}, T = {t}, {args.preset} E = {cfg.experts}, H = {cfg.hidden}, I = {cfg.intermediate}, "
          f"top-{cfg.top_k}: host time per forward (us), median of {args.repeats} x {args.iters} calls")
    print("  torch_op's kernel: " + ("C++ (libmxmoe_torch.so)" if mt.NATIVE_OP else
                                     f"registered from Python, because {mt.NATIVE_OP_REASON}"))
    for name, us in results.items():
        print(f"  {name:12s} {us:8.2f}" + ("" if name == "cxx" else f"   added {added[name]:+8.2f}"))
    print(f"  torch_op - torch_noop - cxx (mxmoe's part of the op): {ours:+.2f}")
    print("  pieces: " + ", ".join(f"{name} {us:.2f}" for name, us in piece_us.items()))
    if gpu_us is not None:
        print(f"  GPU time of one forward: {gpu_us:.2f} us (CUDA events around graph replays)")
    verdict = {name: added[name] <= TARGET_US for name in ("direct", "torch_op", "torch_op_out")}
    print(f"  target <= {TARGET_US:.0f} us added: " + ", ".join(f"{n} {'met' if ok else 'MISSED'}"
                                                               for n, ok in verdict.items()))
    write({"device": args.device, "gpu": mxmoe.cuda.device_name(dev.index or 0) if cuda else None, "tokens": t,
           "preset": args.preset, "experts": cfg.experts, "hidden": cfg.hidden, "intermediate": cfg.intermediate,
           "iters": args.iters, "repeats": args.repeats, "us_per_call": results, "added_us": added,
           "torch_op_ours_us": ours, "pieces_us": piece_us, "native_op": mt.NATIVE_OP,
           "gpu_us_per_forward": gpu_us, "target_added_us": TARGET_US, "target_met": verdict,
           "python": sys.version.split()[0], "torch": torch.__version__, "mxmoe": mxmoe.__version__})
    return 0


if __name__ == "__main__":
    sys.exit(main())
