"""Exceptions raised by mxmoe: what the C++ library reports, as Python exceptions.

======================  ==============================  ==========================
C++ (``mxmoe/error.h``)  C ABI status                    Python
======================  ==============================  ==========================
mxmoe::invalid_argument  MXMOE_ERR_INVALID_ARGUMENT      :class:`InvalidArgument`
mxmoe::unsupported       MXMOE_ERR_UNSUPPORTED           :class:`Unsupported`
std::bad_alloc, cudaMalloc failure  MXMOE_ERR_OUT_OF_MEMORY  :class:`OutOfMemory`
CUDA runtime error       MXMOE_ERR_RUNTIME               :class:`RuntimeFailure`
anything else            MXMOE_ERR_INTERNAL              :class:`Error`
======================  ==============================  ==========================
"""

from __future__ import annotations


class Error(Exception):
    """Base class of every exception mxmoe raises."""


class InvalidArgument(Error, ValueError):
    """Bad input (shape, dtype, device, stride, range). ``argument`` names the argument
    (``"x"``, ``"weights.gate_up_blocks"``, ``"cfg.routing.top_k"``); the message says what was
    expected and what was given. Nothing was written."""

    def __init__(self, argument: str, message: str):
        super().__init__(message)
        self.argument = argument


class Unsupported(Error, RuntimeError):
    """The call cannot run on this machine or build: no usable sm_90 GPU, a CPU-only build, or a
    path that backend does not have. mxmoe never falls back silently."""


class OutOfMemory(Error, MemoryError):
    """A host or device allocation failed."""


class RuntimeFailure(Error, RuntimeError):
    """A CUDA (or other runtime) error while running a call."""


def invalid(argument: str, expected: str, got: str) -> InvalidArgument:
    """An :class:`InvalidArgument` worded like the C++ library's own."""
    return InvalidArgument(argument, f"argument '{argument}': expected {expected}, got {got}")
