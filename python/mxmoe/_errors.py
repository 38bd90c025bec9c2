"""Exceptions raised by mxmoe: what the C++ library reports, as Python exceptions.

======================  ==============================  ==========================
C++ (``mxmoe/error.h``)  C ABI status                    Python
======================  ==============================  ==========================
mxmoe::invalid_argument  MXMOE_ERR_INVALID_ARGUMENT      :class:`InvalidArgument`
mxmoe::unsupported       MXMOE_ERR_UNSUPPORTED           :class:`Unsupported`
std::bad_alloc, cudaMalloc failure  MXMOE_ERR_OUT_OF_MEMORY  :class:`OutOfMemory`
CUDA runtime error       MXMOE_ERR_RUNTIME               :class:`RuntimeFailure`
mxmoe::format_error      MXMOE_ERR_FORMAT                :class:`FormatError`
std::system_error (I/O)  MXMOE_ERR_IO                    :class:`IOFailure`
a progress callback stop MXMOE_ERR_CANCELLED             :class:`Cancelled`
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


class FormatError(Error, ValueError):
    """A malformed safetensors file or checkpoint; the message names the file, the tensor and
    what is wrong."""


class IOFailure(Error, OSError):
    """A file could not be opened, read or written. ``errno`` is the system's error number
    (``errno.ENOENT`` for a missing file)."""

    def __init__(self, errno: int, message: str):
        super().__init__(errno, message)


class Cancelled(Error):
    """A checkpoint conversion stopped because its progress callback raised (the exception is
    this one's ``__cause__``); no output was written."""


def invalid(argument: str, expected: str, got: str) -> InvalidArgument:
    """An :class:`InvalidArgument` worded like the C++ library's own."""
    return InvalidArgument(argument, f"argument '{argument}': expected {expected}, got {got}")
