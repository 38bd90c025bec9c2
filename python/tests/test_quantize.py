"""quantize / dequantize through the Python binding: every rule, scale layout and dtype; torch,
numpy and DLPack inputs; outputs the caller gives; statistics. The numerics themselves are
tested exhaustively in C++ (tests/cpu/test_mx.cpp, test_quantize.cpp): here the binding must
pass the right tensors, return what the library wrote, and agree with itself across paths."""

import numpy as np
import pytest
import torch

import mxmoe
import mxmoe.torch
from conftest import requires_cuda

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def sample(shape, dtype, device="cpu"):
    # Gaussian blocks with a spread of magnitudes, a few zeros: every rule sees saturation.
    x = torch.randn(shape) * torch.exp2(torch.randint(-6, 6, (*shape[:-1], 1)).float())
    x[..., 5] = 0.0
    return x.to(dtype).to(device)


@pytest.mark.parametrize("rule", mxmoe.RULES)
@pytest.mark.parametrize("layout", mxmoe.SCALE_LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_and_statistics(rule, layout, dtype):
    x = sample((3, 70, 96), dtype)  # rows not a multiple of the 128-row tile
    packed, scales, stats = mxmoe.quantize(x, rule, layout, stats=True)
    assert packed.shape == (3, 70, 48) and packed.dtype == torch.uint8
    assert scales.shape == mxmoe.scale_shape(tuple(x.shape), layout) and scales.dtype == torch.uint8
    y = mxmoe.dequantize(packed, scales, layout)
    assert y.shape == x.shape and y.dtype == torch.float32
    err = (y.double() - x.double()).pow(2).sum().item()
    sig = x.double().pow(2).sum().item()
    # The library's statistics describe exactly the output it returned.
    assert stats.elements == x.numel() and stats.blocks == x.numel() // 32
    assert stats.error_sq == pytest.approx(err, rel=1e-6)
    assert stats.signal_sq == pytest.approx(sig, rel=1e-9)
    assert 15.0 < stats.sqnr_db < 25.0  # MXFP4 on Gaussian blocks: ~18-20 dB
    assert stats.flushed_elements <= stats.elements and stats.nonfinite_blocks == 0


@pytest.mark.parametrize("rule", mxmoe.RULES)
def test_layouts_hold_the_same_scales(rule):
    x = sample((2, 130, 160), torch.bfloat16)
    p_lin, s_lin = mxmoe.quantize(x, rule, "linear")
    p_til, s_til = mxmoe.quantize(x, rule, "tiled_128x4")
    assert torch.equal(p_lin, p_til)
    assert torch.equal(mxmoe.dequantize(p_lin, s_lin, "linear"), mxmoe.dequantize(p_til, s_til, "tiled_128x4"))
    assert torch.equal(mxmoe.dequantize(p_lin, s_lin, dtype="bf16"),
                       mxmoe.dequantize(p_lin, s_lin).to(torch.bfloat16))


def test_row_strided_input_matches_contiguous():
    base = sample((64, 256), torch.float32)
    x = base[:, 64:192]  # row stride 256, last dimension contiguous
    assert not x.is_contiguous()
    got = mxmoe.quantize(x, "mse")
    want = mxmoe.quantize(x.contiguous(), "mse")
    assert all(torch.equal(g, w) for g, w in zip(got, want))


class OnlyDLPack:
    """An array known only through the DLPack protocol."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__()

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def test_numpy_and_dlpack_inputs_give_the_same_bytes():
    x = sample((4, 32, 64), torch.float32)
    packed, scales = mxmoe.quantize(x, "rceil")
    pn, sn = mxmoe.quantize(x.numpy(), "rceil")
    assert isinstance(pn, np.ndarray) and np.array_equal(pn, packed.numpy()) and np.array_equal(sn, scales.numpy())
    out = (torch.full_like(packed, 0xAB), torch.full_like(scales, 0xAB))
    mxmoe.quantize(OnlyDLPack(x), "rceil", out=(OnlyDLPack(out[0]), OnlyDLPack(out[1])))
    assert torch.equal(out[0], packed) and torch.equal(out[1], scales)
    bf = sample((2, 32, 64), torch.bfloat16)  # bf16 through DLPack (numpy has none)
    assert torch.equal(mxmoe.quantize(OnlyDLPack(bf), out=(torch.empty(2, 32, 32, dtype=torch.uint8),
                                                           torch.empty(2, 32, 2, dtype=torch.uint8)))[0],
                       mxmoe.quantize(bf)[0])


def test_out_buffers_are_written():
    x = sample((8, 64), torch.float16)
    packed = torch.full((8, 32), 0xAB, dtype=torch.uint8)
    scales = torch.full((8, 2), 0xAB, dtype=torch.uint8)
    got = mxmoe.quantize(x, out=(packed, scales))
    assert got[0] is packed and got[1] is scales
    want = mxmoe.quantize(x)
    assert torch.equal(packed, want[0]) and torch.equal(scales, want[1])
    out = torch.full((8, 64), float("nan"))
    assert mxmoe.dequantize(packed, scales, out=out) is out
    assert torch.equal(out, mxmoe.dequantize(packed, scales))


def test_nonfinite_blocks_are_counted():
    x = torch.zeros(2, 64)
    x[0, 3] = float("inf")
    x[1, 40] = float("nan")
    _, scales, stats = mxmoe.quantize(x, stats=True)
    assert stats.nonfinite_blocks == 2 and stats.blocks == 4
    assert scales[0, 0].item() == 0xFF and scales[1, 1].item() == 0xFF


def assert_same_stats(gpu, cpu):
    """The counts exactly; the float64 sums to 1e-6 (the GPU reduces in another order)."""
    for name in ("elements", "blocks", "saturated_blocks", "clamped_elements", "flushed_elements", "nonfinite_blocks"):
        assert getattr(gpu, name) == getattr(cpu, name), name
    for name in ("signal_sq", "error_sq"):
        assert getattr(gpu, name) == pytest.approx(getattr(cpu, name), rel=1e-6, abs=0.0), name


@requires_cuda
@pytest.mark.parametrize("rule", mxmoe.RULES)
@pytest.mark.parametrize("layout", mxmoe.SCALE_LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_cpu_bitwise(rule, layout, dtype):
    x = sample((3, 200, 96), dtype)
    want = mxmoe.quantize(x, rule, layout, stats=True)
    got = mxmoe.quantize(x.cuda(), rule, layout, stats=True)
    assert got[0].is_cuda and torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    assert_same_stats(got[2], want[2])
    stats = torch.empty(8, dtype=torch.int64, device="cuda")
    mxmoe.quantize(x.cuda(), rule, layout, device_stats=stats)
    assert_same_stats(mxmoe.torch.stats_from_tensor(stats), want[2])
    for out_dtype in ("f32", "bf16"):
        assert torch.equal(mxmoe.dequantize(got[0], got[1], layout, dtype=out_dtype).cpu(),
                           mxmoe.dequantize(want[0], want[1], layout, dtype=out_dtype))


@requires_cuda
def test_cuda_runs_on_the_current_stream():
    x = sample((512, 2048), torch.bfloat16).cuda()
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # y is written late on this stream: a quantize on any
        y = x + 1                       # other stream would read it before it is
        packed, scales = mxmoe.quantize(y)
        out = mxmoe.dequantize(packed, scales)
    side.synchronize()
    assert torch.equal(out.cpu(), mxmoe.dequantize(*mxmoe.quantize((x + 1).cpu())))
