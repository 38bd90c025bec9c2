"""quantize / dequantize: MXFP4 (E2M1 codes, one E8M0 scale per 32) along the last dimension."""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

from . import _lib, _tensor
from ._errors import invalid


@dataclass(frozen=True)
class QuantStats:
    """What quantizing cost (mxmoe::quant_stats)."""

    elements: int
    blocks: int
    saturated_blocks: int  #: blocks with at least one element clamped to +-6 * scale
    clamped_elements: int  #: elements with |x / scale| > 6
    flushed_elements: int  #: x != 0 that became +-0
    nonfinite_blocks: int  #: blocks holding NaN / Inf (scale byte 0xFF)
    signal_sq: float  #: sum of x^2 over finite blocks
    error_sq: float  #: sum of (x - dequantize(x))^2 over finite blocks

    @property
    def sqnr_db(self) -> float:
        """10 log10(signal / error); +inf when the error is 0."""
        if self.error_sq == 0.0:
            return math.inf
        return 10.0 * math.log10(self.signal_sq / self.error_sq) if self.signal_sq > 0 else -math.inf

    @classmethod
    def _from_c(cls, s: _lib.QuantStatsC) -> "QuantStats":
        return cls(*(getattr(s, name) for name, _ in _lib.QuantStatsC._fields_))


def scale_shape(shape: tuple[int, ...], scale_layout: str = "linear") -> tuple[int, ...]:
    """Shape of the u8 scales for values of ``shape`` = [..., rows, K]:
    linear [..., rows, K/32]; tiled_128x4 [..., padded bytes of one tiled matrix]."""
    layout = _lib.index(_lib.SCALE_LAYOUTS, scale_layout, "scale_layout")
    if len(shape) < 2:
        raise invalid("x", "a tensor of rank >= 2 [..., rows, K]", f"shape {list(shape)}")
    rows, k = shape[-2], shape[-1]
    if layout == 0:
        return (*shape[:-2], rows, k // 32)
    n = ctypes.c_int64()
    _lib.check(_lib.lib.mxmoe_scale_bytes(rows, k, layout, ctypes.byref(n)))
    return (*shape[:-2], n.value)


def quantize(
    x: Any,
    rule: str = "even",
    scale_layout: str = "linear",
    *,
    stats: bool = False,
    device_stats: Any = None,
    out: tuple[Any, Any] | None = None,
    stream: int | None = None,
):
    """Quantize ``x`` to MXFP4 along its last dimension.

    Args:
        x: bf16 | f16 | f32 [..., rows, K], K a multiple of 32, the last dimension contiguous
            (other dimensions may have any stride). torch (cpu or cuda), numpy, or DLPack.
        rule: the E8M0 scale rule: ``floor`` (OCP MX), ``even``, ``rceil``, ``mse``
            (docs/formats.md).
        scale_layout: ``linear`` (scales [..., rows, K/32]) or ``tiled_128x4`` (the Blackwell
            block-scaled layout, [..., scale_tiled_128x4 bytes]).
        stats: also return :class:`QuantStats` (on CUDA this synchronizes the stream).
        device_stats: CUDA only, instead of ``stats``: a device array of 64 bytes (e.g. torch
            int64 [8]) that receives the statistics (mxmoe_quant_stats: 6 x i64, 2 x f64) when
            the stream gets there: no host synchronization, capturable in a CUDA graph.
        out: (packed, scales) to write into instead of allocating.
        stream: CUDA stream handle; default: torch's current stream for torch tensors, else the
            legacy default stream.

    Returns:
        ``(packed, scales)`` — packed u8 [..., rows, K/2] (element 2j in the low nibble), scales
        u8 — or ``(packed, scales, stats)``, as arrays of the input's kind and device.
    """
    rule_code = _lib.index(_lib.RULES, rule, "rule")
    layout_code = _lib.index(_lib.SCALE_LAYOUTS, scale_layout, "scale_layout")
    xc = _tensor.view(x, "x", stream=stream)
    if out is None:
        shape = _lib.unpack_tensor(xc)[4]
        if len(shape) >= 2 and shape[-1] > 0 and shape[-1] % 32 == 0:
            packed_shape, scales_shape = (*shape[:-1], shape[-1] // 2), scale_shape(shape, scale_layout)
        else:
            packed_shape = scales_shape = (0,)  # the library says what is wrong with x
        packed = _tensor.empty(x, packed_shape, _lib.U8, "out")
        scales = _tensor.empty(x, scales_shape, _lib.U8, "out")
    else:
        packed, scales = out
    pc = _tensor.view(packed, "packed", writable=True, stream=stream)
    sc = _tensor.view(scales, "scales", writable=True, stream=stream)
    host_stats = _lib.QuantStatsC() if stats else None
    stats_ptr = None
    if device_stats is not None:
        stats_ptr, nbytes, (device_type, _) = _tensor.buffer(device_stats, "device_stats")
        if device_type != _lib.DEVICE_CUDA or nbytes != ctypes.sizeof(_lib.QuantStatsC):
            raise invalid("device_stats", f"a cuda array of {ctypes.sizeof(_lib.QuantStatsC)} bytes",
                          f"{nbytes} bytes on {'cuda' if device_type == _lib.DEVICE_CUDA else 'cpu'}")
    s = _tensor.current_stream(x, stream)
    _lib.check(_lib.lib.mxmoe_quantize(xc, rule_code, layout_code, pc, sc, host_stats, stats_ptr, s))
    if stats:
        return packed, scales, QuantStats._from_c(host_stats)
    return packed, scales


_OUT_DTYPES = {"f32": _lib.F32, "float32": _lib.F32, "bf16": _lib.BF16, "bfloat16": _lib.BF16}


def dequantize(
    packed: Any,
    scales: Any,
    scale_layout: str = "linear",
    *,
    dtype: Any = "f32",
    out: Any = None,
    stream: int | None = None,
):
    """Dequantize MXFP4 ``(packed, scales)`` (as :func:`quantize` writes them).

    Args:
        packed: u8 [..., rows, K/2], contiguous.
        scales: u8, contiguous, in ``scale_layout``.
        dtype: ``f32`` or ``bf16`` (or torch.float32 / torch.bfloat16) for the allocated
            output; ignored with ``out``.
        out: bf16 | f32 [..., rows, K], contiguous, to write into.

    Returns:
        ``out``: [..., rows, K], an array of the input's kind and device.
    """
    layout_code = _lib.index(_lib.SCALE_LAYOUTS, scale_layout, "scale_layout")
    pc = _tensor.view(packed, "packed", stream=stream)
    sc = _tensor.view(scales, "scales", stream=stream)
    if out is None:
        code = _OUT_DTYPES.get(str(dtype).replace("torch.", ""))
        if code is None:
            raise invalid("dtype", "f32 | bf16", repr(dtype))
        shape = _lib.unpack_tensor(pc)[4]
        out = _tensor.empty(packed, (*shape[:-1], shape[-1] * 2) if shape else shape, code, "out")
    oc = _tensor.view(out, "out", writable=True, stream=stream)
    _lib.check(_lib.lib.mxmoe_dequantize(pc, sc, layout_code, oc, _tensor.current_stream(packed, stream)))
    return out
