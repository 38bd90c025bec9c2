"""mxmoe as PyTorch custom operators (``torch.library``): ``torch.ops.mxmoe.*``.

Each op has a fake (meta) implementation, so it traces under ``torch.compile`` (dynamo,
aot_eager, inductor) and runs inside captured CUDA graphs. CUDA tensors run on torch's current
stream of their device; CPU tensors on the CPU backend. No autograd: inference only.

    import torch, mxmoe, mxmoe.torch
    packed, scales = torch.ops.mxmoe.quantize(w, "even", "linear")
    layer = mxmoe.prepare(cfg, gate_up_blocks=..., device="cuda")   # owns its device memory
    out = mxmoe.torch.moe_forward(layer, x, logits=logits)          # torch.ops.mxmoe.moe_forward

Ops (shapes as in :func:`mxmoe.quantize`, :func:`mxmoe.dequantize`, :func:`mxmoe.moe_forward`):
    quantize(Tensor x, str rule, str scale_layout) -> (Tensor packed, Tensor scales)
    quantize_with_stats(Tensor x, str rule, str scale_layout) -> (packed, scales, Tensor stats)
        stats: i64 [8] on x's device, the bytes of mxmoe_quant_stats (decode with
        :func:`stats_from_tensor`); on CUDA written without a host synchronization.
    dequantize(Tensor packed, Tensor scales, str scale_layout, ScalarType dtype) -> Tensor
    moe_forward(Tensor x, Tensor? logits, Tensor? topk_ids, Tensor? topk_weights, int layer) -> Tensor
        ``layer`` is :attr:`mxmoe.PreparedMoE.id`; a closed or collected layer raises
        InvalidArgument.
    moe_forward_out(Tensor x, Tensor? logits, Tensor? topk_ids, Tensor? topk_weights, int layer,
                    Tensor(a!) out) -> ()
        the same forward written into ``out`` ([T, H], contiguous, on x's device; CPU: f32 | bf16,
        CUDA: bf16, as :func:`mxmoe.moe_forward`'s ``out``): no allocation per call (what an
        engine that owns its buffers wants).

The kernels of ``moe_forward`` and ``moe_forward_out`` are C++ (libmxmoe_torch.so, mxmoe/_torchop.py) where the package was
built with torch importable: ``NATIVE_OP`` says whether it is in use, and ``NATIVE_OP_REASON``
why not. Otherwise (and with ``MXMOE_TORCH_NATIVE=0``) the extension's C function is registered
as the kernel from Python, as before, ~5 us slower per call; importing this module then warns
once, unless the environment asked for it. Called through torch.ops directly, the C++ kernel's
errors are ValueError (bad input) or RuntimeError with the message ``"mxmoe.<class>: ..."``;
:func:`moe_forward` raises mxmoe's exception classes on both kernels.
"""

from __future__ import annotations

import struct
import warnings

import torch

from . import _lib, _moe, _quant, _torchop, _tensor
from ._errors import invalid
from ._quant import QuantStats

__all__ = ["NATIVE_OP", "NATIVE_OP_REASON", "dequantize", "moe_forward", "quantize", "quantize_with_stats",
           "stats_from_tensor"]


def _quantize_outputs(x: torch.Tensor, rule: str, scale_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty (packed, scales) for x (fake tensors under tracing). Invalid x raises like the
    library would at run time, so that tracing fails where eager would."""
    _lib.index(_lib.RULES, rule, "rule")
    _lib.index(_lib.SCALE_LAYOUTS, scale_layout, "scale_layout")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise invalid("x", "dtype bf16, f16 or f32", str(x.dtype).replace("torch.", ""))
    if x.dim() < 2 or x.shape[-1] == 0 or x.shape[-1] % 32 != 0:
        raise invalid("x", "a tensor [..., rows, K], K > 0 a multiple of 32", f"shape {list(x.shape)}")
    packed = x.new_empty([*x.shape[:-1], x.shape[-1] // 2], dtype=torch.uint8)
    if scale_layout == "linear":
        scales_shape = [*x.shape[:-1], x.shape[-1] // 32]
    else:  # the tiled size comes from the library; symbolic sizes are specialized for it
        scales_shape = list(_quant.scale_shape(tuple(int(d) for d in x.shape), scale_layout))
    return packed, x.new_empty(scales_shape, dtype=torch.uint8)


# torch.library.Library + define/impl rather than torch.library.custom_op: the same dispatcher
# op, with about a tenth of custom_op's per-call Python overhead (measured: docs/python.md).
_ops = torch.library.Library("mxmoe", "DEF")


def _op(schema: str, impl, fake) -> None:
    name = schema.split("(", 1)[0]
    _ops.define(schema)
    for key in ("CPU", "CUDA"):
        _ops.impl(name, impl, key)
    torch.library.register_fake(f"mxmoe::{name}", fake, lib=_ops)


def _quantize_impl(x: torch.Tensor, rule: str, scale_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _quant.quantize(x, rule, scale_layout)


_op("quantize(Tensor x, str rule, str scale_layout) -> (Tensor, Tensor)", _quantize_impl, _quantize_outputs)

_STATS_WORDS = 8  # mxmoe_quant_stats: 6 x i64, 2 x f64 (f64 bits stored as i64)


def _quantize_with_stats_impl(x: torch.Tensor, rule: str,
                              scale_layout: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if x.is_cuda:
        stats = torch.empty(_STATS_WORDS, dtype=torch.int64, device=x.device)
        packed, scales = _quant.quantize(x, rule, scale_layout, device_stats=stats)
        return packed, scales, stats
    packed, scales, s = _quant.quantize(x, rule, scale_layout, stats=True)
    words = struct.unpack("=8q", struct.pack("=6q2d", *(getattr(s, f) for f, _ in _lib.QuantStatsC._fields_)))
    return packed, scales, torch.tensor(words, dtype=torch.int64)


def _quantize_with_stats_fake(x, rule, scale_layout):
    packed, scales = _quantize_outputs(x, rule, scale_layout)
    return packed, scales, x.new_empty([_STATS_WORDS], dtype=torch.int64)


_op("quantize_with_stats(Tensor x, str rule, str scale_layout) -> (Tensor, Tensor, Tensor)",
    _quantize_with_stats_impl, _quantize_with_stats_fake)


def stats_from_tensor(stats: torch.Tensor) -> QuantStats:
    """The :class:`~mxmoe.QuantStats` in a ``quantize_with_stats`` stats tensor (copies it to the
    host: on CUDA this waits for the quantize)."""
    if stats.dtype != torch.int64 or stats.shape != (_STATS_WORDS,):
        raise invalid("stats", f"an i64 [{_STATS_WORDS}] statistics tensor",
                      f"{str(stats.dtype).replace('torch.', '')} {list(stats.shape)}")
    words = stats.detach().cpu().tolist()
    return QuantStats(*struct.unpack("=6q2d", struct.pack("=8q", *words)))


def _dequantize_impl(packed: torch.Tensor, scales: torch.Tensor, scale_layout: str,
                     dtype: torch.dtype) -> torch.Tensor:
    return _quant.dequantize(packed, scales, scale_layout, dtype=dtype)


def _dequantize_fake(packed, scales, scale_layout, dtype):
    _lib.index(_lib.SCALE_LAYOUTS, scale_layout, "scale_layout")
    if dtype not in (torch.float32, torch.bfloat16):
        raise invalid("dtype", "f32 | bf16", str(dtype).replace("torch.", ""))
    if packed.dim() < 2:
        raise invalid("packed", "a tensor [..., rows, K/2]", f"shape {list(packed.shape)}")
    return packed.new_empty([*packed.shape[:-1], packed.shape[-1] * 2], dtype=dtype)


_op("dequantize(Tensor packed, Tensor scales, str scale_layout, ScalarType dtype) -> Tensor", _dequantize_impl,
    _dequantize_fake)


def _moe_forward_fake(x, logits, topk_ids, topk_weights, layer):
    _moe.live_layer(layer)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _moe_forward_out_fake(x, logits, topk_ids, topk_weights, layer, out):
    _moe.live_layer(layer)


def _moe_forward_out_py(x, logits, topk_ids, topk_weights, layer, out):
    """moe_forward_out's kernel registered from Python: the extension's forward into ``out``."""
    _lib.hotpath.moe_forward(_moe.live_layer(layer), x, logits, topk_ids, topk_weights, out, None, None)


def _register_moe_forward() -> tuple[_torchop.NativeOps | None, str | None]:
    """Defines moe_forward and registers its kernel: the C++ op library's (loading it after the
    schema is defined registers it), or else the extension's own function (hotpath.c,
    torch_moe_forward(x, logits, topk_ids, topk_weights, layer)), which the dispatcher calls
    through Python objects. Returns the library, or None and why it is not used."""
    _ops.define("moe_forward(Tensor x, Tensor? logits, Tensor? topk_ids, Tensor? topk_weights, int layer) -> Tensor")
    _ops.define("moe_forward_out(Tensor x, Tensor? logits, Tensor? topk_ids, Tensor? topk_weights, int layer, "
                "Tensor(a!) out) -> ()")
    native, why = _torchop.load(_moe.CACHED_WORKSPACE_BYTES)
    if native is not None:
        for ref in list(_moe._live_layers.values()):  # layers prepared before this import
            layer = ref()
            if layer is not None and layer._handle and layer._native is None:
                native.adopt(layer)
        _moe.native_ops = native
        return native, None
    for key in ("CPU", "CUDA"):
        _ops.impl("moe_forward", _lib.hotpath.torch_moe_forward, key)
        _ops.impl("moe_forward_out", _moe_forward_out_py, key)
    if not why.startswith(_torchop.DISABLE_ENV):
        warnings.warn(f"mxmoe.torch: torch.ops.mxmoe.moe_forward runs the kernel registered from Python (about 5 us "
                      f"more per call than the C++ one) because {why}", RuntimeWarning, stacklevel=2)
    return None, why


_tensor.bind_torch()  # the extension reads torch tensors from its first call
_native, NATIVE_OP_REASON = _register_moe_forward()
NATIVE_OP: bool = _native is not None
"""Whether torch.ops.mxmoe.moe_forward's CPU and CUDA kernel is the C++ one (libmxmoe_torch.so);
NATIVE_OP_REASON says why not."""
torch.library.register_fake("mxmoe::moe_forward", _moe_forward_fake, lib=_ops)
torch.library.register_fake("mxmoe::moe_forward_out", _moe_forward_out_fake, lib=_ops)


def quantize(x: torch.Tensor, rule: str = "even",
             scale_layout: str = "linear") -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.mxmoe.quantize``: x bf16 | f16 | f32 [..., rows, K] -> (packed u8 [..., rows, K/2],
    scales u8 [..., rows, K/32] or tiled)."""
    return torch.ops.mxmoe.quantize(x, rule, scale_layout)


def quantize_with_stats(x: torch.Tensor, rule: str = "even",
                        scale_layout: str = "linear") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.ops.mxmoe.quantize_with_stats``: also the statistics as an i64 [8] tensor
    (:func:`stats_from_tensor`)."""
    return torch.ops.mxmoe.quantize_with_stats(x, rule, scale_layout)


def dequantize(packed: torch.Tensor, scales: torch.Tensor, scale_layout: str = "linear",
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``torch.ops.mxmoe.dequantize``: -> dtype (f32 | bf16) [..., rows, K]."""
    return torch.ops.mxmoe.dequantize(packed, scales, scale_layout, dtype)


def moe_forward(layer: "_moe.PreparedMoE", x: torch.Tensor, *, logits: torch.Tensor | None = None,
                topk_ids: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.ops.mxmoe.moe_forward`` on a :class:`~mxmoe.PreparedMoE`: x [T, H] -> out [T, H]
    of x's dtype (see :func:`mxmoe.moe_forward`); with ``out`` ([T, H], contiguous, on x's
    device; CPU: f32 | bf16, CUDA: bf16) ``torch.ops.mxmoe.moe_forward_out`` writes it and it is
    returned. Bad input
    raises mxmoe's exceptions (:class:`~mxmoe.InvalidArgument` naming the argument, ...) on
    either kernel."""
    try:
        if out is not None:
            _moe_forward_out_op(x, logits, topk_ids, topk_weights, layer.id, out)
            return out
        return _moe_forward_op(x, logits, topk_ids, topk_weights, layer.id)
    except (ValueError, RuntimeError) as e:  # the C++ kernel's, through torch (translate says)
        error = _torchop.translate(e)
        if error is None:
            raise
        raise error from None


_moe_forward_op = torch.ops.mxmoe.moe_forward.default
_moe_forward_out_op = torch.ops.mxmoe.moe_forward_out.default
