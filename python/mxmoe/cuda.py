"""The sm_90a CUDA backend: whether it can run here, and why not."""

from __future__ import annotations

import ctypes

from . import _lib


def _query(device: int) -> tuple[bool, str]:
    ok = ctypes.c_int32()
    why = ctypes.create_string_buffer(512)
    _lib.check(_lib.lib.mxmoe_cuda_available(device, ctypes.byref(ok), why, len(why)))
    return bool(ok.value), why.value.decode("utf-8", "replace")


def available(device: int = 0) -> bool:
    """True when this build has the CUDA backend and device ``device`` is an sm_90 GPU (H100,
    H200). Needs no CUDA installation to answer: the CUDA runtime is linked in statically."""
    return _query(device)[0]


def why_unavailable(device: int = 0) -> str | None:
    """Why :func:`available` is False (``"mxmoe was built without CUDA"``, ``"no CUDA device
    (...)"``, ``"NVIDIA A100 ... is sm_80; ..."``); None when it is True."""
    ok, why = _query(device)
    return None if ok else why


def built_with_cuda() -> bool:
    """True when the library was built with nvcc present (the sm_90a kernels are compiled in)."""
    return bool(_lib.lib.mxmoe_built_with_cuda())


def device_name(device: int = 0) -> str:
    """The CUDA device's name, or ``"none ..."``."""
    name = ctypes.create_string_buffer(256)
    _lib.check(_lib.lib.mxmoe_cuda_device_name(device, name, len(name)))
    return name.value.decode("utf-8", "replace")
