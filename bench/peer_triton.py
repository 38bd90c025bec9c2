#!/usr/bin/env python3
"""The MoE benchmark's peer: triton_kernels' matmul_ogs driven as vLLM 0.33.0 drives it on Hopper.

vLLM's default MXFP4 MoE path on sm90 is the monolithic triton_kernels expert
(OAITritonMxfp4ExpertsMonolithic -> triton_kernel_moe_forward in vllm 0.33.0's
model_executor/layers/fused_moe/experts/gpt_oss_triton_kernels_moe.py) on the triton_kernels copy
the wheel bundles (vllm/third_party/triton_kernels, the "3.5.1" API generation: routing.routing,
matmul_ogs). scripts/fetch_peer.sh extracts that copy into .peer/. Per model shape and token count
T this script times that whole layer, bf16 activations x MXFP4 weights:

  routing   router logits bf16 [T, E] -> expert ids, weights, gather/scatter indices
  GEMM1     matmul_ogs(x, W13, b13, gather) with SwiGLU (alpha 1.702, limit 7.0) fused in the epilogue
  GEMM2     matmul_ogs(act, W2, b2, scatter, gammas = routing weights), then the k-way reduction

Weights: bf16 N(0, 0.02) quantized along K by triton_kernels' own downcast_to_mxfp, then converted
as vLLM's _swizzle_mxfp4 does on sm90 (quantization/utils/mxfp4_utils.py): scale groups padded to a
multiple of 4, HopperMXValueLayout / HopperMXScaleLayout (mx_axis=1, num_warps=8), split_k forced to
1. The gpt-oss shapes carry fp32 biases on both GEMMs (vLLM converts them to fp32).

Routing, per kind (include/mxmoe/presets.h gives each shape's kind):
  topk_softmax (gpt-oss) and renormalized softmax_topk (Qwen3, deepseek-v4-flash-like) give the same
    weights; vLLM runs them as triton_kernels.routing.routing(logits, k, sm_first=False): one fused
    top-k + softmax, then the expert sort.
  top_k 6 (deepseek-v4-flash-like): the bundled routing kernels need a power-of-two k (vLLM patches
    them for DeepSeek-V4); here the top-k and softmax run in torch and each token's ids are padded to
    8 with -1 slots, the marker vLLM's expert-parallel path gives matmul_ogs for slots it skips.
  sigmoid_grouped_topk (Kimi-K2, DeepSeek-V3): triton_kernels cannot express it; ids and weights
    come from torch (sigmoid, correction bias, group scores = sum of each group's top 2, best groups,
    top k, renormalize, scaling factor) and are handed over as vLLM's make_routing_data does:
    int16 ids, bf16 weights, a packed bitmatrix, routing_from_bitmatrix.
  Torch-side selection is stable (ties go to the lower expert, as in triton_kernels' top-k).

Where the peer's layer differs from mxmoe's (bench/moe_bench.cu), so that the ratio is read right:
  * SwiGLU-clamped with gate/up interleaved on every shape: it is the activation triton_kernels fuses
    (the only one vLLM's fused path accepts); mxmoe runs silu_mul on the non-gpt-oss shapes. Both
    apply the activation in GEMM1's epilogue, so this changes the arithmetic, not the data moved.
  * Logits are bf16 (the router output vLLM hands over); mxmoe reads f32 logits.
  * Torch routing (grouped kinds, k = 6) adds a few small kernels: `routing_us` times it alone.

Measurement, as bench/moe_bench.cu: per T, 4 input sets (x, logits), one CUDA graph each; the L2
flushed (256 MB memset) before each timed replay; median of --iters replays rotating over the sets.
`do_bench_us`: triton.testing.do_bench's median for replaying set 0 (it flushes L2 itself).

Accuracy: rel-L2 of the output against a float64 torch reference that shares nothing with the code
under test but the inputs: the checkpoint-layout MXFP4 codes and scales decoded by the OCP MX
definition (not the kernels' upcast, not the Hopper layouts), routing in float64 with the semantics
of src/cpu/routing.cpp (tokens whose selection is within 1e-5 of a tie are left out and counted),
SwiGLU, biases, the k-way sum. To stay cheap the reference covers a fixed set of tokens (the first 8
and 40 spread over the largest T); every T is sliced from the same inputs, so each T is checked on
the tokens of that set below T (T = 1: one token; T >= 48: 48 tokens).

Output (--json): {"peer": {"name", "version"}, "available": true, "gpu", "rows": [{"shape",
"tokens", "us", "do_bench_us", "routing_us", "routing", "rel_l2", "max_err_rel", "checked_tokens",
"near_ties"} or {"shape", "tokens", "error"}]}. When the peer cannot run here (triton_kernels not
importable, no sm_90 GPU): {"peer": null, "available": false, "reason": ...} and exit status 0.
Exit 1 when a point failed or missed the accuracy bound (MAX_REL_L2): those are real errors.

    scripts/fetch_peer.sh
    PYTHONPATH=.peer python3 bench/peer_triton.py --json OUT.json [--shapes a,b] [--tokens 1,8,...] [--iters 30]
"""
import argparse
import json
import os
import statistics
import sys
import time
from typing import NamedTuple

try:
    import torch
    import triton
    import triton.testing
except ImportError as e:  # main() reports the peer as unavailable, with this reason
    torch = triton = None
    MISSING = f"{type(e).__name__}: {e}"

PEER_NAME = "triton_kernels matmul_ogs (vLLM 0.33.0)"

# name: (E, H, I, top_k, routing, n_group, topk_group, routed_scaling_factor, biases), as
# src/base/presets.cpp (tests/scripts/test_bench_scripts.py checks that the two agree).
SHAPES = {
    "gpt-oss-120b": (128, 2880, 2880, 4, "topk_softmax", 1, 1, 1.0, True),
    "gpt-oss-20b": (32, 2880, 2880, 4, "topk_softmax", 1, 1, 1.0, True),
    "qwen3-30b-a3b": (128, 2048, 768, 8, "softmax_topk", 1, 1, 1.0, False),
    "deepseek-v3": (256, 7168, 2048, 8, "sigmoid_grouped_topk", 8, 4, 2.5, False),
    "kimi-k2": (384, 7168, 2048, 8, "sigmoid_grouped_topk", 1, 1, 2.827, False),
    "deepseek-v4-flash-like": (256, 4096, 2048, 6, "softmax_topk", 1, 1, 1.0, False),
}
DEFAULT_SHAPES = "gpt-oss-120b,qwen3-30b-a3b,kimi-k2,gpt-oss-20b,deepseek-v3,deepseek-v4-flash-like"
DEFAULT_TOKENS = "1,8,32,64,128,512,2048,8192,16384"  # bench/moe_bench.h
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0              # vLLM's triton_kernel_fused_experts defaults
INPUT_SETS = 4
CHECK_FIRST, CHECK_SPREAD = 8, 40
NEAR_TIE = 1e-5
# Three bf16 roundings (activation, GEMM2 partials, output) plus bf16 routing weights: ~3e-3.
# A wrong layout, scale or routing gives errors of order 1.
MAX_REL_L2 = 1e-2
WEIGHT_STD, BIAS_STD, CORRECTION_STD = 0.02, 0.05, 0.05
CHUNK_ELEMENTS = 1 << 30  # weights are generated, quantized and converted this many at a time
FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


class Shape(NamedTuple):
    name: str
    experts: int
    hidden: int
    intermediate: int
    top_k: int
    routing: str
    n_group: int
    topk_group: int
    scaling: float
    biases: bool


def shape(name):
    return Shape(name, *SHAPES[name])


# --------------------------------------------------------------------------------------------
# The float64 reference (independent of triton_kernels)
# --------------------------------------------------------------------------------------------

def decode_mxfp4(blocks, scales):
    """OCP MX: u8 blocks [..., C/2] (element 2j in the low nibble), E8M0 scales [..., C/32] -> f64 [..., C]."""
    lut = torch.tensor(FP4_E2M1, dtype=torch.float64, device=blocks.device)
    codes = torch.stack((blocks & 15, blocks >> 4), dim=-1).flatten(-2).long()
    vals = lut[codes].unflatten(-1, (-1, 32))
    scale = torch.where(scales == 255, float("nan"), torch.exp2(scales.double() - 127.0))
    return (vals * scale.unsqueeze(-1)).flatten(-2)


def swiglu(gate, up):
    gate = gate.clamp(max=SWIGLU_LIMIT)
    up = up.clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
    return gate * torch.sigmoid(SWIGLU_ALPHA * gate) * (up + 1)


def _stable_top(keys, k):
    """Indices of the k largest keys per row, ties to the lower index; and each row's margin
    between the k-th and the (k+1)-th key (inf when there is none)."""
    vals, idx = torch.sort(keys, dim=-1, descending=True, stable=True)
    gap = vals[:, k - 1] - vals[:, k] if keys.shape[1] > k else torch.full_like(vals[:, 0], float("inf"))
    return idx[:, :k], gap


def route_reference(logits, sh, correction):
    """float64 routing (src/cpu/routing.cpp): logits f64 [n, E] -> ids [n, k], weights f64 [n, k],
    decisive [n] (False where the selection is within NEAR_TIE of a tie that is not exact)."""
    k = sh.top_k
    if sh.routing in ("topk_softmax", "softmax_topk"):
        # renormalized softmax-then-top-k and top-k-then-softmax give the same weights
        ids, gap = _stable_top(logits, k)
        weights = torch.softmax(torch.gather(logits, 1, ids), dim=-1)
        return ids, weights, (gap == 0) | (gap > NEAR_TIE)
    score = torch.sigmoid(logits)
    choice = score + correction.double()
    n, e = logits.shape
    decisive = torch.ones(n, dtype=torch.bool, device=logits.device)
    if sh.n_group > 1:
        groups = choice.view(n, sh.n_group, e // sh.n_group)
        group_score = groups.topk(min(2, e // sh.n_group), dim=-1).values.sum(-1)
        best, ggap = _stable_top(group_score, sh.topk_group)
        keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, best, True)
        choice = choice.masked_fill(~keep.repeat_interleave(e // sh.n_group, dim=1), float("-inf"))
        decisive &= ggap > NEAR_TIE
    ids, gap = _stable_top(choice, k)
    decisive &= gap > NEAR_TIE
    weights = torch.gather(score, 1, ids)
    weights = weights / weights.sum(-1, keepdim=True) * sh.scaling
    return ids, weights, decisive


def reference_rows(x, logits, layer):
    """The layer in float64 for the rows given: x bf16 [n, H], logits bf16 [n, E] -> f64 [n, H], decisive [n]."""
    sh = layer["shape"]
    ids, weights, decisive = route_reference(logits.double(), sh, layer["correction"])
    xd = x.double()
    out = torch.zeros(x.shape[0], sh.hidden, dtype=torch.float64, device=x.device)
    for e in torch.unique(ids).tolist():
        rows, slots = (ids == e).nonzero(as_tuple=True)
        h = xd[rows] @ decode_mxfp4(layer["q13"][e], layer["s13"][e]).T  # [n_e, 2I], gate/up interleaved
        if layer["b13"] is not None:
            h += layer["b13"][e].double()
        y = swiglu(h[:, 0::2], h[:, 1::2]) @ decode_mxfp4(layer["q2"][e], layer["s2"][e]).T  # [n_e, H]
        if layer["b2"] is not None:
            y += layer["b2"][e].double()
        out.index_add_(0, rows, y * weights[rows, slots].unsqueeze(1))
    return out, decisive


def check_rows(max_tokens):
    """The fixed token subset the reference covers: the first CHECK_FIRST and CHECK_SPREAD spread over the rest."""
    first = list(range(min(CHECK_FIRST, max_tokens)))
    rest = max_tokens - CHECK_FIRST
    spread = [CHECK_FIRST + (i * (rest - 1)) // max(1, CHECK_SPREAD - 1) for i in range(CHECK_SPREAD)] if rest > 0 else []
    return sorted(set(first + spread))


# --------------------------------------------------------------------------------------------
# The peer, set up as vLLM 0.33.0 sets it up
# --------------------------------------------------------------------------------------------

def quantize_experts(tk, experts, rows, cols, seed, device):
    """bf16 N(0, WEIGHT_STD) [E, rows, cols] -> triton_kernels' downcast_to_mxfp along cols:
    u8 codes [E, rows, cols/2], u8 scales [E, rows, cols/32] (the checkpoint layout)."""
    q = torch.empty(experts, rows, cols // 2, dtype=torch.uint8, device=device)
    s = torch.empty(experts, rows, cols // 32, dtype=torch.uint8, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    step = max(1, CHUNK_ELEMENTS // (rows * cols))
    for e0 in range(0, experts, step):
        e1 = min(experts, e0 + step)
        w = torch.randn(e1 - e0, rows, cols, generator=gen, device=device, dtype=torch.float32).mul_(WEIGHT_STD)
        q[e0:e1], s[e0:e1] = tk.downcast_to_mxfp(w.to(torch.bfloat16), torch.uint8, axis=-1)
        del w
    return q, s


def _convert_per_expert(tk, data, dtype, layout_cls, **kwargs):
    """convert_layout over experts a chunk at a time (the layouts act on each expert alone): the
    result of one convert_layout call on the whole tensor, with a fraction of its temporaries."""
    experts = data.shape[0]
    step = max(1, CHUNK_ELEMENTS // max(1, data[0].numel()))
    parts = [tk.convert_layout(tk.wrap_torch_tensor(data[e0:e0 + step], dtype=dtype), layout_cls, **kwargs)
             for e0 in range(0, experts, step)]
    logical = [experts] + list(parts[0].shape[1:])
    first = parts[0].storage.data
    order = sorted(range(first.ndim), key=lambda d: -first.stride(d))  # outermost dim first
    assert order[0] == 0, "the expert dimension must be the outermost"
    inverse = [order.index(d) for d in range(first.ndim)]
    joined = torch.cat([p.storage.data.permute(order) for p in parts]).permute(inverse)
    return tk.Tensor(tk.Storage(joined, layout_cls(list(data.shape), **kwargs)), dtype=dtype, shape=logical)


def to_kernel_layout(tk, q, s, layout):
    """Checkpoint q [E, N, K/2], s [E, N, K/32] -> (W [E, K, N], W scale) for matmul_ogs.
    "hopper": vLLM's _swizzle_mxfp4 on sm90 (what is measured). "dense": the same values decoded
    to float32, no scale -- only for tests/scripts/peer_interpret.py: the Triton interpreter runs
    neither tl.dot_scaled nor the Hopper path's inline PTX, and its bf16 tl.dot is wrong."""
    if layout == "dense":
        return decode_mxfp4(q, s).float().transpose(-2, -1), None
    s = torch.nn.functional.pad(s, (0, -s.shape[-1] % 4))  # vLLM pads K's scale groups to 0 mod 4
    q, s = q.transpose(-2, -1), s.transpose(-2, -1)
    w = _convert_per_expert(tk, q, tk.FP4, tk.HopperMXValueLayout, mx_axis=1)
    ws = _convert_per_expert(tk, s, torch.uint8, tk.HopperMXScaleLayout, mx_axis=1, num_warps=8)
    return w, ws


def routing_path(sh):
    if sh.routing == "sigmoid_grouped_topk":
        return "torch grouped top-k + routing_from_bitmatrix"
    if sh.top_k & (sh.top_k - 1):
        return f"torch top-{sh.top_k} + softmax, padded to {1 << (sh.top_k - 1).bit_length()} + routing_from_bitmatrix"
    return "triton_kernels.routing.routing(sm_first=False)"


def make_layer(tk, sh, device, layout="hopper", seed=0):
    E, H, I = sh.experts, sh.hidden, sh.intermediate
    q13, s13 = quantize_experts(tk, E, 2 * I, H, seed + 1, device)  # rows: gate/up interleaved
    q2, s2 = quantize_experts(tk, E, H, I, seed + 2, device)
    w13, ws13 = to_kernel_layout(tk, q13, s13, layout)
    w2, ws2 = to_kernel_layout(tk, q2, s2, layout)
    gen = torch.Generator(device=device).manual_seed(seed + 3)
    rnd = lambda *size, std: torch.randn(*size, generator=gen, device=device) * std
    return {
        "shape": sh, "routing_path": routing_path(sh),
        "q13": q13, "s13": s13, "q2": q2, "s2": s2, "w13": w13, "w2": w2,
        "pc13": tk.PrecisionConfig(weight_scale=ws13, flex_ctx=tk.FlexCtx(rhs_data=tk.InFlexData())),
        "pc2": tk.PrecisionConfig(weight_scale=ws2, flex_ctx=tk.FlexCtx(rhs_data=tk.InFlexData())),
        "b13": rnd(E, 2 * I, std=BIAS_STD) if sh.biases else None,
        "b2": rnd(E, H, std=BIAS_STD) if sh.biases else None,
        "correction": rnd(E, std=CORRECTION_STD) if sh.routing == "sigmoid_grouped_topk" else None,
        "act": tk.FusedActivation(tk.FnSpecs("swiglu", tk.swiglu_fn, ("alpha", "limit")),
                                  (SWIGLU_ALPHA, SWIGLU_LIMIT), 2),
    }


def pack_bitmatrix(tk, ids, experts):
    """ids int64 [T, k] (-1: no expert) -> triton_kernels Bitmatrix [T, 32 * ceil(E/32)] (bit e of row t: t routes to e)."""
    words = (experts + 31) // 32
    valid = ids >= 0
    idc = ids.clamp(min=0)
    bits = torch.where(valid, torch.ones_like(idc) << (idc % 32), torch.zeros_like(idc))
    packed = torch.zeros(ids.shape[0], words, dtype=torch.int64, device=ids.device).scatter_add_(1, idc // 32, bits)
    packed = torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32).view(torch.uint32)
    return tk.Bitmatrix(packed, shape=[ids.shape[0], words * 32], shape_max=[ids.shape[0], None], scratchpad=None)


def torch_routing(layer, logits):
    """ids int64 [T, k'] (k' = k rounded up to a power of two, extra slots -1), weights f32 [T, k']."""
    sh = layer["shape"]
    k = sh.top_k
    if sh.routing == "sigmoid_grouped_topk":
        score = torch.sigmoid(logits.float())
        choice = score + layer["correction"]
        T, E = choice.shape
        if sh.n_group > 1:
            group_score = choice.view(T, sh.n_group, -1).topk(2, dim=-1).values.sum(-1)
            best = group_score.topk(sh.topk_group, dim=-1).indices
            keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, best, True)
            choice = choice.masked_fill(~keep.unsqueeze(-1).expand(T, sh.n_group, E // sh.n_group).reshape(T, E),
                                        float("-inf"))
        ids = choice.topk(k, dim=-1).indices
        weights = torch.gather(score, 1, ids)
        weights = weights / weights.sum(-1, keepdim=True) * sh.scaling
    else:
        vals, ids = torch.sort(logits, dim=-1, descending=True, stable=True)
        ids = ids[:, :k]
        weights = torch.softmax(vals[:, :k].float(), dim=-1)
    pad = (1 << (k - 1).bit_length()) - k
    if pad:
        ids = torch.nn.functional.pad(ids, (0, pad), value=-1)
        weights = torch.nn.functional.pad(weights, (0, pad), value=-1.0)  # matmul_ogs's "no slot" weight
    return ids, weights


def route_peer(tk, layer, logits):
    sh = layer["shape"]
    if layer["routing_path"].startswith("triton_kernels.routing"):
        return tk.routing(logits, sh.top_k, sm_first=False)
    ids, weights = torch_routing(layer, logits)
    return tk.routing_from_bitmatrix(pack_bitmatrix(tk, ids, sh.experts), weights.to(logits.dtype),
                                     ids.to(tk.int16), sh.experts, ids.shape[1])


def peer_forward(tk, layer, x, logits):
    """vLLM's triton_kernel_fused_experts: x bf16 [T, H], logits bf16 [T, E] -> bf16 [T, H]."""
    sh = layer["shape"]
    T = x.shape[0]
    rdata, gather, scatter = route_peer(tk, layer, logits)
    rows = T * rdata.n_expts_act
    act = torch.empty(1, rows, sh.intermediate, dtype=x.dtype, device=x.device)
    tk.matmul_ogs(x, layer["w13"], layer["b13"], rdata, gather_indx=gather, precision_config=layer["pc13"],
                  fused_activation=layer["act"], y=act)
    out = torch.empty(1, T, sh.hidden, dtype=x.dtype, device=x.device)
    tk.matmul_ogs(act.view(rows, sh.intermediate), layer["w2"], layer["b2"], rdata, scatter_indx=scatter,
                  precision_config=layer["pc2"], gammas=rdata.gate_scal, y=out)
    return out.view(T, sh.hidden)


def import_peer():
    """The triton_kernels names this script uses (ImportError when they cannot be had)."""
    from types import SimpleNamespace

    import triton_kernels
    import triton_kernels.tensor
    from triton_kernels.matmul_ogs import FlexCtx, FnSpecs, FusedActivation, PrecisionConfig, matmul_ogs
    from triton_kernels.matmul_ogs_details.opt_flags import update_opt_flags_constraints
    from triton_kernels.numerics import InFlexData
    from triton_kernels.numerics_details.mxfp import downcast_to_mxfp, upcast_from_mxfp
    from triton_kernels.routing import routing, routing_from_bitmatrix
    from triton_kernels.swiglu import swiglu_fn
    from triton_kernels.tensor import FP4, Bitmatrix, Storage, Tensor, convert_layout, wrap_torch_tensor
    from triton_kernels.tensor_details.layout import HopperMXScaleLayout, HopperMXValueLayout
    if hasattr(triton_kernels.tensor, "SparseMatrix"):
        raise ImportError(f"{triton_kernels.__file__} is a newer triton_kernels (it has SparseMatrix); "
                          "this script drives the 3.5.1 API that vLLM 0.33.0 bundles")
    path = os.path.dirname(triton_kernels.__file__)
    stamp = os.path.join(path, "..", "VERSION")  # written by scripts/fetch_peer.sh
    version = open(stamp).read().strip() if os.path.exists(stamp) else "unknown (no VERSION beside triton_kernels)"
    return SimpleNamespace(
        FlexCtx=FlexCtx, FnSpecs=FnSpecs, FusedActivation=FusedActivation, PrecisionConfig=PrecisionConfig,
        matmul_ogs=matmul_ogs, update_opt_flags_constraints=update_opt_flags_constraints, InFlexData=InFlexData,
        downcast_to_mxfp=downcast_to_mxfp, upcast_from_mxfp=upcast_from_mxfp, routing=routing,
        routing_from_bitmatrix=routing_from_bitmatrix, swiglu_fn=swiglu_fn, FP4=FP4, Bitmatrix=Bitmatrix,
        Storage=Storage, Tensor=Tensor, convert_layout=convert_layout, wrap_torch_tensor=wrap_torch_tensor,
        HopperMXScaleLayout=HopperMXScaleLayout, HopperMXValueLayout=HopperMXValueLayout, int16=torch.int16,
        path=path, version=version)


# --------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------

def capture(fn, n):
    """fn(i) for i < n, each captured in its own CUDA graph after an eager warm-up (JIT compiles there)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(n):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graphs, outs = [], []
    for i in range(n):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs.append(fn(i))
        graphs.append(g)
    return graphs, outs


def time_point(tk, layer, xs, ls, T, iters, flush, do_bench, checked):
    """One token count: the row's timings, and set 0's output on the checked tokens below T."""
    from torch_baseline import timed  # the replay loop bench/torch_baseline.py times with
    row = {}
    with torch.no_grad():
        graphs, outs = capture(lambda i: peer_forward(tk, layer, xs[i][:T], ls[i][:T]), INPUT_SETS)
        for g in graphs:
            g.replay()
        row["us"] = statistics.median(timed(lambda i: graphs[i % INPUT_SETS].replay(), iters, flush))
        if do_bench:
            row["do_bench_us"] = 1e3 * tk_do_bench(lambda: graphs[0].replay())
        rgraphs, _ = capture(lambda i: route_peer(tk, layer, ls[i][:T]), 1)
        row["routing_us"] = statistics.median(timed(lambda i: rgraphs[0].replay(), iters, flush))
        graphs[0].replay()
        torch.cuda.synchronize()
        sel = checked[checked < T]
        return row, (sel, outs[0][sel].double())


def compare(ref, decisive, position, sel, got):
    """rel-L2 and max error of `got` (rows `sel` of the output) against the reference rows."""
    idx = torch.tensor([position[r] for r in sel.tolist()], device=ref.device, dtype=torch.long)
    keep = decisive[idx]
    r, g = ref[idx[keep]], got[keep]
    n = int(keep.sum())
    return {"checked_tokens": n, "near_ties": int(idx.numel()) - n,
            "rel_l2": float((g - r).norm() / r.norm()) if n else None,
            "max_err_rel": float((g - r).abs().max() / r.abs().max()) if n else None}


def run_shape(tk, sh, tokens, iters, flush, do_bench):
    dev = "cuda"
    t0 = time.time()
    layer = make_layer(tk, sh, dev)
    max_t = max(tokens)
    gen = torch.Generator(device=dev).manual_seed(200)
    xs = [torch.randn(max_t, sh.hidden, generator=gen, device=dev).to(torch.bfloat16) for _ in range(INPUT_SETS)]
    ls = [torch.randn(max_t, sh.experts, generator=gen, device=dev).to(torch.bfloat16) for _ in range(INPUT_SETS)]
    checked = torch.tensor(check_rows(max_t), device=dev)
    torch.cuda.synchronize()
    t_prep = time.time() - t0
    rows, outputs = [], {}
    for T in tokens:
        row = {"shape": sh.name, "tokens": T, "routing": layer["routing_path"]}
        try:
            timing, outputs[T] = time_point(tk, layer, xs, ls, T, iters, flush, do_bench, checked)
            row.update(timing)
        except Exception as e:  # keep going: the row says why the point is missing
            row["error"] = f"{type(e).__name__}: {e}"
        rows.append(row)
        print(f"peer {sh.name:22s} T={T:6d} " + (f"{row['us']:10.1f} us (do_bench {row.get('do_bench_us', 0):.1f}, "
              f"routing {row['routing_us']:.1f})" if "us" in row else f"FAILED: {row['error']}"), flush=True)
    t_time = time.time() - t0 - t_prep
    try:
        ref, decisive = reference_rows(xs[0][checked], ls[0][checked], layer)
        position = {r: i for i, r in enumerate(checked.tolist())}
        for row in rows:
            if row["tokens"] in outputs:
                row.update(compare(ref, decisive, position, *outputs[row["tokens"]]))
    except Exception as e:
        for row in rows:
            row["check_error"] = f"{type(e).__name__}: {e}"
    print(f"peer {sh.name}: weights {t_prep:.1f} s, timing {t_time:.1f} s, "
          f"reference {time.time() - t0 - t_prep - t_time:.1f} s", flush=True)
    del layer, outputs
    torch.cuda.empty_cache()
    return rows


def tk_do_bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def unavailable(path, reason):
    print(f"peer_triton: the peer cannot run here: {reason}", file=sys.stderr)
    write_json(path, {"peer": None, "available": False, "reason": reason, "rows": []})
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="write the results here")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--tokens", default=DEFAULT_TOKENS)
    ap.add_argument("--iters", type=int, default=30, help="timed replays per point (median reported)")
    ap.add_argument("--no-do-bench", action="store_true", help="skip triton.testing.do_bench's second timing")
    a = ap.parse_args()
    shapes = a.shapes.split(",")
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"--shapes: unknown shape '{s}' (expected some of {', '.join(SHAPES)})")
    try:
        tokens = [int(t) for t in a.tokens.split(",")]
    except ValueError:
        ap.error(f"--tokens: expected comma-separated integers, got '{a.tokens}'")
    if not tokens or min(tokens) < 1 or a.iters < 1:
        ap.error("--tokens must be positive integers and --iters at least 1")

    if torch is None:
        return unavailable(a.json, f"torch and triton are needed: {MISSING}")
    try:
        tk = import_peer()
    except Exception as e:
        return unavailable(a.json, f"cannot import vLLM 0.33.0's triton_kernels ({type(e).__name__}: {e}); "
                                   "run scripts/fetch_peer.sh and put .peer on PYTHONPATH")
    if not torch.cuda.is_available():
        return unavailable(a.json, "no CUDA device")
    cap = torch.cuda.get_device_capability()
    if cap != (9, 0):
        return unavailable(a.json, f"the peer is measured in its Hopper layouts and needs an sm_90 GPU; "
                                   f"{torch.cuda.get_device_name()} is sm_{cap[0]}{cap[1]}")
    tk.update_opt_flags_constraints({"split_k": 1})  # vLLM's _swizzle_mxfp4 on sm90
    print(f"peer: {PEER_NAME} from {tk.path} ({tk.version}), triton {triton.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    rows = []
    result = {"peer": {"name": PEER_NAME, "version": f"{tk.version}; triton {triton.__version__}; torch {torch.__version__}"},
              "available": True, "complete": False, "gpu": torch.cuda.get_device_name(), "rows": rows}
    for name in shapes:
        try:
            rows += run_shape(tk, shape(name), tokens, a.iters, flush, not a.no_do_bench)
        except Exception as e:  # the weights could not be made: every point of the shape says why
            rows += [{"shape": name, "tokens": T, "error": f"setup: {type(e).__name__}: {e}"} for T in tokens]
            torch.cuda.empty_cache()
        write_json(a.json, result)  # after each shape: a run cut short still leaves what it measured
    result["complete"] = True
    write_json(a.json, result)

    print(f"\n{'shape':22s} {'T':>6s} {'us':>9s} {'do_bench':>9s} {'routing':>8s} {'rel_l2':>8s} {'checked':>7s}")
    bad = 0
    for r in rows:
        if "error" in r:
            bad += 1
            print(f"{r['shape']:22s} {r['tokens']:6d} FAILED: {r['error']}")
            continue
        rel = r.get("rel_l2")
        ok = "check_error" not in r and (rel is None or rel <= MAX_REL_L2)
        bad += not ok
        verdict = "" if ok else f"  ABOVE {MAX_REL_L2:g}" if "check_error" not in r else f"  CHECK FAILED: {r['check_error']}"
        print(f"{r['shape']:22s} {r['tokens']:6d} {r['us']:9.1f} {r.get('do_bench_us', 0):9.1f} {r['routing_us']:8.1f} "
              f"{'-' if rel is None else format(rel, '.2e'):>8} {r.get('checked_tokens', 0):7d}" + verdict)
    if bad:
        print(f"peer_triton: {bad} point(s) failed or missed rel-L2 <= {MAX_REL_L2:g}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
