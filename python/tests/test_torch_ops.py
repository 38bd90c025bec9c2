"""mxmoe.torch: the torch.library ops — their schemas and fake implementations (opcheck), eager
equals the plain functions, and torch.compile (aot_eager, inductor, dynamic shapes) gives the
same results."""

import pytest
import torch

import mxmoe
import mxmoe.torch as mt
from conftest import requires_cuda
from test_moe import CONFIGS, E, H, make_weights


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()


@pytest.mark.parametrize("layout", mxmoe.SCALE_LAYOUTS)
def test_opcheck_quantize_dequantize(layout):
    x = torch.randn(3, 40, 64, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.mxmoe.quantize.default, (x, "mse", layout))
    torch.library.opcheck(torch.ops.mxmoe.quantize_with_stats.default, (x, "floor", layout))
    packed, scales = mt.quantize(x, "even", layout)
    torch.library.opcheck(torch.ops.mxmoe.dequantize.default, (packed, scales, layout, torch.bfloat16))


def test_opcheck_moe_forward():
    layer = mxmoe.prepare(CONFIGS["gpt_oss"], **make_weights())
    x, logits = torch.randn(5, H), torch.randn(5, E)
    torch.library.opcheck(torch.ops.mxmoe.moe_forward.default, (x, logits, None, None, layer.id))


def test_ops_equal_the_plain_functions():
    x = torch.randn(2, 64, 96)
    packed, scales = mt.quantize(x, "rceil", "tiled_128x4")
    want = mxmoe.quantize(x, "rceil", "tiled_128x4", stats=True)
    assert torch.equal(packed, want[0]) and torch.equal(scales, want[1])
    _, _, stats = mt.quantize_with_stats(x, "rceil", "tiled_128x4")
    assert stats.dtype == torch.int64 and mt.stats_from_tensor(stats) == want[2]
    assert torch.equal(mt.dequantize(packed, scales, "tiled_128x4"), mxmoe.dequantize(packed, scales, "tiled_128x4"))
    layer = mxmoe.prepare(CONFIGS["qwen3"], **make_weights())
    x, logits = torch.randn(7, H), torch.randn(7, E)
    assert torch.equal(mt.moe_forward(layer, x, logits=logits), mxmoe.moe_forward(layer, x, logits=logits))


def test_fake_tensors_give_shapes_and_errors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = mxmoe.prepare(CONFIGS["qwen3"], **make_weights())
    with FakeTensorMode():
        x = torch.empty(300, 64, 96, dtype=torch.bfloat16)
        packed, scales = mt.quantize(x, "even", "tiled_128x4")
        assert packed.shape == (300, 64, 48) and scales.shape == mxmoe.scale_shape((300, 64, 96), "tiled_128x4")
        assert mt.dequantize(packed, scales, "tiled_128x4").shape == (300, 64, 96)
        assert mt.moe_forward(layer, torch.empty(11, H), logits=torch.empty(11, E)).shape == (11, H)
        with pytest.raises(mxmoe.InvalidArgument, match="'x'"):
            mt.quantize(torch.empty(4, 48))
        with pytest.raises(mxmoe.InvalidArgument, match="'rule'"):
            mt.quantize(x, "nearest")
    layer.close()
    with pytest.raises(mxmoe.InvalidArgument, match="'layer'"):
        mt.moe_forward(layer, torch.empty(1, H), logits=torch.empty(1, E))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_quantize_round_trip(backend):
    @torch.compile(backend=backend, fullgraph=True)
    def round_trip(x):
        packed, scales = mt.quantize(x * 2, "mse", "tiled_128x4")
        return mt.dequantize(packed, scales, "tiled_128x4", torch.float32) - 1

    x = torch.randn(4, 130, 64)
    want = mxmoe.dequantize(*mxmoe.quantize(x * 2, "mse", "tiled_128x4"), "tiled_128x4") - 1
    assert torch.equal(round_trip(x), want)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_moe_forward_with_dynamic_tokens(backend):
    layer = mxmoe.prepare(CONFIGS["gpt_oss"], **make_weights())
    router = torch.randn(E, H) * 0.2

    @torch.compile(backend=backend, fullgraph=True, dynamic=True)
    def block(x):
        return x + mt.moe_forward(layer, torch.nn.functional.rms_norm(x, (H,)), logits=x @ router.T)

    for tokens in (3, 17, 40):
        x = torch.randn(tokens, H)
        want = x + mxmoe.moe_forward(layer, torch.nn.functional.rms_norm(x, (H,)), logits=x @ router.T)
        assert torch.allclose(block(x), want, rtol=1e-5, atol=1e-6)


@requires_cuda
def test_compiled_cuda_graph_mode():
    layer = mxmoe.prepare(CONFIGS["gpt_oss"], device="cuda", **make_weights())

    @torch.compile(mode="reduce-overhead", fullgraph=True)
    def step(x, logits):
        return mt.moe_forward(layer, x, logits=logits) * 2

    for _ in range(4):  # warm-up, record, replays
        x = torch.randn(8, H, device="cuda").bfloat16()
        logits = torch.randn(8, E, device="cuda")
        got = step(x, logits).clone()
        assert torch.equal(got, mxmoe.moe_forward(layer, x, logits=logits) * 2)
