"""Bad input raises a clear exception naming the argument and changes nothing; it never crashes
the interpreter."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import mxmoe
from conftest import requires_cuda


def expect_invalid(argument, fn, *args, **kwargs):
    with pytest.raises(mxmoe.InvalidArgument) as info:
        fn(*args, **kwargs)
    assert info.value.argument == argument, str(info.value)
    assert f"'{argument}'" in str(info.value) and "expected" in str(info.value)
    return info.value


def test_exception_classes():
    assert issubclass(mxmoe.InvalidArgument, ValueError) and issubclass(mxmoe.InvalidArgument, mxmoe.Error)
    assert issubclass(mxmoe.Unsupported, RuntimeError) and issubclass(mxmoe.OutOfMemory, MemoryError)


def test_quantize_bad_input():
    x = torch.randn(4, 64)
    expect_invalid("x", mxmoe.quantize, x.double())
    expect_invalid("x", mxmoe.quantize, torch.randn(4, 48))  # K not a multiple of 32
    expect_invalid("x", mxmoe.quantize, torch.randn(64))  # rank 1
    expect_invalid("x", mxmoe.quantize, torch.randn(64, 64).t())  # last dimension not contiguous
    expect_invalid("x", mxmoe.quantize, torch.randn(1, 1, 1, 1, 1, 1, 1, 1, 2, 32))  # rank 10
    expect_invalid("x", mxmoe.quantize, torch.randn(4, 64).to_sparse())
    expect_invalid("x", mxmoe.quantize, torch.empty(4, 64, device="meta"))
    expect_invalid("x", mxmoe.quantize, [[1.0] * 32])
    expect_invalid("rule", mxmoe.quantize, x, "nearest")
    expect_invalid("scale_layout", mxmoe.quantize, x, "even", "blocked")
    expect_invalid("dtype", mxmoe.dequantize, *mxmoe.quantize(x), dtype="f16")


def test_bad_outputs_are_rejected_and_left_untouched():
    x = torch.randn(8, 64)
    packed = torch.full((8, 32), 0xAB, dtype=torch.uint8)
    scales = torch.full((8, 3), 0xAB, dtype=torch.uint8)  # should be [8, 2]
    expect_invalid("scales", mxmoe.quantize, x, out=(packed, scales))
    assert (packed == 0xAB).all() and (scales == 0xAB).all()
    wide = torch.full((8, 64), 0xAB, dtype=torch.uint8)[:, ::2]  # right shape, not contiguous
    expect_invalid("packed", mxmoe.quantize, x, out=(wide, torch.empty(8, 2, dtype=torch.uint8)))
    frozen = np.zeros((8, 32), dtype=np.uint8)
    frozen.flags.writeable = False
    expect_invalid("packed", mxmoe.quantize, x.numpy(), out=(frozen, np.zeros((8, 2), dtype=np.uint8)))
    good = mxmoe.quantize(x)
    out = torch.full((8, 64), -1.0)
    expect_invalid("out", mxmoe.dequantize, *good, out=out[:, :32])
    expect_invalid("out", mxmoe.dequantize, *good, out=torch.empty(8, 64, dtype=torch.float16))
    assert (out == -1.0).all()


def small_layer(**overrides):
    e, h, i = 4, 64, 32
    gu = mxmoe.quantize(torch.randn(e, 2 * i, h, dtype=torch.bfloat16))
    dn = mxmoe.quantize(torch.randn(e, h, i, dtype=torch.bfloat16))
    weights = dict(gate_up_blocks=gu[0].view(e, 2 * i, h // 32, 16), gate_up_scales=gu[1],
                   down_blocks=dn[0].view(e, h, i // 32, 16), down_scales=dn[1])
    weights.update(overrides)
    return mxmoe.prepare(mxmoe.MoEConfig(e, h, i, top_k=2), **weights), weights


def test_prepare_bad_input():
    cfg = mxmoe.MoEConfig(4, 64, 32, top_k=2)
    _, w = small_layer()
    expect_invalid("cfg.routing.top_k", mxmoe.prepare, mxmoe.MoEConfig(4, 64, 32, top_k=5), **w)
    expect_invalid("cfg.routing.kind", mxmoe.prepare, mxmoe.MoEConfig(4, 64, 32, routing="top1"), **w)
    expect_invalid("cfg.shape.hidden", mxmoe.prepare, mxmoe.MoEConfig(4, 48, 32, top_k=2), **w)
    bad = dict(w, down_scales=w["down_scales"][:, :, :0])
    expect_invalid("weights.down_scales", mxmoe.prepare, cfg, **bad)
    bad = dict(w, gate_up_blocks=w["gate_up_blocks"].to(torch.int32))
    expect_invalid("weights.gate_up_blocks", mxmoe.prepare, cfg, **bad)
    expect_invalid("gate_up_weights", mxmoe.prepare, cfg, gate_up_weights=w["gate_up_blocks"])
    expect_invalid("device", mxmoe.prepare, cfg, device="tpu", **w)


def test_forward_bad_input():
    layer, _ = small_layer()
    x, logits = torch.randn(5, 64), torch.randn(5, 4)
    expect_invalid("x", mxmoe.moe_forward, layer, x.double(), logits=logits)
    expect_invalid("x", mxmoe.moe_forward, layer, torch.randn(64, 5).t(), logits=logits)
    expect_invalid("routing.logits", mxmoe.moe_forward, layer, x, logits=logits[:4])
    expect_invalid("routing.ids", mxmoe.moe_forward, layer, x, topk_ids=torch.zeros(5, 2, dtype=torch.int64),
                   topk_weights=torch.ones(5, 2))
    expect_invalid("routing.ids", mxmoe.moe_forward, layer, x, topk_ids=torch.full((5, 2), 7, dtype=torch.int32),
                   topk_weights=torch.ones(5, 2))
    out = torch.full((5, 64), -1.0)
    expect_invalid("out", mxmoe.moe_forward, layer, x, logits=logits, out=out[:, :32])
    expect_invalid("out", mxmoe.moe_forward, layer, x, logits=logits, out=out[:4])
    assert (out == -1.0).all()
    layer.close()
    expect_invalid("layer", mxmoe.moe_forward, layer, x, logits=logits)


def test_cuda_unavailable_says_why():
    if mxmoe.cuda.available():
        pytest.skip("a usable GPU is present")
    why = mxmoe.cuda.why_unavailable()
    assert why
    _, w = small_layer()
    with pytest.raises(mxmoe.Unsupported, match="cuda:0"):
        mxmoe.prepare(mxmoe.MoEConfig(4, 64, 32, top_k=2), device="cuda", **w)


def test_raw_buffers_must_be_contiguous():
    x = torch.randn(8, 64)
    with pytest.raises(mxmoe.InvalidArgument, match="'device_stats'"):
        mxmoe.quantize(x, device_stats=torch.zeros(1, dtype=torch.int64).expand(8))
    with pytest.raises(mxmoe.InvalidArgument, match="'device_stats'"):
        mxmoe.quantize(x, device_stats=torch.zeros(8, dtype=torch.int64))  # cpu memory


@requires_cuda
def test_cuda_workspace_is_checked():
    layer, w = small_layer()
    cuda_layer = mxmoe.prepare(layer.config, device="cuda", **w)
    x, logits = torch.randn(5, 64, device="cuda").bfloat16(), torch.randn(5, 4, device="cuda")
    expect_invalid("workspace", mxmoe.moe_forward, cuda_layer, x, logits=logits,
                   workspace=torch.zeros(1, dtype=torch.uint8, device="cuda").expand(1 << 20))
    expect_invalid("workspace", mxmoe.moe_forward, cuda_layer, x, logits=logits,
                   workspace=torch.zeros(1 << 20, dtype=torch.uint8))
    expect_invalid("workspace", mxmoe.moe_forward, cuda_layer, x, logits=logits,
                   workspace=torch.zeros(16, dtype=torch.uint8, device="cuda"))


@requires_cuda
def test_mixed_devices_are_rejected():
    x = torch.randn(8, 64)
    packed = torch.empty(8, 32, dtype=torch.uint8, device="cuda")
    expect_invalid("packed", mxmoe.quantize, x, out=(packed, torch.empty(8, 2, dtype=torch.uint8)))
    layer, w = small_layer()
    cuda_layer = mxmoe.prepare(layer.config, device="cuda", **w)
    expect_invalid("x", mxmoe.moe_forward, cuda_layer, torch.randn(5, 64, dtype=torch.bfloat16),
                   logits=torch.randn(5, 4, device="cuda"))
    expect_invalid("routing.logits", mxmoe.moe_forward, layer, torch.randn(5, 64),
                   logits=torch.randn(5, 4, device="cuda"))
    expect_invalid("x", mxmoe.moe_forward, cuda_layer, torch.randn(5, 64, device="cuda"),  # f32 on CUDA
                   logits=torch.randn(5, 4, device="cuda"))


def test_import_without_the_extension_fails_saying_so(tmp_path):
    """No silent pure-Python fallback: a library without _hotpath.abi3.so next to it does not import."""
    lib = tmp_path / "libmxmoe_c.so"
    shutil.copy(mxmoe._lib.library_path, lib)
    env = {**os.environ, "MXMOE_LIBRARY": str(lib),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run([sys.executable, "-c", "import mxmoe"], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "ImportError: mxmoe: the extension module _hotpath.abi3.so is not at" in r.stderr, r.stderr
