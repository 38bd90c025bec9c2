"""mxmoe: MXFP4 Mixture-of-Experts for NVIDIA Hopper, with a CPU reference that defines what is
correct — from Python.

Arrays are torch tensors (cpu or cuda), numpy arrays or anything with DLPack; nothing is copied.
CUDA work runs on torch's current stream of the tensors' device. ``mxmoe.torch`` registers the
same functions as PyTorch custom operators (torch.compile, CUDA graphs).

    import torch, mxmoe
    w = torch.randn(8, 256, 512, dtype=torch.bfloat16)            # [E, N, K]
    packed, scales, st = mxmoe.quantize(w, "even", stats=True)    # u8 [E, N, K/2], u8 [E, N, K/32]
    print(st.sqnr_db)
    w_hat = mxmoe.dequantize(packed, scales)                      # f32 [E, N, K]

See docs/python.md.
"""

from __future__ import annotations

from . import cuda
from ._errors import Error, InvalidArgument, OutOfMemory, RuntimeFailure, Unsupported
from ._lib import ACTIVATION_KINDS, GATE_UP_ORDERS, ROUTING_KINDS, RULES, SCALE_LAYOUTS
from ._lib import lib as _native
from ._moe import MoEConfig, PreparedMoE, forward_tolerance, moe_forward, prepare
from ._quant import QuantStats, dequantize, quantize, scale_shape

__version__: str = _native.mxmoe_version().decode()

__all__ = [
    "ACTIVATION_KINDS",
    "GATE_UP_ORDERS",
    "ROUTING_KINDS",
    "RULES",
    "SCALE_LAYOUTS",
    "Error",
    "InvalidArgument",
    "MoEConfig",
    "OutOfMemory",
    "PreparedMoE",
    "QuantStats",
    "RuntimeFailure",
    "Unsupported",
    "cuda",
    "dequantize",
    "forward_tolerance",
    "moe_forward",
    "prepare",
    "quantize",
    "scale_shape",
]
