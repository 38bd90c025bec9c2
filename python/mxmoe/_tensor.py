"""Arrays from torch, numpy or anything with DLPack as packed ``mxmoe_tensor`` views, no copies.

``view(obj, name)`` describes an array to the C ABI: torch tensors are read by the extension
(mxmoe._hotpath: pointer, dtype, shape, strides, device from one DLPack capsule of
torch.utils.dlpack.to_dlpack; the forward reads them there without coming back to Python), numpy
arrays through their attributes, anything
else through its ``__dlpack__`` capsule (DLPack's ``DLManagedTensor``, kept alive by the returned
view for the length of the call). Unsupported dtypes and devices raise
:class:`~mxmoe.InvalidArgument` naming ``name``; shapes, strides and the rest are checked by the
library itself.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

from . import _lib
from ._errors import invalid

_DTYPE_EXPECTED = "dtype bf16 | f16 | f32 | u8 | i32 | i64"
_FORMATS = _lib.TENSOR_FORMATS
_torch_dtypes: dict[Any, int] = {}
_torch_by_code: dict[int, Any] = {}


def is_torch(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def is_numpy(obj: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.ndarray)


_torch_tensor_type: Any = None  # torch.Tensor once torch is in use: the first check in view()
_raw_stream: Any = None  # device index -> torch's current cudaStream_t there, as an int


def bind_torch() -> None:
    """The dtype tables, and torch handed to the extension (mxmoe._hotpath reads torch tensors
    itself), once torch is in use."""
    global _torch_tensor_type, _raw_stream
    torch = sys.modules["torch"]
    pairs = [(torch.bfloat16, _lib.BF16), (torch.float16, _lib.F16), (torch.float32, _lib.F32),
             (torch.uint8, _lib.U8), (torch.int32, _lib.I32), (torch.int64, _lib.I64)]
    _torch_dtypes.update(pairs)
    _torch_by_code.update((code, dt) for dt, code in pairs)
    # What inductor's generated code calls (torch._C, no Stream object per call); the public
    # spelling where a torch build lacks it (no CUDA).
    _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
        lambda device: torch.cuda.current_stream(device).cuda_stream)
    import torch.utils.dlpack

    _lib.hotpath.bind_torch(torch.Tensor, torch.utils.dlpack.to_dlpack, torch.empty_like, _raw_stream,
                            torch.contiguous_format)
    _torch_tensor_type = torch.Tensor


def torch_dtype(code: int):
    """The torch dtype of a C ABI dtype code."""
    if not _torch_by_code:
        bind_torch()
    return _torch_by_code[code]


def _rank_error(ndim: int, name: str):
    return invalid(name, f"a tensor of rank <= {_lib.MAX_RANK}", f"rank {ndim}")


def torch_view(t, name: str) -> bytes:
    """A torch tensor's own pointer, dtype, shape, strides and device (read by the extension)."""
    if _torch_tensor_type is None:
        bind_torch()
    return _lib.hotpath.torch_view(t, name)


def torch_reject(t, name: str, error: BaseException | None) -> None:
    """Raises why the extension could not read torch tensor ``t`` (argument ``name``); ``error``
    is what torch raised, if anything (a layout DLPack cannot describe)."""
    code = _torch_dtypes.get(t.dtype)
    if code is None:
        raise invalid(name, _DTYPE_EXPECTED, str(t.dtype).replace("torch.", ""))
    if not (t.is_cuda or t.is_cpu):
        raise invalid(name, "a cpu or cuda tensor", f"a tensor on {t.device}")
    if t.layout != sys.modules["torch"].strided:  # sparse, mkldnn: no strided storage
        raise invalid(name, "a strided (dense) tensor", f"layout {t.layout}")
    if t.dim() > _lib.MAX_RANK:
        raise _rank_error(t.dim(), name)
    raise invalid(name, "a tensor torch.utils.dlpack.to_dlpack can export", str(error)) from error


_NUMPY_CODES = {"bfloat16": _lib.BF16, "float16": _lib.F16, "float32": _lib.F32, "uint8": _lib.U8,
                "int32": _lib.I32, "int64": _lib.I64}


def _numpy_view(a, name: str, writable: bool) -> bytes:
    code = _NUMPY_CODES.get(a.dtype.name)
    if code is None:
        raise invalid(name, _DTYPE_EXPECTED, a.dtype.name)
    if writable and not a.flags.writeable:
        raise invalid(name, "a writable array", "a read-only array")
    if a.ndim > _lib.MAX_RANK:
        raise _rank_error(a.ndim, name)
    item = a.itemsize
    if any(s % item for s in a.strides):
        raise invalid(name, "strides that are whole elements", f"byte strides {a.strides}")
    return _FORMATS[a.ndim].pack(a.ctypes.data, code, _lib.DEVICE_CPU, 0, a.ndim, *a.shape,
                                 *(s // item for s in a.strides))


# ---- DLPack (https://dmlc.github.io/dlpack/latest/c_api.html) ------------------------------
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DL_CPU, _DL_CUDA, _DL_CUDA_HOST = 1, 2, 3
_DL_CODES = {(0, 32): _lib.I32, (0, 64): _lib.I64, (1, 8): _lib.U8, (2, 16): _lib.F16, (2, 32): _lib.F32,
             (4, 16): _lib.BF16}
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class _KeptView(bytes):
    """Packed view bytes that also hold the DLPack capsule: the producer frees its tensor when
    the capsule is collected (it is never marked consumed)."""


def _dlpack_view(obj, name: str, stream: int | None) -> bytes:
    device_type, _ = obj.__dlpack_device__()
    if device_type == _DL_CUDA:
        # The producer makes its data ready for our stream (None: the legacy default stream, 1).
        capsule = obj.__dlpack__(stream=1 if stream is None else stream)
    elif device_type in (_DL_CPU, _DL_CUDA_HOST):
        capsule = obj.__dlpack__()
    else:
        raise invalid(name, "a cpu or cuda array", f"DLPack device type {device_type}")
    dl = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    code = _DL_CODES.get((dl.dtype.code, dl.dtype.bits)) if dl.dtype.lanes == 1 else None
    if code is None:
        raise invalid(name, _DTYPE_EXPECTED,
                      f"DLPack dtype code {dl.dtype.code}, {dl.dtype.bits} bits, {dl.dtype.lanes} lanes")
    ndim = dl.ndim
    if ndim > _lib.MAX_RANK:
        raise _rank_error(ndim, name)
    shape = [dl.shape[i] for i in range(ndim)]
    if dl.strides:
        strides = [dl.strides[i] for i in range(ndim)]
    else:  # compact row-major
        strides, stride = [0] * ndim, 1
        for i in reversed(range(ndim)):
            strides[i] = stride
            stride *= shape[i]
    cuda = device_type == _DL_CUDA
    kept = _KeptView(_FORMATS[ndim].pack((dl.data or 0) + dl.byte_offset, code,
                                         _lib.DEVICE_CUDA if cuda else _lib.DEVICE_CPU,
                                         dl.device.device_id if cuda else 0, ndim, *shape, *strides))
    kept.capsule = capsule
    return kept


def view(obj: Any, name: str, writable: bool = False, stream: int | None = None) -> bytes | None:
    """The packed ``mxmoe_tensor`` of ``obj`` (None for None). Keep the result referenced until
    the C call returns. ``writable``: the call writes it (a read-only numpy array is refused);
    ``stream``: where a CUDA DLPack producer makes its data ready (None: the legacy default)."""
    if obj is None:
        return None
    if type(obj) is _torch_tensor_type or is_torch(obj):
        return torch_view(obj, name)
    if is_numpy(obj):
        return _numpy_view(obj, name, writable)
    if hasattr(obj, "__dlpack__"):
        return _dlpack_view(obj, name, stream)
    raise invalid(name, "a torch tensor, a numpy array or an object with __dlpack__", type(obj).__name__)


def device_of(obj: Any) -> tuple[int, int]:
    """(device type, device id) of an array as the C ABI names them."""
    if is_torch(obj):
        return (_lib.DEVICE_CUDA, obj.get_device()) if obj.is_cuda else (_lib.DEVICE_CPU, 0)
    if is_numpy(obj) or not hasattr(obj, "__dlpack_device__"):
        return (_lib.DEVICE_CPU, 0)
    device_type, device_id = obj.__dlpack_device__()
    return (_lib.DEVICE_CUDA, device_id) if device_type == _DL_CUDA else (_lib.DEVICE_CPU, 0)


def current_raw_stream(device: int) -> int:
    """torch's current cudaStream_t on cuda:``device``, as an int."""
    if _raw_stream is None:
        bind_torch()
    return _raw_stream(device)


def current_stream(obj: Any, stream: int | None) -> int | None:
    """The stream a call on ``obj`` runs on: ``stream`` if given, else torch's current stream on a
    CUDA tensor's device, else None (the legacy default stream). The extension's forward decides
    the same way (hotpath.c, stream_of)."""
    if stream is not None:
        return stream
    if is_torch(obj) and obj.is_cuda:
        if _raw_stream is None:
            bind_torch()
        return _raw_stream(obj.get_device())
    return None


def empty(like: Any, shape: tuple[int, ...], code: int, name: str):
    """A new array of ``shape`` and dtype ``code``, of the kind and on the device of ``like``."""
    if is_torch(like):
        return sys.modules["torch"].empty(shape, dtype=torch_dtype(code), device=like.device)
    if is_numpy(like):
        if code == _lib.BF16:
            raise invalid(name, "an output array (numpy has no bfloat16: pass out=)", "none")
        np = sys.modules["numpy"]
        return np.empty(shape, dtype=next(k for k, v in _NUMPY_CODES.items() if v == code))
    raise invalid(name, f"an output array (mxmoe allocates torch tensors and numpy arrays; for "
                        f"{type(like).__name__} pass out=)", "none")


def empty_like(like: Any, name: str):
    """A new array with the shape, dtype, device (and strides: callers pass contiguous arrays)
    of ``like`` (torch or numpy)."""
    if is_torch(like):
        return sys.modules["torch"].empty_like(like)
    if is_numpy(like):
        return sys.modules["numpy"].empty_like(like, order="C")
    raise invalid(name, f"an output array (mxmoe allocates torch tensors and numpy arrays; for "
                        f"{type(like).__name__} pass out=)", "none")


def buffer(obj: Any, name: str) -> tuple[int, int, tuple[int, int]]:
    """(pointer, bytes, (device type, device id)) of a contiguous array used as raw memory (a
    workspace, a statistics record); InvalidArgument naming ``name`` when it is not contiguous."""
    return _lib.hotpath.buffer(obj, name)


_lib.hotpath.bind(other_view=view, other_empty_like=empty_like, torch_reject=torch_reject)
