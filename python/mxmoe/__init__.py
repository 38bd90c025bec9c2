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

    layer = mxmoe.load_layer("model-mxfp4.safetensors", 0, device="cuda")   # a checkpoint's MoE layer
    weights = mxmoe.synthetic_layer("gpt-oss-20b", experts=8)               # or a synthetic one

See docs/python.md.
"""

from __future__ import annotations

from . import cuda
from ._checkpoint import (Checkpoint, LayerInfo, QuantizeReport, TensorReport, dequantize_checkpoint, load_layer,
                          quantize_checkpoint)
from ._errors import (Cancelled, Error, FormatError, InvalidArgument, IOFailure, OutOfMemory, RuntimeFailure,
                      Unsupported)
from ._lib import ACTIVATION_KINDS, GATE_UP_ORDERS, ROUTING_KINDS, RULES, SCALE_LAYOUTS
from ._lib import lib as _native
from ._moe import (MoEConfig, MoEWeights, PreparedMoE, contiguous_expert_map, moe_forward, prepare,
                   shard_intermediate)
from ._quant import QuantStats, dequantize, quantize, scale_shape
from ._synthetic import Preset, presets, synthetic_inputs, synthetic_layer
from ._verify import Tolerance, Verification, compare, forward_tolerance, verify

__version__: str = _native.mxmoe_version().decode()

__all__ = [
    "ACTIVATION_KINDS",
    "GATE_UP_ORDERS",
    "ROUTING_KINDS",
    "RULES",
    "SCALE_LAYOUTS",
    "Cancelled",
    "Checkpoint",
    "Error",
    "FormatError",
    "IOFailure",
    "InvalidArgument",
    "LayerInfo",
    "MoEConfig",
    "MoEWeights",
    "OutOfMemory",
    "PreparedMoE",
    "Preset",
    "QuantStats",
    "QuantizeReport",
    "RuntimeFailure",
    "TensorReport",
    "Tolerance",
    "Unsupported",
    "Verification",
    "compare",
    "contiguous_expert_map",
    "cuda",
    "dequantize",
    "dequantize_checkpoint",
    "forward_tolerance",
    "load_layer",
    "moe_forward",
    "prepare",
    "presets",
    "quantize",
    "quantize_checkpoint",
    "scale_shape",
    "shard_intermediate",
    "synthetic_inputs",
    "synthetic_layer",
    "verify",
]
