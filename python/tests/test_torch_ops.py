"""mxmoe.torch: the torch.library ops — their schemas and fake implementations (opcheck), eager
equals the plain functions, and torch.compile (aot_eager, inductor, dynamic shapes) gives the
same results. moe_forward's C++ kernel (libmxmoe_torch.so): in use where built, bitwise the
plain forward's output, the same exceptions and messages for bad input, the layers it owns; the
kernel registered from Python when the library is disabled or was not built (in a subprocess);
on CUDA its kept workspaces and graph replay."""

import gc
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import mxmoe
import mxmoe.torch as mt
from conftest import CUDA_MARKS, requires_cuda
from mxmoe import _moe, _torchop
from test_moe import CONFIGS, E, H, KINDS, kind_layer, make_weights, op_workspaces, routing_args

NATIVE_LIBRARY = mxmoe._lib.library_path.with_name(_torchop.LIBRARY_FILE)
DISABLED = os.environ.get(_torchop.DISABLE_ENV) == "0"


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
    torch.library.opcheck(torch.ops.mxmoe.moe_forward_out.default,
                          (x, logits, None, None, layer.id, torch.empty_like(x)))


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


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_moe_forward_into_a_buffer(backend):
    """moe_forward_out under torch.compile: the mutation of ``out`` is traced (functionalized) and
    the caller's buffer holds the result, as in eager."""
    layer = mxmoe.prepare(CONFIGS["qwen3"], **make_weights())

    @torch.compile(backend=backend, fullgraph=True)
    def block(x, logits, out):
        mt.moe_forward(layer, x * 2, logits=logits, out=out)
        return out + 1

    for tokens in (4, 9):
        x, logits = torch.randn(tokens, H), torch.randn(tokens, E)
        out = torch.empty(tokens, H)
        got = block(x, logits, out)
        want = mxmoe.moe_forward(layer, x * 2, logits=logits)
        assert torch.equal(out, want) and torch.equal(got, want + 1)


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


# ---- moe_forward's C++ kernel (libmxmoe_torch.so) ------------------------------------------------


def kernel_file(key: str, op: str = "mxmoe::moe_forward") -> str:
    """Where torch says the op's kernel for dispatch key ``key`` was registered."""
    match = re.search(rf"^{key}: registered at (\S+?):\d+", torch._C._dispatch_dump(op), re.M)
    assert match, torch._C._dispatch_dump(op)
    return os.path.basename(match[1])


def test_the_cpp_kernel_is_in_use():
    """scripts/test.sh builds the library (torch installed first): the op's CPU and CUDA kernels
    are its own, not the Python-registered one."""
    if DISABLED:
        assert not mt.NATIVE_OP and kernel_file("CPU") == "torch.py"
        pytest.skip(f"{_torchop.DISABLE_ENV}=0: the kernel registered from Python is tested")
    assert NATIVE_LIBRARY.is_file(), f"{NATIVE_LIBRARY} was not built: {mt.NATIVE_OP_REASON}"
    assert mt.NATIVE_OP and mt.NATIVE_OP_REASON is None
    assert kernel_file("CPU") == kernel_file("CUDA") == "torch_op.cpp"
    out = "mxmoe::moe_forward_out"
    assert kernel_file("CPU", out) == kernel_file("CUDA", out) == "torch_op.cpp"


@pytest.mark.parametrize("name", sorted(KINDS))
@pytest.mark.parametrize("source", ["logits", "bf16_logits", "precomputed", "router"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_op_equals_the_plain_forward_bitwise(name, source, dtype):
    w = kind_layer(name, biases=True, router=source == "router")
    layer = w.prepare("cpu")
    x, logits = mxmoe.synthetic_inputs(w, 11, seed=4)
    args = routing_args(w, "logits" if source == "bf16_logits" else source, logits)
    if source == "bf16_logits":
        args["logits"] = logits.bfloat16()
    x = x.to(dtype)
    got = mt.moe_forward(layer, x, **args)
    assert got.dtype == dtype and got.shape == (11, H) and got.is_contiguous()
    assert torch.equal(got, mxmoe.moe_forward(layer, x, **args))
    assert torch.equal(torch.ops.mxmoe.moe_forward(x, args.get("logits"), args.get("topk_ids"),
                                                   args.get("topk_weights"), layer.id), got)
    empty = mt.moe_forward(layer, x[:0], **{k: v[:0] for k, v in args.items()})
    assert empty.shape == (0, H) and empty.dtype == dtype
    out = torch.full_like(x, float("nan"))  # every element written
    assert mt.moe_forward(layer, x, **args, out=out) is out and torch.equal(out, got)


def same_error(op, direct):
    """Calls both; they must raise the same mxmoe exception class, argument and message."""
    with pytest.raises(mxmoe.Error) as want:
        direct()
    with pytest.raises(mxmoe.Error) as got:
        op()
    assert type(got.value) is type(want.value), (got.value, want.value)
    assert str(got.value) == str(want.value)
    assert getattr(got.value, "argument", None) == getattr(want.value, "argument", None)
    return got.value


def test_bad_input_raises_what_the_plain_forward_raises():
    layer = mxmoe.prepare(CONFIGS["qwen3"], **make_weights())
    x, logits = torch.randn(5, H), torch.randn(5, E)
    ids, weights = torch.zeros(5, 2, dtype=torch.int32), torch.full((5, 2), 0.5)
    cases = {
        "x": [dict(x=x.double()), dict(x=x.to(torch.complex64)), dict(x=x.bool()), dict(x=x.to(torch.int8)),
              dict(x=torch.randn(H, 5).t()), dict(x=torch.randn(5 * H)), dict(x=torch.randn(1, 1, 1, 1, 1, 1, 1, 1, 5, H)),
              dict(x=torch.randn(5, H + 32))],
        "routing.logits": [dict(logits=logits[:4]), dict(logits=logits.double()), dict(logits=logits.long()),
                           dict(logits=torch.randn(E, 5).t())],
        "routing.ids": [dict(logits=None, topk_ids=ids.long(), topk_weights=weights),
                        dict(logits=None, topk_ids=torch.full((5, 2), E, dtype=torch.int32), topk_weights=weights)],
        "routing.weights": [dict(logits=None, topk_ids=ids, topk_weights=weights[:, :1]),
                            dict(logits=None, topk_ids=ids, topk_weights=weights.double())],
    }
    for argument, variants in cases.items():
        for v in variants:
            args = {"x": x, "logits": logits, **v}
            e = same_error(lambda: mt.moe_forward(layer, **args), lambda: mxmoe.moe_forward(layer, **args))
            assert isinstance(e, mxmoe.InvalidArgument) and e.argument == argument, (argument, v, e)
    out = torch.empty(5, H)
    for v in [dict(out=out.double()), dict(out=out[:4]), dict(out=torch.empty(H, 5).t()), dict(out=out.int())]:
        args = {"x": x, "logits": logits, **v}
        e = same_error(lambda: mt.moe_forward(layer, **args), lambda: mxmoe.moe_forward(layer, **args))
        assert isinstance(e, mxmoe.InvalidArgument) and e.argument == "out", (v, e)
    with pytest.raises(ValueError) as raw:  # torch.ops directly: torch's ValueError from the C++ kernel
        torch.ops.mxmoe.moe_forward(x.double(), logits, None, None, layer.id)
    message = "argument 'x': expected dtype bf16 | f16 | f32 | u8 | i32 | i64, got float64"
    if mt.NATIVE_OP:
        assert str(raw.value) == "mxmoe.InvalidArgument: " + message and not isinstance(raw.value, mxmoe.Error)
    else:  # the Python-registered kernel raises mxmoe's exception itself
        assert str(raw.value) == message and isinstance(raw.value, mxmoe.InvalidArgument)


def test_a_closed_or_collected_layer_is_named():
    layer = mxmoe.prepare(CONFIGS["gpt_oss"], **make_weights())
    x, logits = torch.randn(3, H), torch.randn(3, E)
    layer_id = layer.id
    layer.close()
    layer.close()  # idempotent
    with pytest.raises(mxmoe.InvalidArgument) as closed:
        mt.moe_forward(layer, x, logits=logits)
    assert closed.value.argument == "layer" and "closed" in str(closed.value)
    if mt.NATIVE_OP:  # it cannot tell closed from collected (the Python-registered kernel can)
        assert str(closed.value) == f"argument 'layer': expected a live PreparedMoE, got id {layer_id}, which was " \
                                    "closed or collected"
    collected = mxmoe.prepare(CONFIGS["gpt_oss"], **make_weights())
    collected_id = collected.id
    mt.moe_forward(collected, x, logits=logits)
    del collected
    gc.collect()
    for dead in (collected_id, 1 << 40):
        with pytest.raises(ValueError, match=f"argument 'layer': expected a live PreparedMoE, got id {dead}, "):
            torch.ops.mxmoe.moe_forward(x, logits, None, None, dead)


_MODE_SCRIPT = r"""
import json, re, sys, warnings
import torch, mxmoe
cfg = mxmoe.MoEConfig(8, 96, 64, top_k=2)
w = mxmoe.synthetic_layer(cfg)
before = w.prepare("cpu")  # prepared before mxmoe.torch is imported: registered with the op library then
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import mxmoe.torch as mt
after = w.prepare("cpu")
x, logits = mxmoe.synthetic_inputs(w, 3, seed=1)
for layer in (before, after):
    assert torch.equal(mt.moe_forward(layer, x, logits=logits), mxmoe.moe_forward(layer, x, logits=logits))
    out = torch.empty_like(x)
    assert mt.moe_forward(layer, x, logits=logits, out=out) is out
    assert torch.equal(out, mxmoe.moe_forward(layer, x, logits=logits))
try:
    mt.moe_forward(after, x, logits=logits[:2])
    raise AssertionError("no error")
except mxmoe.InvalidArgument as e:
    assert e.argument == "routing.logits", e
before.close()
kernels = {re.search(r"^CPU: registered at (\S+?):", torch._C._dispatch_dump(op), re.M)[1].rsplit("/", 1)[-1]
           for op in ("mxmoe::moe_forward", "mxmoe::moe_forward_out")}
assert len(kernels) == 1, kernels
print(json.dumps({"native": mt.NATIVE_OP, "reason": mt.NATIVE_OP_REASON, "kernel": kernels.pop(),
                  "warnings": [str(m.message) for m in caught if m.category is RuntimeWarning]}))
"""


def run_mode(env_changes: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **env_changes}
    env = {k: v for k, v in env.items() if v is not None}
    r = subprocess.run([sys.executable, "-c", _MODE_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_cpp_kernel_adopts_layers_prepared_before_import():
    if DISABLED:
        pytest.skip(f"{_torchop.DISABLE_ENV}=0")
    got = run_mode({_torchop.DISABLE_ENV: None})
    assert got == {"native": True, "reason": None, "kernel": "torch_op.cpp", "warnings": []}, got


def test_disabled_by_the_environment_the_python_kernel_runs_without_a_warning():
    got = run_mode({_torchop.DISABLE_ENV: "0"})
    assert got == {"native": False, "reason": f"{_torchop.DISABLE_ENV}=0 is set", "kernel": "torch.py",
                   "warnings": []}, got


def test_not_built_the_python_kernel_runs_and_a_warning_says_why(tmp_path):
    """A library without libmxmoe_torch.so next to it (built without torch): mxmoe.torch warns once,
    naming where it looked, and the op still works (the kernel registered from Python)."""
    lib = tmp_path / mxmoe._lib.library_path.name
    shutil.copy(mxmoe._lib.library_path, lib)
    shutil.copy(mxmoe._lib.library_path.with_name(mxmoe._lib.HOTPATH_FILE), tmp_path)
    got = run_mode({"MXMOE_LIBRARY": str(lib), _torchop.DISABLE_ENV: None})
    assert not got["native"] and got["kernel"] == "torch.py"
    assert got["reason"].startswith(f"{tmp_path / _torchop.LIBRARY_FILE} was not built (torch >= 2.10 "), got
    assert len(got["warnings"]) == 1 and got["warnings"][0].endswith(got["reason"]), got


# ---- on CUDA ---------------------------------------------------------------------------------------


@requires_cuda
def test_cuda_op_keeps_a_workspace_per_stream_and_replays_graphs_bitwise():
    """The op's CUDA kernel (the C++ one unless disabled): the current stream's workspace kept and
    reused, one per stream, none added by a capture; graph replays with new inputs bitwise equal
    to eager forwards of the op and of mxmoe.moe_forward."""
    assert mt.NATIVE_OP or DISABLED, mt.NATIVE_OP_REASON
    layer = mxmoe.prepare(CONFIGS["gpt_oss"], device="cuda", **make_weights())
    x, logits = torch.randn(4, H, device="cuda").bfloat16(), torch.randn(4, E, device="cuda")
    want = mxmoe.moe_forward(layer, x, logits=logits)
    current = torch.cuda.current_stream()
    kept_before = set(op_workspaces(layer))  # the plain forward's own are separate from the C++ kernel's
    assert torch.equal(mt.moe_forward(layer, x, logits=logits), want)
    assert set(op_workspaces(layer)) == kept_before | {current.cuda_stream}
    first = op_workspaces(layer)[current.cuda_stream]
    assert first[-1] == _moe.CACHED_WORKSPACE_BYTES
    assert torch.equal(mt.moe_forward(layer, x, logits=logits), want)
    assert op_workspaces(layer)[current.cuda_stream] == first  # reused
    side = torch.cuda.Stream()
    side.wait_stream(current)
    with torch.cuda.stream(side):
        on_side = mt.moe_forward(layer, x, logits=logits)
    side.synchronize()
    assert torch.equal(on_side, want) and side.cuda_stream in set(op_workspaces(layer))
    kept = set(op_workspaces(layer))
    graph = torch.cuda.CUDAGraph()
    buffer = torch.empty_like(x)  # moe_forward_out's, written by every replay
    with torch.cuda.graph(graph):
        out = mt.moe_forward(layer, x, logits=logits)
        mt.moe_forward(layer, x, logits=logits, out=buffer)
    assert set(op_workspaces(layer)) == kept  # the capture took memory of its own
    for _ in range(3):
        x.copy_(torch.randn(4, H, device="cuda").bfloat16())
        logits.copy_(torch.randn(4, E, device="cuda"))
        graph.replay()
        eager = mt.moe_forward(layer, x, logits=logits)
        torch.cuda.synchronize()
        assert torch.equal(out, eager) and torch.equal(eager, mxmoe.moe_forward(layer, x, logits=logits))
        assert torch.equal(buffer, eager)
    del graph
    layer.close()
    assert op_workspaces(layer) == {}
    with pytest.raises(mxmoe.InvalidArgument, match="'layer'"):
        mt.moe_forward(layer, x, logits=logits)


@requires_cuda
def test_cuda_op_bad_input_raises_what_the_plain_forward_raises():
    layer = mxmoe.prepare(CONFIGS["qwen3"], device="cuda", **make_weights())
    x, logits = torch.randn(5, H, device="cuda").bfloat16(), torch.randn(5, E, device="cuda")
    for argument, args in [("x", dict(x=x.cpu(), logits=logits)), ("x", dict(x=x.float(), logits=logits)),
                           ("routing.logits", dict(x=x, logits=logits.cpu())),
                           ("routing.logits", dict(x=x, logits=logits[:3])), ("routing", dict(x=x))]:
        e = same_error(lambda: mt.moe_forward(layer, **args), lambda: mxmoe.moe_forward(layer, **args))
        assert e.argument.startswith(argument), (argument, e)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA_MARKS)])
def test_forward_of_zero_tokens_returns_an_empty_output_on_every_path(device):
    """T = 0: torch gives zero-size tensors a null data pointer, which must read as an empty tensor
    that was given, not as a missing argument (logits, or ids and weights): through mxmoe.moe_forward
    and both torch ops, on the CPU backend and on CUDA (where the layer took null logits for absent
    routing until 918da41)."""
    layer = mxmoe.prepare(CONFIGS["gpt_oss"], device=device, **make_weights())
    k = layer.config.top_k
    x, logits = torch.empty(0, H, device=device, dtype=torch.bfloat16), torch.empty(0, E, device=device)
    ids, weights = torch.empty(0, k, device=device, dtype=torch.int32), torch.empty(0, k, device=device)
    assert x.data_ptr() == 0 and logits.data_ptr() == 0  # what the test is about
    for routing in (dict(logits=logits), dict(topk_ids=ids, topk_weights=weights)):
        for forward in (mxmoe.moe_forward, mt.moe_forward):
            out = forward(layer, x, **routing)
            assert out.shape == (0, H) and out.device == x.device, forward
        assert mt.moe_forward(layer, x, **routing, out=torch.empty_like(x)).shape == (0, H)
    with pytest.raises(mxmoe.InvalidArgument, match="'routing'"):
        mxmoe.moe_forward(layer, x)
