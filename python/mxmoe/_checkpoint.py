"""Checkpoints (safetensors): the MoE layers of a file, one layer read or prepared straight from
it, and whole-checkpoint conversion to MXFP4 and back (include/mxmoe/checkpoint.h, convert.h)."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from . import _lib
from ._errors import Cancelled, invalid
from ._moe import MoEConfig, MoEWeights, PreparedMoE, _sharded, parse_device, prepare_options_c, weights_c
from ._quant import QuantStats


@dataclass(frozen=True)
class LayerInfo:
    """One MoE layer of a checkpoint (checkpoint::moe_layer_info).

    Attributes:
        layer: the decoder layer index L of ``...layers.L.mlp.``.
        layout: ``"mxfp4_gpt_oss"``, ``"bf16_gpt_oss"`` or ``"bf16_per_expert"`` (Qwen3/DeepSeek).
        weight_dtype: the expert weights' element type in the file (``"u8"`` for MXFP4).
        format: what :meth:`Checkpoint.read_layer` gives: ``"mxfp4"``, or ``"bf16"`` (BF16 layers).
        config: the layer's :class:`MoEConfig` (the file's ``mxmoe.moe_config`` metadata, else
            the model family's defaults).
        optional: the optional tensors the layer has, name -> dtype (``{"gate_up_bias": "bf16"}``).
    """

    layer: int
    layout: str
    weight_dtype: str
    format: str
    config: MoEConfig
    optional: dict[str, str]


def _path(value: Any, name: str) -> bytes:
    if not isinstance(value, (str, bytes, os.PathLike)):
        raise invalid(name, "a file path (str or os.PathLike)", type(value).__name__)
    return os.fsencode(value)


class Checkpoint(_lib.Owned):
    """A safetensors checkpoint, memory-mapped read-only with its header validated; its MoE
    layers in :attr:`layers`. Unmapped by :meth:`close`, a ``with`` block, or when collected
    (layers read or prepared from it own their memory and outlive it)."""

    _free = "mxmoe_checkpoint_close"

    def __init__(self, path: str | os.PathLike):
        self._handle = 0
        encoded = _path(path, "path")
        self.path = os.fsdecode(encoded)
        handle = ctypes.c_void_p()
        _lib.check(_lib.lib.mxmoe_checkpoint_open(encoded, ctypes.byref(handle)))
        self._handle = handle.value
        self.layers: list[LayerInfo] = self._read_layers()

    def _live(self) -> int:
        if not self._handle:
            raise invalid("checkpoint", "an open checkpoint", "one that was closed")
        return self._handle

    def _read_layers(self) -> list[LayerInfo]:
        count = ctypes.c_int64()
        _lib.check(_lib.lib.mxmoe_checkpoint_layer_count(self._live(), ctypes.byref(count)))
        layers = []
        for i in range(count.value):
            c = _lib.LayerInfoC()
            _lib.check(_lib.lib.mxmoe_checkpoint_layer_info(self._live(), i, ctypes.byref(c)))
            optional = {name: _lib.DTYPE_NAMES[getattr(c, f"{name}_dtype")] for name in _lib.OPTIONAL_DTYPE_FIELDS
                        if getattr(c, f"{name}_dtype") != _lib.ABSENT}
            layers.append(LayerInfo(c.layer, _lib.CHECKPOINT_LAYOUTS[c.layout], _lib.DTYPE_NAMES[c.weight_dtype],
                                    _lib.WEIGHT_FORMATS[c.format], MoEConfig._from_c(c.config), optional))
        return layers

    def layer_info(self, layer: int | None = None) -> LayerInfo:
        """The :class:`LayerInfo` of decoder layer ``layer`` (default: the first MoE layer)."""
        if not self.layers:
            raise invalid("path", "a checkpoint with MoE layers", f"none in {self.path}")
        if layer is None:
            return self.layers[0]
        for info in self.layers:
            if info.layer == layer:
                return info
        raise invalid("layer", "one of the MoE layers " + ", ".join(str(i.layer) for i in self.layers), repr(layer))

    def read_layer(self, layer: int | None = None) -> MoEWeights:
        """Copy decoder layer ``layer``'s weights (default: the first MoE layer) into
        :class:`MoEWeights` of CPU torch tensors: MXFP4 as stored, BF16 layers (any float type) as
        bf16 [E, 2I, H] with gate/up interleaved and [E, H, I]; biases and router tensors in the
        file's dtypes."""
        info = self.layer_info(layer)
        dtypes = {"mxfp4": {"gate_up_blocks": _lib.U8, "gate_up_scales": _lib.U8, "down_blocks": _lib.U8,
                            "down_scales": _lib.U8},
                  "bf16": {"gate_up": _lib.BF16, "down": _lib.BF16}}[info.format]
        dtypes.update({name: _lib.DTYPE_NAMES.index(dt) for name, dt in info.optional.items()})
        weights = MoEWeights._allocate(info.config, info.format, dtypes)
        cw = weights_c(weights.tensors, prefix="out", writable=True)
        _lib.check(_lib.lib.mxmoe_checkpoint_read_layer(self._live(), info.layer, ctypes.byref(cw)))
        return weights

    def prepare_layer(self, layer: int | None = None, device: Any = "cpu", config: MoEConfig | None = None, *,
                      expert_map: Sequence[int] | None = None, tp_rank: int = 0, tp_ranks: int = 1) -> PreparedMoE:
        """Prepare decoder layer ``layer`` (default: the first MoE layer) for ``device`` straight
        from the file (the MXFP4 bytes go from the mapping into the prepared layer), with
        ``config`` (default: the layer's own, :attr:`LayerInfo.config`). BF16 layers: CPU only.

        ``expert_map``, ``tp_rank``, ``tp_ranks``: what :func:`mxmoe.prepare` takes
        (docs/parallel.md), on the file's whole layer: the map's held experts are taken out of the
        file (only theirs copied, in local order), and a tensor-parallel shard is cut out of the
        mapped MXFP4 weights (``config.intermediate`` of the result is then I_r)."""
        info = self.layer_info(layer)
        cfg = config if config is not None else info.config
        target = parse_device(device)
        options = prepare_options_c(expert_map, tp_rank, tp_ranks)
        handle = ctypes.c_void_p()
        _lib.check(_lib.lib.mxmoe_checkpoint_prepare_layer_with_options(
            self._live(), info.layer, ctypes.byref(cfg._to_c()), ctypes.byref(options), target[0], target[1],
            ctypes.byref(handle)))
        return PreparedMoE(handle.value, None if _sharded(tp_rank, tp_ranks) else cfg, target)

    def __repr__(self) -> str:
        state = "" if self._handle else ", closed"
        return f"Checkpoint({self.path!r}, {len(self.layers)} MoE layers{state})"


def load_layer(path: str | os.PathLike, layer: int | None = None, device: Any = "cpu",
               config: MoEConfig | None = None, **options: Any) -> PreparedMoE:
    """Open ``path``, prepare decoder layer ``layer`` (default: the first MoE layer) for
    ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"``) and close the file:
    :meth:`Checkpoint.prepare_layer` (``options``: ``expert_map``, ``tp_rank``, ``tp_ranks``)."""
    with Checkpoint(path) as file:
        return file.prepare_layer(layer, device, config, **options)


@dataclass(frozen=True)
class TensorReport:
    """One converted tensor: its name in the output (the MXFP4 blocks), shape and statistics."""

    name: str
    shape: tuple[int, ...]
    stats: QuantStats


@dataclass(frozen=True)
class QuantizeReport:
    """What :func:`quantize_checkpoint` did (mxmoe::quantize_report)."""

    tensors: list[TensorReport]  #: gate_up and down of every MoE layer, in layer order
    total: QuantStats  #: all of them merged
    copied_tensors: int  #: tensors copied unchanged (router, biases, attention, ...)
    copied_bytes: int
    input_bytes: int  #: tensor data, headers excluded
    output_bytes: int
    seconds: float  #: wall time of the whole conversion


ProgressFn = Callable[[int, int, str], Any]


class _Progress:
    """A Python progress function as the C ABI's callback: an exception it raises stops the
    conversion (the callback returns 1) and is re-raised as the cause of :class:`Cancelled`."""

    def __init__(self, fn: ProgressFn | None):
        self.fn, self.error = fn, None
        self.c = _lib.PROGRESS_FN(self._call) if fn is not None else _lib.PROGRESS_FN()

    def _call(self, done: int, total: int, note: bytes, _data) -> int:
        try:
            self.fn(done, total, note.decode("utf-8", "replace"))
            return 0
        except BaseException as e:  # noqa: BLE001 - re-raised after the C call returns
            self.error = e
            return 1

    def check(self, status: int) -> None:
        if status == _lib.ERR_CANCELLED and self.error is not None:
            if isinstance(self.error, (KeyboardInterrupt, SystemExit)):
                raise self.error
            raise Cancelled(f"the conversion stopped: the progress callback raised {self.error!r}") from self.error
        _lib.check(status)


def quantize_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, rule: str = "even", *, device: Any = "cpu",
                        overwrite: bool = False, progress: ProgressFn | None = None,
                        allow_nonfinite: bool = False) -> QuantizeReport:
    """BF16 MoE checkpoint ``src`` -> MXFP4 checkpoint ``dst`` (mxmoe::quantize_checkpoint):
    every MoE layer (gpt-oss fused or Qwen3/DeepSeek per-expert names; BF16, F16 or F32) becomes
    the gpt-oss MXFP4 layout quantized with ``rule``; every other tensor is copied. Streams (about
    one expert in memory); written to a temporary file and renamed, so a failure leaves no output.

    Args:
        rule: ``"floor"``, ``"even"``, ``"rceil"`` or ``"mse"``.
        device: where the quantizer runs (``"cpu"``, ``"cuda[:N]"``); the bytes are the same.
        overwrite: replace an existing ``dst``.
        progress: ``progress(done, total, note)`` after every step; an exception it raises stops
            the conversion (:class:`~mxmoe.Cancelled`, or the KeyboardInterrupt itself).
        allow_nonfinite: keep NaN / Inf weights as NaN blocks (scale 0xFF, counted in
            ``nonfinite_blocks``). Otherwise they raise :class:`~mxmoe.InvalidArgument` whose
            ``argument`` is the tensor as the file names it; the message names the expert and the
            first ``[row, col]``; nothing is written.
    """
    target = parse_device(device)
    cb = _Progress(progress)
    options = _lib.QuantizeOptionsC(_lib.index(_lib.RULES, rule, "rule"), target[0], target[1], int(bool(overwrite)),
                                    cb.c, None, int(bool(allow_nonfinite)))
    handle = ctypes.c_void_p()
    cb.check(_lib.lib.mxmoe_quantize_checkpoint(_path(src, "src"), _path(dst, "dst"), ctypes.byref(options),
                                                ctypes.byref(handle)))
    try:
        s = _lib.QuantizeSummaryC()
        _lib.check(_lib.lib.mxmoe_quantize_report_summary(handle, ctypes.byref(s)))
        tensors = []
        for i in range(s.tensors):
            t = _lib.TensorReportC()
            _lib.check(_lib.lib.mxmoe_quantize_report_tensor(handle, i, ctypes.byref(t)))
            tensors.append(TensorReport(t.name.decode(), tuple(t.shape[: t.ndim]), QuantStats._from_c(t.stats)))
        return QuantizeReport(tensors, QuantStats._from_c(s.total), s.copied_tensors, s.copied_bytes, s.input_bytes,
                              s.output_bytes, s.seconds)
    finally:
        _lib.lib.mxmoe_quantize_report_free(handle)


def dequantize_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, *, overwrite: bool = False,
                          progress: ProgressFn | None = None) -> None:
    """MXFP4 checkpoint ``src`` -> BF16 checkpoint ``dst`` in the gpt-oss BF16 layout
    (mxmoe::dequantize_checkpoint; exact: every MXFP4 value is a bf16 value). ``overwrite`` and
    ``progress`` as in :func:`quantize_checkpoint`."""
    cb = _Progress(progress)
    cb.check(_lib.lib.mxmoe_dequantize_checkpoint(_path(src, "src"), _path(dst, "dst"), int(bool(overwrite)), cb.c,
                                                  None))
