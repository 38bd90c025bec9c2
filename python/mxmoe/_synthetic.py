"""Synthetic MXFP4 layers and their inputs (include/mxmoe/synthetic.h: the generator `mxmoe run
--preset`, the benchmark and the C++ tests use), and the model presets (include/mxmoe/presets.h,
docs/models.md)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from . import _lib, _tensor
from ._errors import invalid
from ._moe import MoEConfig, MoEWeights


@dataclass(frozen=True)
class Preset:
    """The MoE layer of a model mxmoe targets: its configuration, and whether the model carries
    expert biases (gpt-oss)."""

    name: str
    config: MoEConfig
    has_biases: bool


_presets: dict[str, Preset] = {}


def presets() -> dict[str, Preset]:
    """The model presets by name (``"gpt-oss-120b"``, ``"gpt-oss-20b"``, ``"qwen3-30b-a3b"``,
    ``"deepseek-v3"``, ``"kimi-k2"``, ...), in the library's order."""
    if not _presets:
        count = ctypes.c_int32()
        _lib.check(_lib.lib.mxmoe_preset_count(ctypes.byref(count)))
        for i in range(count.value):
            name, cfg, biases = ctypes.c_char_p(), _lib.MoeConfigC(), ctypes.c_int32()
            _lib.check(_lib.lib.mxmoe_preset(i, ctypes.byref(name), ctypes.byref(cfg), ctypes.byref(biases)))
            preset = Preset(name.value.decode(), MoEConfig._from_c(cfg), bool(biases.value))
            _presets[preset.name] = preset
    return dict(_presets)


def find_preset(name: str) -> Preset:
    all_presets = presets()
    if name not in all_presets:
        raise invalid("name", "a preset: " + " | ".join(all_presets), repr(name))
    return all_presets[name]


def synthetic_layer(config: MoEConfig | str, seed: int = 0, *, biases: bool | None = None,
                    correction_bias: bool = False, experts: int | None = None) -> MoEWeights:
    """A random MXFP4 layer in the checkpoint layout (synthetic::make_layer; the recipe is
    include/mxmoe/synthetic.h's): every code byte uniform, scale bytes centred so that each GEMM
    output is O(1) for x ~ N(0, 1), small normal bf16 biases and f32 correction bias.
    Deterministic in ``seed``.

    Args:
        config: a :class:`MoEConfig`, or a preset name (:func:`presets`).
        biases: gate_up_bias and down_bias; default: the preset's (gpt-oss has them), else none.
        correction_bias: a correction bias (sigmoid_grouped_topk only).
        experts: with a preset name: E instead of the model's.
    """
    if isinstance(config, str):
        preset = find_preset(config)
        cfg = MoEConfig.from_preset(config, experts=experts)
        with_biases = preset.has_biases if biases is None else biases
    else:
        if experts is not None:
            raise invalid("experts", "only with a preset name (set MoEConfig.experts instead)", str(experts))
        cfg, with_biases = config, bool(biases)
    dtypes = {"gate_up_blocks": _lib.U8, "gate_up_scales": _lib.U8, "down_blocks": _lib.U8, "down_scales": _lib.U8}
    if with_biases:
        dtypes.update(gate_up_bias=_lib.BF16, down_bias=_lib.BF16)
    if correction_bias:
        dtypes.update(correction_bias=_lib.F32)
    c = cfg._to_c()
    cfg.validate()  # before allocating
    weights = MoEWeights._allocate(cfg, "mxfp4", dtypes)
    cw = _moe_weights_out(weights)
    _lib.check(_lib.lib.mxmoe_synthetic_layer(ctypes.byref(c), int(with_biases), int(correction_bias), seed,
                                              ctypes.byref(cw)))
    return weights


def _moe_weights_out(weights: MoEWeights) -> _lib.MoeWeightsC:
    from ._moe import weights_c

    return weights_c(weights.tensors, prefix="out", writable=True)


def synthetic_inputs(config: MoEConfig | MoEWeights, tokens: int, seed: int = 0) -> tuple[Any, Any]:
    """x bf16 [T, H] ~ N(0, 1) and router logits f32 [T, E] (synthetic::make_inputs): N(0, 1), or
    x·Wrᵀ + br when ``config`` is an :class:`MoEWeights` with router weights. CPU torch tensors."""
    import torch

    weights = config if isinstance(config, MoEWeights) else None
    cfg = weights.config if weights is not None else config
    if not isinstance(cfg, MoEConfig):
        raise invalid("config", "an mxmoe.MoEConfig or mxmoe.MoEWeights", type(config).__name__)
    if not isinstance(tokens, int) or tokens < 0:
        raise invalid("tokens", "a token count >= 0", repr(tokens))
    x = torch.empty(tokens, cfg.hidden, dtype=torch.bfloat16)
    logits = torch.empty(tokens, cfg.experts, dtype=torch.float32)
    cw = weights._c() if weights is not None else None
    _lib.check(_lib.lib.mxmoe_synthetic_inputs(ctypes.byref(cfg._to_c()), ctypes.byref(cw) if cw is not None else None,
                                               tokens, seed, _tensor.view(x, "x", writable=True),
                                               _tensor.view(logits, "logits", writable=True)))
    return x, logits
