"""The C++ kernels of ``torch.ops.mxmoe.moe_forward`` and ``moe_forward_out``:
``libmxmoe_torch.so`` (python/native/torch_op.cpp), registered with torch's dispatcher through
PyTorch's stable ABI.

:mod:`mxmoe.torch` loads it (:func:`load`) after ``import torch`` and defining the ops' schemas:
loading registers its CPU and CUDA kernels. It is found next to the library (like
``_hotpath.abi3.so``: build/lib/ or the installed package) and built only where torch >= 2.10
was importable when the package was built. ``MXMOE_TORCH_NATIVE=0`` in the environment keeps it
unloaded (the kernel registered from Python then runs, as without the library). Nothing is
compiled at import.

Like the extension, it calls the C ABI through the function pointers of the library ctypes
loaded (:meth:`NativeOps.__init__` hands them over): one copy of libmxmoe_c.so in the process.
Every :class:`~mxmoe.PreparedMoE` is registered with it under its ``id``, and it owns the layer's
handle from then on: :meth:`PreparedMoE.close` releases it, and the library frees it once no
forward of it is running (a layer collected on one thread while another runs it through the op
is not freed under that forward).

Errors leave its kernel as C++ exceptions, which torch raises as ``ValueError`` (bad input) or
``RuntimeError``, with the message ``"mxmoe.<class>: <mxmoe's message>"``; :func:`translate`
turns them back into mxmoe's exceptions (``mxmoe.torch.moe_forward`` does it).
"""

from __future__ import annotations

import ctypes
import os
import re
from ctypes import POINTER, c_int32, c_int64, c_void_p
from typing import Any

from . import _errors, _lib

LIBRARY_FILE = "libmxmoe_torch.so"
DISABLE_ENV = "MXMOE_TORCH_NATIVE"  # "0": do not load it

# The C ABI functions the library calls, in the order mxmoe_torch_bind takes them (torch_op.cpp,
# abi_functions).
_BOUND = ("mxmoe_moe_forward", "mxmoe_moe_workspace_bytes", "mxmoe_stream_capturing", "mxmoe_device_alloc",
          "mxmoe_device_free", "mxmoe_moe_free", "mxmoe_last_error")
_PROTOTYPES = {
    "mxmoe_torch_abi_version": (c_int32, []),
    "mxmoe_torch_bind": (c_int32, [POINTER(c_void_p), c_int32, c_int64]),
    "mxmoe_torch_set_kept_workspace_bytes": (None, [c_int64]),
    "mxmoe_torch_layer_add": (c_int32, [c_int64, c_void_p, c_int32, c_int32]),
    "mxmoe_torch_layer_release": (None, [c_int64]),
    "mxmoe_torch_layer_workspaces": (c_int64, [c_int64, POINTER(c_void_p), POINTER(c_void_p), POINTER(c_int64),
                                               c_int64]),
}


class NativeOps:
    """The loaded op library: its kernels registered, bound to the package's C ABI library."""

    def __init__(self, path, kept_workspace_bytes: int):
        lib = ctypes.CDLL(str(path))  # registers the kernels (static initializers)
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        if lib.mxmoe_torch_abi_version() != _lib.ABI_VERSION:
            raise OSError(f"{path} was built for C ABI version {lib.mxmoe_torch_abi_version()}, this package "
                          f"expects {_lib.ABI_VERSION}: rebuild it with the library")
        functions = (c_void_p * len(_BOUND))(*(ctypes.cast(getattr(_lib.lib, n), c_void_p).value for n in _BOUND))
        if lib.mxmoe_torch_bind(functions, len(_BOUND), kept_workspace_bytes) != 0:
            raise OSError(f"{path} expects other C ABI functions than this package hands over: rebuild it")
        self.path = path
        self._lib = lib

    def adopt(self, layer) -> None:
        """Registers ``layer`` under its id; the library owns its handle from now on."""
        if self._lib.mxmoe_torch_layer_add(layer.id, layer._handle, *layer._device) != 0:
            raise _errors.Error(f"mxmoe: layer id {layer.id} could not be registered with {self.path}")
        layer._native = self

    def release(self, layer_id: int) -> None:
        """The layer is gone: forwards naming it raise, and it is freed once none is running."""
        self._lib.mxmoe_torch_layer_release(layer_id)

    def set_kept_workspace_bytes(self, nbytes: int) -> None:
        """The size of the workspaces kept per stream from now on (mxmoe._moe.CACHED_WORKSPACE_BYTES)."""
        self._lib.mxmoe_torch_set_kept_workspace_bytes(nbytes)

    def workspaces(self, layer) -> dict[int, tuple[int, int]]:
        """The workspaces the op keeps for ``layer``: ``{cudaStream_t: (pointer, bytes)}``."""
        for capacity in (8, 1 << 16):
            streams, ptrs, sizes = (c_void_p * capacity)(), (c_void_p * capacity)(), (c_int64 * capacity)()
            n = self._lib.mxmoe_torch_layer_workspaces(layer.id, streams, ptrs, sizes, capacity)
            if n <= capacity:
                return {streams[i] or 0: (ptrs[i], sizes[i]) for i in range(max(n, 0))}
        raise _errors.Error(f"mxmoe: layer id {layer.id} keeps more than {capacity} workspaces")


def load(kept_workspace_bytes: int) -> tuple[NativeOps | None, str | None]:
    """The op library loaded and bound (its kernels registered), or None and why it is not."""
    if os.environ.get(DISABLE_ENV) == "0":
        return None, f"{DISABLE_ENV}=0 is set"
    path = _lib.library_path.with_name(LIBRARY_FILE)
    if not path.is_file():
        return None, (f"{path} was not built (torch >= 2.10 was not importable when the package was built: "
                      "reinstall it with torch installed, e.g. scripts/setup.sh)")
    try:
        return NativeOps(path, kept_workspace_bytes), None
    except OSError as e:
        return None, f"{path} could not be loaded: {e}"


_MESSAGE = re.compile(r"mxmoe\.(\w+): (.*)", re.DOTALL)
_ARGUMENT = re.compile(r"argument '([^']*)'")
_CLASSES = {cls.__name__: cls for cls in (_errors.InvalidArgument, _errors.Unsupported, _errors.OutOfMemory,
                                          _errors.RuntimeFailure, _errors.FormatError, _errors.Error)}


def translate(error: BaseException) -> Any:
    """mxmoe's exception for an error the op library's kernel raised through torch, or None for
    any other error (mxmoe's own exceptions included)."""
    if isinstance(error, _errors.Error):
        return None
    match = _MESSAGE.fullmatch(str(error))
    if match is None:
        return None
    cls, message = _CLASSES.get(match[1], _errors.Error), match[2]
    if cls is _errors.InvalidArgument:
        argument = _ARGUMENT.match(message)
        return cls(argument[1] if argument else "", message)
    return cls(message)
