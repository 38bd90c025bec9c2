"""ctypes binding of the C ABI in ``include/mxmoe/c_api.h`` (``libmxmoe_c.so``), and the
extension module ``mxmoe._hotpath`` (``_hotpath.abi3.so``, python/native/hotpath.c) that runs the
per-call path (the forward, torch tensors read) in C over the same library.

The library is found, in order, at ``$MXMOE_LIBRARY`` (a path to the .so: for a build tree that
was not pip-installed) or next to this file (where ``pip install ./python`` puts it); the
extension next to the library (the build puts both in build/lib/). Both are required: without
the extension ``import mxmoe`` fails saying so; there is no pure-Python fallback. Nothing is
compiled at import.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import struct
import sys
from ctypes import POINTER, c_char_p, c_int32, c_int64, c_size_t, c_uint32, c_void_p
from pathlib import Path

from ._errors import (Cancelled, Error, FormatError, InvalidArgument, IOFailure, OutOfMemory, RuntimeFailure,
                      Unsupported, invalid)

ABI_VERSION = 5  # MXMOE_C_ABI_VERSION of the header these declarations mirror
MAX_RANK = 8

# Status codes
(OK, ERR_INVALID_ARGUMENT, ERR_UNSUPPORTED, ERR_OUT_OF_MEMORY, ERR_RUNTIME, ERR_INTERNAL, ERR_FORMAT, ERR_IO,
 ERR_CANCELLED) = range(9)
# Element types (mxmoe::dtype)
BF16, F16, F32, U8, I32, I64 = range(6)
ITEMSIZE = (2, 2, 4, 1, 4, 8)  # bytes per element, by dtype code
DEVICE_CPU, DEVICE_CUDA = 0, 1
RULES = ("floor", "even", "rceil", "mse")
SCALE_LAYOUTS = ("linear", "tiled_128x4")
ROUTING_KINDS = ("softmax_topk", "topk_softmax", "sigmoid_grouped_topk")
ACTIVATION_KINDS = ("silu_mul", "swiglu_clamped")
GATE_UP_ORDERS = ("concatenated", "interleaved")
WEIGHTS_MXFP4, WEIGHTS_BF16 = 0, 1
WEIGHT_FORMATS = ("mxfp4", "bf16")
DTYPE_NAMES = ("bf16", "f16", "f32", "u8", "i32", "i64")
VERIFY_STATUSES = ("passed", "failed", "nonfinite_output")
REFERENCES = ("f32", "f64", "auto")  # MXMOE_REFERENCE_F32, _F64, _AUTO; -1: none
CHECKPOINT_LAYOUTS = ("mxfp4_gpt_oss", "bf16_gpt_oss", "bf16_per_expert")
ABSENT = -1


# mxmoe_tensor (a non-owning pointer, dtype, device, shape, strides in elements) is passed as
# bytes packed by one struct.pack, which costs less than filling a ctypes.Structure. For each rank
# n: data, dtype, device_type, device_id, ndim, n sizes and n strides, each zero-padded to MAX_RANK.
TENSOR_FORMATS = tuple(
    struct.Struct(f"=Q4i{n}q{8 * (MAX_RANK - n)}x{n}q{8 * (MAX_RANK - n)}x") for n in range(MAX_RANK + 1)
)
TENSOR_BYTES = 152  # sizeof(mxmoe_tensor)
assert all(f.size == TENSOR_BYTES for f in TENSOR_FORMATS)


def unpack_tensor(packed: bytes) -> tuple[int, int, int, int, tuple[int, ...], tuple[int, ...]]:
    """(data, dtype, device_type, device_id, shape, strides) of a packed mxmoe_tensor."""
    fields = TENSOR_FORMATS[MAX_RANK].unpack(packed)
    ndim = fields[4]
    return fields[0], fields[1], fields[2], fields[3], fields[5 : 5 + ndim], fields[13 : 13 + ndim]


class QuantStatsC(ctypes.Structure):
    """mxmoe_quant_stats (the layout of mxmoe::quant_stats)."""

    _fields_ = [
        ("elements", c_int64),
        ("blocks", c_int64),
        ("saturated_blocks", c_int64),
        ("clamped_elements", c_int64),
        ("flushed_elements", c_int64),
        ("nonfinite_blocks", c_int64),
        ("signal_sq", ctypes.c_double),
        ("error_sq", ctypes.c_double),
    ]


class MoeConfigC(ctypes.Structure):
    """mxmoe_moe_config."""

    _fields_ = [
        ("experts", c_int64),
        ("hidden", c_int64),
        ("intermediate", c_int64),
        ("routing_kind", c_int32),
        ("top_k", c_int32),
        ("renormalize", c_int32),
        ("n_group", c_int32),
        ("topk_group", c_int32),
        ("routed_scaling_factor", ctypes.c_float),
        ("activation_kind", c_int32),
        ("alpha", ctypes.c_float),
        ("limit", ctypes.c_float),
        ("gate_up_order", c_int32),
    ]


WEIGHT_FIELDS = (
    "gate_up_blocks",
    "gate_up_scales",
    "down_blocks",
    "down_scales",
    "gate_up",
    "down",
    "gate_up_bias",
    "down_bias",
    "router_weight",
    "router_bias",
    "correction_bias",
)


class MoeWeightsC(ctypes.Structure):
    """mxmoe_moe_weights: checkpoint-layout tensors, NULL for the ones not given."""

    _fields_ = [("format", c_int32)] + [(name, c_char_p) for name in WEIGHT_FIELDS]


class VerifyResultC(ctypes.Structure):
    """mxmoe_verify_result."""

    _fields_ = [
        ("status", c_int32),
        ("reference", c_int32),
        ("elements", c_int64),
        ("nonfinite_out", c_int64),
        ("nonfinite_ref", c_int64),
        ("rel_l2", ctypes.c_double),
        ("max_abs", ctypes.c_double),
        ("max_ref", ctypes.c_double),
        ("tolerance_rel_l2", ctypes.c_double),
        ("tolerance_max_err_rel", ctypes.c_double),
        ("reference_seconds", ctypes.c_double),
    ]


class PrepareOptionsC(ctypes.Structure):
    """mxmoe_prepare_options."""

    _fields_ = [
        ("expert_map", POINTER(c_int32)),
        ("expert_map_size", c_int64),
        ("tp_rank", c_int32),
        ("tp_ranks", c_int32),
    ]


OPTIONAL_DTYPE_FIELDS = ("gate_up_bias", "down_bias", "router_weight", "router_bias", "correction_bias")


class LayerInfoC(ctypes.Structure):
    """mxmoe_layer_info."""

    _fields_ = [
        ("layer", c_int64),
        ("layout", c_int32),
        ("weight_dtype", c_int32),
        ("format", c_int32),
        *((f"{name}_dtype", c_int32) for name in OPTIONAL_DTYPE_FIELDS),
        ("config", MoeConfigC),
    ]


PROGRESS_FN = ctypes.CFUNCTYPE(c_int32, c_int64, c_int64, c_char_p, c_void_p)


class QuantizeOptionsC(ctypes.Structure):
    """mxmoe_quantize_options."""

    _fields_ = [
        ("rule", c_int32),
        ("device_type", c_int32),
        ("device_id", c_int32),
        ("overwrite", c_int32),
        ("progress", PROGRESS_FN),
        ("progress_data", c_void_p),
        ("allow_nonfinite", c_int32),
    ]


class QuantizeSummaryC(ctypes.Structure):
    """mxmoe_quantize_summary."""

    _fields_ = [
        ("total", QuantStatsC),
        ("tensors", c_int64),
        ("copied_tensors", c_int64),
        ("copied_bytes", ctypes.c_uint64),
        ("input_bytes", ctypes.c_uint64),
        ("output_bytes", ctypes.c_uint64),
        ("seconds", ctypes.c_double),
    ]


class TensorReportC(ctypes.Structure):
    """mxmoe_tensor_report."""

    _fields_ = [
        ("name", c_char_p),
        ("ndim", c_int32),
        ("shape", c_int64 * MAX_RANK),
        ("stats", QuantStatsC),
    ]


TensorP = c_char_p  # the bytes of an mxmoe_tensor (TENSOR_FORMATS), or None for NULL
_PROTOTYPES = {
    "mxmoe_abi_version": (c_int32, []),
    "mxmoe_version": (c_char_p, []),
    "mxmoe_built_with_cuda": (c_int32, []),
    "mxmoe_last_error": (c_char_p, []),
    "mxmoe_last_error_argument": (c_char_p, []),
    "mxmoe_cuda_available": (c_int32, [c_int32, POINTER(c_int32), c_char_p, c_size_t]),
    "mxmoe_cuda_device_name": (c_int32, [c_int32, c_char_p, c_size_t]),
    "mxmoe_stream_capturing": (c_int32, [c_void_p, POINTER(c_int32)]),
    "mxmoe_device_alloc": (c_int32, [c_int32, c_int64, POINTER(c_void_p)]),
    "mxmoe_device_free": (None, [c_int32, c_void_p]),
    "mxmoe_scale_bytes": (c_int32, [c_int64, c_int64, c_int32, POINTER(c_int64)]),
    "mxmoe_quantize": (c_int32, [TensorP, c_int32, c_int32, TensorP, TensorP, POINTER(QuantStatsC), c_void_p, c_void_p]),
    "mxmoe_dequantize": (c_int32, [TensorP, TensorP, c_int32, TensorP, c_void_p]),
    "mxmoe_moe_prepare": (c_int32, [POINTER(MoeConfigC), POINTER(MoeWeightsC), c_int32, c_int32, POINTER(c_void_p)]),
    "mxmoe_moe_prepare_with_options": (
        c_int32, [POINTER(MoeConfigC), POINTER(MoeWeightsC), POINTER(PrepareOptionsC), c_int32, c_int32,
                  POINTER(c_void_p)]),
    "mxmoe_moe_config_of": (c_int32, [c_void_p, POINTER(MoeConfigC)]),
    "mxmoe_moe_expert_map": (c_int32, [c_void_p, POINTER(c_int32), c_int64, POINTER(c_int64)]),
    "mxmoe_shard_intermediate": (c_int32, [c_int64, c_int32, c_int32, POINTER(c_int64), POINTER(c_int64)]),
    "mxmoe_contiguous_expert_map": (c_int32, [c_int64, c_int32, c_int32, POINTER(c_int32)]),
    "mxmoe_moe_free": (None, [c_void_p]),
    "mxmoe_moe_device": (c_int32, [c_void_p, POINTER(c_int32), POINTER(c_int32)]),
    "mxmoe_moe_workspace_bytes": (c_int32, [c_void_p, c_int64, POINTER(c_int64)]),
    "mxmoe_moe_weight_bytes": (c_int32, [c_void_p, POINTER(c_int64)]),
    "mxmoe_moe_forward": (
        c_int32,
        [c_void_p, TensorP, TensorP, TensorP, TensorP, TensorP, c_void_p, c_int64, c_void_p],
    ),
    "mxmoe_moe_error_flags": (c_int32, [c_void_p, c_void_p, c_int64, POINTER(c_uint32)]),
    "mxmoe_moe_forward_timed": (
        c_int32,
        [c_void_p, TensorP, TensorP, TensorP, TensorP, TensorP, c_void_p, c_int64, c_void_p, c_int64,
         POINTER(ctypes.c_double)],
    ),
    "mxmoe_last_error_code": (c_int32, []),
    "mxmoe_moe_config_validate": (c_int32, [POINTER(MoeConfigC)]),
    "mxmoe_forward_tolerance": (c_int32, [c_int32, POINTER(ctypes.c_double), POINTER(ctypes.c_double)]),
    "mxmoe_compare": (c_int32, [TensorP, TensorP, c_int32, POINTER(VerifyResultC)]),
    "mxmoe_verify": (
        c_int32,
        [POINTER(MoeConfigC), POINTER(MoeWeightsC), TensorP, TensorP, TensorP, TensorP, TensorP, c_int32, c_int32,
         POINTER(VerifyResultC)],
    ),
    "mxmoe_synthetic_layer": (c_int32, [POINTER(MoeConfigC), c_int32, c_int32, ctypes.c_uint64, POINTER(MoeWeightsC)]),
    "mxmoe_synthetic_inputs": (
        c_int32, [POINTER(MoeConfigC), POINTER(MoeWeightsC), c_int64, ctypes.c_uint64, TensorP, TensorP]),
    "mxmoe_preset_count": (c_int32, [POINTER(c_int32)]),
    "mxmoe_preset": (c_int32, [c_int32, POINTER(c_char_p), POINTER(MoeConfigC), POINTER(c_int32)]),
    "mxmoe_checkpoint_open": (c_int32, [c_char_p, POINTER(c_void_p)]),
    "mxmoe_checkpoint_close": (None, [c_void_p]),
    "mxmoe_checkpoint_layer_count": (c_int32, [c_void_p, POINTER(c_int64)]),
    "mxmoe_checkpoint_layer_info": (c_int32, [c_void_p, c_int64, POINTER(LayerInfoC)]),
    "mxmoe_checkpoint_read_layer": (c_int32, [c_void_p, c_int64, POINTER(MoeWeightsC)]),
    "mxmoe_checkpoint_prepare_layer": (
        c_int32, [c_void_p, c_int64, POINTER(MoeConfigC), c_int32, c_int32, POINTER(c_void_p)]),
    "mxmoe_checkpoint_prepare_layer_with_options": (
        c_int32, [c_void_p, c_int64, POINTER(MoeConfigC), POINTER(PrepareOptionsC), c_int32, c_int32,
                  POINTER(c_void_p)]),
    "mxmoe_quantize_checkpoint": (c_int32, [c_char_p, c_char_p, POINTER(QuantizeOptionsC), POINTER(c_void_p)]),
    "mxmoe_quantize_report_summary": (c_int32, [c_void_p, POINTER(QuantizeSummaryC)]),
    "mxmoe_quantize_report_tensor": (c_int32, [c_void_p, c_int64, POINTER(TensorReportC)]),
    "mxmoe_quantize_report_free": (None, [c_void_p]),
    "mxmoe_dequantize_checkpoint": (c_int32, [c_char_p, c_char_p, c_int32, PROGRESS_FN, c_void_p]),
}


def _library_path() -> Path:
    env = os.environ.get("MXMOE_LIBRARY")
    if env:
        return Path(env)
    return Path(__file__).with_name("libmxmoe_c.so")


def _load() -> ctypes.CDLL:
    path = _library_path()
    if not path.is_file():
        raise ImportError(
            f"mxmoe: the native library is not at {path}: install the package with `pip install ./python` "
            "(from the repository root, after scripts/setup.sh), or point MXMOE_LIBRARY at a built "
            "libmxmoe_c.so (build/lib/libmxmoe_c.so)"
        )
    lib = ctypes.CDLL(str(path))
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    if lib.mxmoe_abi_version() != ABI_VERSION:
        raise ImportError(
            f"mxmoe: {path} has C ABI version {lib.mxmoe_abi_version()}, this package expects {ABI_VERSION}: "
            "rebuild and reinstall the package"
        )
    return lib


HOTPATH_FILE = "_hotpath.abi3.so"


def _load_hotpath(library: Path):
    path = library.with_name(HOTPATH_FILE)
    if not path.is_file():
        raise ImportError(
            f"mxmoe: the extension module {HOTPATH_FILE} is not at {path} (next to {library.name}): reinstall the "
            "package with `pip install ./python`, or build it into the same folder as the library "
            "(`cmake --build build --target mxmoe_hotpath`: it needs the Python headers, Debian's python3-dev)"
        )
    name = f"{__package__}._hotpath"
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path, loader=loader))
    loader.exec_module(module)
    if module.ABI_VERSION != ABI_VERSION:
        raise ImportError(f"mxmoe: {path} was built for C ABI version {module.ABI_VERSION}, this package expects "
                          f"{ABI_VERSION}: rebuild it with the library")
    sys.modules[name] = module
    return module


lib = _load()
library_path = _library_path()
hotpath = _load_hotpath(library_path)

_EXCEPTIONS = {ERR_UNSUPPORTED: Unsupported, ERR_OUT_OF_MEMORY: OutOfMemory, ERR_RUNTIME: RuntimeFailure,
               ERR_FORMAT: FormatError, ERR_CANCELLED: Cancelled}


def raise_last_error(status: int) -> None:
    """Raises the exception for a failed call's status (the thread's last error)."""
    message = (lib.mxmoe_last_error() or b"").decode("utf-8", "replace")
    if status == ERR_INVALID_ARGUMENT:
        argument = (lib.mxmoe_last_error_argument() or b"").decode("utf-8", "replace")
        raise InvalidArgument(argument, message)
    if status == ERR_IO:
        raise IOFailure(lib.mxmoe_last_error_code(), message)
    raise _EXCEPTIONS.get(status, Error)(message)


def _address(fn) -> int:
    return ctypes.cast(fn, c_void_p).value


hotpath.bind(forward=_address(lib.mxmoe_moe_forward), workspace_bytes=_address(lib.mxmoe_moe_workspace_bytes),
             device=_address(lib.mxmoe_moe_device), stream_capturing=_address(lib.mxmoe_stream_capturing),
             raise_last_error=raise_last_error, invalid=invalid)


def check(status: int) -> None:
    if status:
        raise_last_error(status)


def index(names: tuple[str, ...], value: str, argument: str) -> int:
    """The C enum value of a name (``"even"`` -> 1); InvalidArgument naming ``argument``."""
    try:
        return names.index(value)
    except ValueError:
        raise invalid(argument, " | ".join(names), repr(value)) from None


class Owned:
    """A Python object that owns a C object (``_handle``), freed by ``_free`` (the name of the C
    ABI's free function) on :meth:`close` (idempotent), at the end of a ``with`` block, or when
    collected."""

    _free = ""
    _handle = 0

    def close(self) -> None:
        handle, self._handle = self._handle, 0
        if handle and lib is not None:  # None while the interpreter shuts down
            getattr(lib, self._free)(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
