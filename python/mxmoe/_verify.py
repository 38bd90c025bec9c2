"""Is a backend's output right? The library's comparison with the CPU reference and the documented
tolerance of each backend (include/mxmoe/verify.h), through mxmoe_verify / mxmoe_compare."""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

from . import _lib, _tensor
from ._errors import invalid
from ._moe import MoEWeights, parse_device


@dataclass(frozen=True)
class Tolerance:
    """The bounds a backend's forward is held to against the float64 reference on the same
    weights (mxmoe::tolerance_for): rel-L2 <= ``rel_l2`` and max |out - ref| <= ``max_err_rel``
    · max |ref| (``inf``: not checked). CPU: 1e-4 (float32 accumulation). CUDA: 4e-3 and 1.5e-2
    (bf16 activation, expert outputs and output; docs/moe_layer.md)."""

    rel_l2: float
    max_err_rel: float


def forward_tolerance(device: Any = "cpu") -> Tolerance:
    """The :class:`Tolerance` of the backend on ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"``)."""
    rel, max_err = ctypes.c_double(), ctypes.c_double()
    _lib.check(_lib.lib.mxmoe_forward_tolerance(parse_device(device)[0], ctypes.byref(rel), ctypes.byref(max_err)))
    return Tolerance(rel.value, max_err.value)


@dataclass(frozen=True)
class Verification:
    """What :func:`verify` and :func:`compare` found (mxmoe::verify_result).

    Attributes:
        status: ``"passed"``, ``"failed"`` (beyond the tolerance, or a non-finite reference) or
            ``"nonfinite_output"`` (NaN / Inf in the output where the reference is finite).
        rel_l2: ||out - ref|| / ||ref|| in float64 (inf once a difference is not finite).
        max_abs: max |out - ref|; max_ref: max |ref| over its finite elements.
        tolerance: the backend's :class:`Tolerance`.
        reference: precision of the reference run (``"f64"`` | ``"f32"``; None from :func:`compare`).
        reference_seconds: how long the reference took.
    """

    status: str
    rel_l2: float
    max_abs: float
    max_ref: float
    tolerance: Tolerance
    elements: int
    nonfinite_out: int
    nonfinite_ref: int
    reference: str | None
    reference_seconds: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def max_err_rel(self) -> float:
        """max |out - ref| / max |ref| (what ``tolerance.max_err_rel`` bounds)."""
        return self.max_abs / self.max_ref if self.max_ref > 0 else (0.0 if self.max_abs == 0 else math.inf)

    def __str__(self) -> str:
        ref = f" vs the cpu {self.reference} reference" if self.reference else ""
        return (f"{self.status}{ref}: rel-L2 {self.rel_l2:.3e} (<= {self.tolerance.rel_l2:.0e}), max abs "
                f"{self.max_abs:.3e} of max |ref| {self.max_ref:.3e}")


def _result(r: _lib.VerifyResultC) -> Verification:
    return Verification(_lib.VERIFY_STATUSES[r.status], r.rel_l2, r.max_abs, r.max_ref,
                        Tolerance(r.tolerance_rel_l2, r.tolerance_max_err_rel), r.elements, r.nonfinite_out,
                        r.nonfinite_ref, _lib.REFERENCES[r.reference] if r.reference >= 0 else None,
                        r.reference_seconds)


def _host(obj: Any) -> Any:
    """A host copy of a CUDA torch tensor (the reference runs on the host); anything else as it is."""
    if _tensor.is_torch(obj) and obj.is_cuda:
        return obj.detach().cpu()
    return obj


def _backend(backend: Any, out: Any) -> int:
    if backend is not None:
        return parse_device(backend)[0]
    return _tensor.device_of(out)[0]


def compare(out: Any, ref: Any, backend: Any = None) -> Verification:
    """Compare ``out`` with ``ref`` (f32 | bf16, one shape; CUDA tensors are copied to the host)
    and judge it under the tolerance of ``backend`` (default: where ``out`` is)."""
    device_type = _backend(backend, out)
    out, ref = _host(out), _host(ref)
    if _tensor.is_torch(out) and not out.is_contiguous():
        out = out.contiguous()
    if _tensor.is_torch(ref) and not ref.is_contiguous():
        ref = ref.contiguous()
    r = _lib.VerifyResultC()
    _lib.check(_lib.lib.mxmoe_compare(_tensor.view(out, "out"), _tensor.view(ref, "ref"), device_type, ctypes.byref(r)))
    return _result(r)


def verify(weights: MoEWeights, x: Any, out: Any, *, logits: Any = None, topk_ids: Any = None,
           topk_weights: Any = None, backend: Any = None, reference: str = "auto") -> Verification:
    """Run the CPU reference (cpu::moe_forward) on ``weights`` and ``x`` with the same routing the
    backend was given, and judge the backend's ``out`` [T, H] against it with the backend's
    :class:`Tolerance` (mxmoe::verify_forward).

    Args:
        weights: the :class:`MoEWeights` the backend's layer was prepared from (host tensors).
        x, logits, topk_ids, topk_weights: what :func:`mxmoe.moe_forward` was given (CUDA
            tensors are copied to the host); all routing None: the router weights.
        out: the backend's output (f32 | bf16).
        backend: ``"cpu"`` or ``"cuda[:N]"``: whose tolerance; default where ``out`` is.
        reference: ``"f64"``, ``"f32"`` (not for the CPU backend: it would compare it with itself)
            or ``"auto"`` (f64, except f32 for a CUDA run of more than 4e9 multiply-adds).
    """
    if not isinstance(weights, MoEWeights):
        raise invalid("weights", "an mxmoe.MoEWeights (config and checkpoint-layout tensors)", type(weights).__name__)
    device_type = _backend(backend, out)
    ref = _lib.index(_lib.REFERENCES, reference, "reference")
    r = _lib.VerifyResultC()
    # The host copies must outlive the call: a view holds only their data pointer.
    host_weights = MoEWeights(weights.config, {k: _host(v) for k, v in weights.tensors.items()})
    cw = host_weights._c()
    x, logits, topk_ids, topk_weights, out = (_host(t) for t in (x, logits, topk_ids, topk_weights, out))
    _lib.check(_lib.lib.mxmoe_verify(
        ctypes.byref(weights.config._to_c()), ctypes.byref(cw), _tensor.view(x, "x"),
        _tensor.view(logits, "routing.logits"), _tensor.view(topk_ids, "routing.ids"),
        _tensor.view(topk_weights, "routing.weights"), _tensor.view(out, "out"), device_type, ref,
        ctypes.byref(r)))
    return _result(r)
