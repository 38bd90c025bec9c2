"""Hugging Face transformers' own MoE blocks on mxmoe.

For each MoE block of a transformers model — ``GptOssMLP`` (gpt-oss: gate_up_proj [E, H, 2I]
with gate/up interleaved, biases, clamped SwiGLU, top-k then softmax) and
``Qwen3MoeSparseMoeBlock`` (Qwen3-MoE: fused gate_up_proj [E, 2I, H] as [gate; up], SiLU, softmax
then top-k, renormalized with ``norm_topk_prob``):

* :func:`quantize_block` quantizes the block's own expert parameters to MXFP4,
* :func:`load_dequantized` writes the dequantized weights back into the block's parameters (the
  reference: the model's own forward on exactly the weights mxmoe runs),
* :func:`swap_block` replaces the block's forward with ``torch.ops.mxmoe.moe_forward`` (the
  block's router still computes the logits; mxmoe routes, runs the experts and combines).

:func:`swap_model` does all blocks; ``examples/hf_moe_swap.py`` checks a checkpoint with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import _moe, _quant, _verify
from . import torch as mxmoe_torch  # registers torch.ops.mxmoe
from ._errors import invalid
from ._quant import QuantStats
from ._verify import Tolerance, Verification


@dataclass
class _Spec:
    """How one kind of block stores its experts, in mxmoe's terms."""

    config: _moe.MoEConfig
    gate_up: torch.Tensor  # [E, 2I, H] view of the block's parameter
    down: torch.Tensor  # [E, H, I] view
    gate_up_bias: torch.Tensor | None
    down_bias: torch.Tensor | None
    set_gate_up: Callable[[torch.Tensor], None]  # writes [E, 2I, H] back in the block's layout
    set_down: Callable[[torch.Tensor], None]
    logits: Callable[[torch.Tensor], Any]  # x [T, H] -> (logits [T, E], what the block returns besides out)


def _copy_into(param: torch.nn.Parameter, transpose: bool) -> Callable[[torch.Tensor], None]:
    def write(value: torch.Tensor) -> None:
        with torch.no_grad():
            param.copy_(value.transpose(1, 2) if transpose else value)

    return write


def _spec(block: torch.nn.Module) -> _Spec:
    kind = type(block).__name__
    if kind == "GptOssMLP":
        ex, router = block.experts, block.router
        e, h, i2 = ex.gate_up_proj.shape
        cfg = _moe.MoEConfig(e, h, i2 // 2, routing="topk_softmax", top_k=router.top_k, activation="swiglu_clamped",
                             alpha=float(ex.alpha), limit=float(ex.limit), gate_up="interleaved")

        def logits(x):
            router_logits, scores, _ = router(x)
            return router_logits, scores

        return _Spec(cfg, ex.gate_up_proj.transpose(1, 2), ex.down_proj.transpose(1, 2), ex.gate_up_proj_bias,
                     ex.down_proj_bias, _copy_into(ex.gate_up_proj, True), _copy_into(ex.down_proj, True), logits)
    if kind == "Qwen3MoeSparseMoeBlock":
        ex, gate = block.experts, block.gate
        if not hasattr(ex, "gate_up_proj"):
            raise invalid("block.experts", "fused gate_up_proj / down_proj parameters (transformers >= 5)",
                          type(ex).__name__)
        act = getattr(ex.act_fn, "__class__", type(None)).__name__
        if act not in ("SiLU", "SiLUActivation"):
            raise invalid("block.experts.act_fn", "SiLU (mxmoe's silu_mul)", act)
        e, i2, h = ex.gate_up_proj.shape
        cfg = _moe.MoEConfig(e, h, i2 // 2, routing="softmax_topk", top_k=gate.top_k,
                             renormalize=bool(gate.norm_topk_prob), activation="silu_mul", gate_up="concatenated")

        def logits(x):
            return torch.nn.functional.linear(x, gate.weight), None

        return _Spec(cfg, ex.gate_up_proj, ex.down_proj, None, None, _copy_into(ex.gate_up_proj, False),
                     _copy_into(ex.down_proj, False), logits)
    raise invalid("block", "a GptOssMLP or Qwen3MoeSparseMoeBlock", kind)


def find_moe_blocks(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(qualified name, module) of every MoE block mxmoe can run."""
    return [(n, m) for n, m in model.named_modules() if type(m).__name__ in ("GptOssMLP", "Qwen3MoeSparseMoeBlock")]


@dataclass
class QuantizedBlock:
    """A block's experts in MXFP4, in the checkpoint layout :func:`mxmoe.prepare` takes."""

    config: _moe.MoEConfig
    gate_up_blocks: torch.Tensor  # u8 [E, 2I, H/32, 16]
    gate_up_scales: torch.Tensor  # u8 [E, 2I, H/32]
    down_blocks: torch.Tensor  # u8 [E, H, I/32, 16]
    down_scales: torch.Tensor  # u8 [E, H, I/32]
    gate_up_bias: torch.Tensor | None  # [E, 2I]
    down_bias: torch.Tensor | None  # [E, H]
    gate_up_stats: QuantStats
    down_stats: QuantStats

    def weights(self) -> dict[str, torch.Tensor]:
        w = {"gate_up_blocks": self.gate_up_blocks, "gate_up_scales": self.gate_up_scales,
             "down_blocks": self.down_blocks, "down_scales": self.down_scales}
        if self.gate_up_bias is not None:
            w["gate_up_bias"] = self.gate_up_bias
        if self.down_bias is not None:
            w["down_bias"] = self.down_bias
        return w


def _quantize_matrix(w: torch.Tensor, rule: str) -> tuple[torch.Tensor, torch.Tensor, QuantStats]:
    w = w.detach()
    if w.dtype != torch.bfloat16:
        raise invalid("expert weights", "bf16 parameters (the checkpoint's own precision)", str(w.dtype))
    packed, scales, stats = _quant.quantize(w.contiguous(), rule, stats=True)
    e, n, k = w.shape
    return packed.view(e, n, k // 32, 16), scales, stats


def quantize_block(block: torch.nn.Module, rule: str = "even") -> QuantizedBlock:
    """Quantize the block's own BF16 expert parameters (on their device) with ``rule``."""
    s = _spec(block)
    gu_blocks, gu_scales, gu_stats = _quantize_matrix(s.gate_up, rule)
    d_blocks, d_scales, d_stats = _quantize_matrix(s.down, rule)

    def bias(b):
        return None if b is None else b.detach().float().contiguous()

    return QuantizedBlock(s.config, gu_blocks, gu_scales, d_blocks, d_scales, bias(s.gate_up_bias),
                          bias(s.down_bias), gu_stats, d_stats)


def load_dequantized(block: torch.nn.Module, q: QuantizedBlock) -> None:
    """Overwrite the block's expert parameters with the dequantized MXFP4 weights (the reference
    model: its own forward on the weights mxmoe runs)."""
    s = _spec(block)
    e, n, kb, _ = q.gate_up_blocks.shape
    s.set_gate_up(_quant.dequantize(q.gate_up_blocks.view(e, n, kb * 16), q.gate_up_scales))
    e, n, kb, _ = q.down_blocks.shape
    s.set_down(_quant.dequantize(q.down_blocks.view(e, n, kb * 16), q.down_scales))


def swap_block(block: torch.nn.Module, q: QuantizedBlock, device: Any = None) -> _moe.PreparedMoE:
    """Replace ``block.forward`` with the mxmoe layer prepared from ``q`` on ``device`` (default:
    the block's device). The returned layer owns the prepared weights; the block keeps a
    reference (``block.mxmoe_layer``). On CUDA the layer runs in bf16 (inputs are cast to bf16,
    outputs back to the block's dtype); on the CPU in the input's dtype (bf16 | f32)."""
    s = _spec(block)
    device = torch.device(device) if device is not None else q.gate_up_blocks.device
    layer = _moe.prepare(q.config, device=str(device), **q.weights())
    gpt_oss = type(block).__name__ == "GptOssMLP"

    def forward(hidden_states: torch.Tensor):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        if layer.is_cuda:
            # The layer reads bf16 x: route on the same values (a no-op for a bf16 model).
            x = x.to(torch.bfloat16).to(x.dtype)
        logits, extra = s.logits(x)
        if layer.is_cuda:
            x, logits = x.to(torch.bfloat16), logits.float()
        out = mxmoe_torch.moe_forward(layer, x.contiguous(), logits=logits.contiguous())
        out = out.to(hidden_states.dtype).reshape(shape)
        return (out, extra) if gpt_oss else out

    if not hasattr(block, "_mxmoe_original_forward"):
        block._mxmoe_original_forward = block.forward
    block.forward = forward
    block.mxmoe_layer = layer
    return layer


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64."""
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / want.norm())


@dataclass
class BlockCheck:
    name: str
    check: Verification  #: block output against the block's own forward (float32) on the same input
    gate_up_sqnr_db: float
    down_sqnr_db: float

    @property
    def rel_l2(self) -> float:
        return self.check.rel_l2


@dataclass
class ModelCheck:
    """What :func:`check_model` measured; each comparison judged by :func:`mxmoe.compare` under the
    backend's :class:`~mxmoe.Tolerance` (rel-L2, and on CUDA the max error)."""

    backend: str  #: "cpu" or "cuda:N": where the mxmoe layers ran
    tolerance: Tolerance  #: mxmoe.forward_tolerance(backend)
    blocks: list[BlockCheck]
    logits: Verification  #: whole-model logits against the model's own forward

    @property
    def logits_rel_l2(self) -> float:
        return self.logits.rel_l2

    @property
    def passed(self) -> bool:
        return all(b.check.passed for b in self.blocks) and self.logits.passed


def _block_reference(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The block's own forward in float32 on x (parameters converted for the call and back:
    bf16 -> f32 -> bf16 is exact)."""
    dtype = next(block.parameters()).dtype
    block.float()
    try:
        out = block._mxmoe_original_forward(x.float())
    finally:
        block.to(dtype)
    return out[0] if isinstance(out, tuple) else out


@torch.no_grad()
def check_model(model: torch.nn.Module, input_ids: torch.Tensor, rule: str = "even", device: Any = None,
                dtype: torch.dtype | None = torch.float32) -> ModelCheck:
    """Quantize every MoE block of ``model`` (its own BF16 expert weights, ``rule``), make the
    model the reference (its blocks hold the dequantized weights; then the whole model is
    converted to ``dtype``, exactly, unless None), run it, then swap every block for mxmoe on
    ``device`` (default: the model's device) and compare:

    * each block's output with the block's own forward in float32 on the same input (rounded to
      bf16 first when the mxmoe layer is the bf16 CUDA one);
    * the whole model's logits with the reference run's.

    The model is left with its blocks swapped (:func:`restore_block` undoes it)."""
    blocks = find_moe_blocks(model)
    if not blocks:
        raise invalid("model", "a model with GptOssMLP or Qwen3MoeSparseMoeBlock blocks", type(model).__name__)
    quantized = {}
    for name, block in blocks:
        quantized[name] = quantize_block(block, rule)
        load_dequantized(block, quantized[name])
    if dtype is not None:
        model.to(dtype)

    inputs: dict[str, torch.Tensor] = {}
    hooks = [block.register_forward_pre_hook(lambda mod, args, name=name: inputs.__setitem__(name, args[0].clone()))
             for name, block in blocks]
    try:
        want_logits = model(input_ids).logits.float()
    finally:
        for hook in hooks:
            hook.remove()

    checks = []
    backend = None
    for name, block in blocks:
        layer = swap_block(block, quantized[name], device)
        backend = layer.device
        x = inputs[name]
        got = block(x)
        got = got[0] if isinstance(got, tuple) else got
        want = _block_reference(block, x.to(torch.bfloat16) if layer.is_cuda else x)
        q = quantized[name]
        check = _verify.compare(got.float(), want.float(), backend)
        checks.append(BlockCheck(name, check, q.gate_up_stats.sqnr_db, q.down_stats.sqnr_db))
    got_logits = model(input_ids).logits.float()
    return ModelCheck(backend, _verify.forward_tolerance(backend), checks,
                      _verify.compare(got_logits, want_logits, backend))


def restore_block(block: torch.nn.Module) -> None:
    """Undo :func:`swap_block` (the block's own forward again) and free its mxmoe layer."""
    if hasattr(block, "_mxmoe_original_forward"):
        block.forward = block._mxmoe_original_forward
        del block._mxmoe_original_forward
    layer = getattr(block, "mxmoe_layer", None)
    if layer is not None:
        layer.close()
        del block.mxmoe_layer
