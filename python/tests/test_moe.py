"""The MoE layer through the binding: prepare (copies or uploads what it needs), forward with
every routing kind, activation, gate/up order, biases and routing source (logits, precomputed ids
and weights, the router) against the models' own formulation (reference.py) and mxmoe.verify;
dtypes, T = 0; on a GPU the CUDA layer against the same, against the CPU backend, CUDA graph
capture and replay, the current stream and device, the workspace kept per stream (and not used
under capture). Against transformers' own modules:
test_hf.py."""

import ctypes

import pytest
import torch

import mxmoe
import reference
from conftest import requires_cuda

E, H, I = 8, 96, 64  # H not a multiple of 64: the kernels' K tail


def rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def make_weights(e=E, h=H, i=I, biases=True):
    gu = mxmoe.quantize(torch.randn(e, 2 * i, h, dtype=torch.bfloat16) * 0.05, "even")
    dn = mxmoe.quantize(torch.randn(e, h, i, dtype=torch.bfloat16) * 0.05, "even")
    w = dict(gate_up_blocks=gu[0].view(e, 2 * i, h // 32, 16), gate_up_scales=gu[1],
             down_blocks=dn[0].view(e, h, i // 32, 16), down_scales=dn[1])
    if biases:
        w.update(gate_up_bias=torch.randn(e, 2 * i) * 0.1, down_bias=torch.randn(e, h) * 0.1)
    return w


CONFIGS = {
    "qwen3": mxmoe.MoEConfig(E, H, I, routing="softmax_topk", top_k=2, renormalize=True),
    "mixtral": mxmoe.MoEConfig(E, H, I, routing="softmax_topk", top_k=2, renormalize=False),
    "gpt_oss": mxmoe.MoEConfig(E, H, I, routing="topk_softmax", top_k=4, activation="swiglu_clamped",
                               gate_up="interleaved"),
    "deepseek": mxmoe.MoEConfig(E, H, I, routing="sigmoid_grouped_topk", top_k=3, n_group=4, topk_group=2,
                                routed_scaling_factor=2.5),
}


# Every routing kind, both activations, both gate/up orders (limit 1.0: the clamp bites).
KINDS = {
    **CONFIGS,
    "swiglu_concatenated": mxmoe.MoEConfig(E, H, I, routing="topk_softmax", top_k=2, activation="swiglu_clamped",
                                           limit=1.0, alpha=1.5, gate_up="concatenated"),
    "grouped_interleaved": mxmoe.MoEConfig(E, H, I, routing="sigmoid_grouped_topk", top_k=2, n_group=2, topk_group=1,
                                           renormalize=False, gate_up="interleaved"),
}


def kind_layer(name, biases, router=False, seed=0):
    """A synthetic MXFP4 layer of KINDS[name] (with a correction bias for grouped routing)."""
    cfg = KINDS[name]
    w = mxmoe.synthetic_layer(cfg, seed, biases=biases, correction_bias=cfg.routing == "sigmoid_grouped_topk")
    if router:
        w.tensors.update(router_weight=torch.randn(E, H) * 0.2, router_bias=torch.randn(E) * 0.1)
    return w


def routing_args(w, source, logits):
    """The moe_forward / verify keyword arguments of one routing source."""
    if source == "logits":
        return {"logits": logits}
    if source == "precomputed":
        ids, weights = reference.route(w.config, logits, w.tensors.get("correction_bias"))
        return {"topk_ids": ids.int(), "topk_weights": weights.float()}
    return {}  # the router weights


@pytest.mark.parametrize("name", sorted(KINDS))
@pytest.mark.parametrize("biases", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("source", ["logits", "precomputed", "router"])
def test_cpu_forward_matches_the_models_formulation(name, biases, source):
    w = kind_layer(name, biases, router=source == "router")
    x, logits = mxmoe.synthetic_inputs(w, 13, seed=1)
    args = routing_args(w, source, logits)
    out = mxmoe.moe_forward(w.prepare("cpu"), x, out=torch.empty(13, H), **args)
    want = reference.moe_forward(w, x, logits if source != "router" else None)
    assert reference.rel_l2(out, want) < 1e-5
    result = mxmoe.verify(w, x, out, **args)
    assert result.passed and result.rel_l2 < 1e-5, result


def topk_routing(cfg, logits):
    """ids and weights of softmax_topk / topk_softmax, as the models' own code computes them."""
    if cfg.routing == "topk_softmax":
        val, ids = logits.topk(cfg.top_k, dim=-1)
        return ids.int(), val.softmax(-1)
    val, ids = logits.softmax(-1).topk(cfg.top_k, dim=-1)
    if cfg.renormalize:
        val = val / val.sum(-1, keepdim=True)
    return ids.int(), val


@pytest.mark.parametrize("name", ["qwen3", "mixtral", "gpt_oss"])
def test_precomputed_routing_matches_logits(name):
    cfg = CONFIGS[name]
    layer = mxmoe.prepare(cfg, **make_weights())
    x, logits = torch.randn(33, H), torch.randn(33, E)
    out = mxmoe.moe_forward(layer, x, logits=logits)
    assert out.shape == (33, H) and out.dtype == torch.float32 and out.norm() > 0
    ids, weights = topk_routing(cfg, logits)
    assert rel_l2(mxmoe.moe_forward(layer, x, topk_ids=ids, topk_weights=weights), out) < 1e-6


def test_router_weights_give_the_logits():
    w = make_weights()
    router_weight, router_bias = torch.randn(E, H) * 0.1, torch.randn(E) * 0.1
    layer = mxmoe.prepare(CONFIGS["deepseek"], correction_bias=torch.randn(E) * 0.01, router_weight=router_weight,
                          router_bias=router_bias, **w)
    x = torch.randn(17, H)
    logits = (x.double() @ router_weight.double().T + router_bias.double()).float()
    assert rel_l2(mxmoe.moe_forward(layer, x), mxmoe.moe_forward(layer, x, logits=logits)) < 1e-6


def test_bf16_weights_match_their_mxfp4_source():
    w = make_weights(biases=False)
    cfg = CONFIGS["qwen3"]
    gate_up = mxmoe.dequantize(w["gate_up_blocks"].view(E, 2 * I, H // 2), w["gate_up_scales"], dtype="bf16")
    down = mxmoe.dequantize(w["down_blocks"].view(E, H, I // 2), w["down_scales"], dtype="bf16")
    bf16_layer = mxmoe.prepare(cfg, gate_up=gate_up, down=down)
    x, logits = torch.randn(9, H), torch.randn(9, E)
    want = mxmoe.moe_forward(mxmoe.prepare(cfg, **w), x, logits=logits)
    assert rel_l2(mxmoe.moe_forward(bf16_layer, x, logits=logits), want) < 1e-6


def test_prepared_layer_owns_a_copy_of_the_weights():
    w = make_weights()
    layer = mxmoe.prepare(CONFIGS["gpt_oss"], **w)
    assert layer.weight_bytes == sum(t.numel() * t.element_size() for t in w.values())
    x, logits = torch.randn(6, H), torch.randn(6, E)
    want = mxmoe.moe_forward(layer, x, logits=logits)
    for t in w.values():
        t.zero_()
    del w
    assert torch.equal(mxmoe.moe_forward(layer, x, logits=logits), want)
    with layer:
        pass
    assert "closed" in repr(layer)


def test_dtypes_and_empty_batch():
    layer = mxmoe.prepare(CONFIGS["qwen3"], **make_weights())
    x, logits = torch.randn(5, H), torch.randn(5, E)
    want = mxmoe.moe_forward(layer, x, logits=logits)
    got = mxmoe.moe_forward(layer, x.bfloat16(), logits=logits.bfloat16())
    assert got.dtype == torch.bfloat16 and rel_l2(got, want) < 2e-2  # bf16 inputs and output
    out = torch.empty(5, H, dtype=torch.bfloat16)
    assert mxmoe.moe_forward(layer, x, logits=logits, out=out) is out and rel_l2(out, want) < 4e-3
    assert mxmoe.moe_forward(layer, torch.empty(0, H), logits=torch.empty(0, E)).shape == (0, H)


@requires_cuda
@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_cuda_layer_matches_cpu_backend(name, tokens):
    cfg = CONFIGS[name]
    w = make_weights()
    extra = {"correction_bias": torch.randn(E) * 0.01} if cfg.routing == "sigmoid_grouped_topk" else {}
    cpu_layer = mxmoe.prepare(cfg, **w, **extra)
    cuda_layer = mxmoe.prepare(cfg, device="cuda", **w, **extra)
    assert cuda_layer.device == "cuda:0" and cuda_layer.workspace_bytes(tokens) > 0
    x = torch.randn(tokens, H).bfloat16()
    logits = torch.randn(tokens, E)
    want = mxmoe.moe_forward(cpu_layer, x.float(), logits=logits)
    got = mxmoe.moe_forward(cuda_layer, x.cuda(), logits=logits.cuda())
    assert got.is_cuda and got.dtype == torch.bfloat16
    assert rel_l2(got.cpu(), want) <= mxmoe.forward_tolerance("cuda").rel_l2
    again = mxmoe.moe_forward(cuda_layer, x.cuda(), logits=logits.cuda())
    assert torch.equal(got, again)  # deterministic


@requires_cuda
@pytest.mark.parametrize("name", sorted(KINDS))
@pytest.mark.parametrize("biases", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("source", ["logits", "precomputed"])
@pytest.mark.parametrize("tokens", [1, 77])
def test_cuda_forward_matches_the_models_formulation(name, biases, source, tokens):
    w = kind_layer(name, biases)
    x, logits = mxmoe.synthetic_inputs(w, tokens, seed=2)
    args = routing_args(w, source, logits)
    layer = w.prepare("cuda")
    out = mxmoe.moe_forward(layer, x.cuda(), **{k: v.cuda() for k, v in args.items()})
    result = mxmoe.verify(w, x, out, **args)  # out on cuda: judged with the CUDA tolerance
    assert result.passed and result.tolerance == mxmoe.forward_tolerance("cuda"), result
    assert reference.rel_l2(out, reference.moe_forward(w, x, logits)) <= result.tolerance.rel_l2


@requires_cuda
def test_cuda_layer_needs_given_routing():
    w = kind_layer("qwen3", False, router=True)
    layer = w.prepare("cuda")
    x = torch.randn(3, H, device="cuda").bfloat16()
    with pytest.raises(mxmoe.InvalidArgument, match="routing"):
        mxmoe.moe_forward(layer, x)


@requires_cuda
def test_cuda_forward_on_the_tensors_device():
    """A call on cuda:N runs there whatever the current device is, and leaves it current."""
    w = kind_layer("gpt_oss", True)
    n = torch.cuda.device_count() - 1
    layer = w.prepare(f"cuda:{n}")
    assert layer.device == f"cuda:{n}"
    x, logits = mxmoe.synthetic_inputs(w, 5, seed=3)
    with torch.cuda.device(0):
        out = mxmoe.moe_forward(layer, x.to(f"cuda:{n}"), logits=logits.to(f"cuda:{n}"))
        assert torch.cuda.current_device() == 0
    assert out.device == torch.device(f"cuda:{n}") and mxmoe.verify(w, x, out, logits=logits).passed


def cuda_problem(name, tokens):
    """A CUDA layer of CONFIGS[name] and bf16 x, f32 logits for it on the GPU."""
    layer = mxmoe.prepare(CONFIGS[name], device="cuda", **make_weights())
    return layer, torch.randn(tokens, H, device="cuda").bfloat16(), torch.randn(tokens, E, device="cuda")


@requires_cuda
def test_cuda_graph_replays_with_new_inputs_bitwise():
    import mxmoe.torch

    layer, x, logits = cuda_problem("gpt_oss", 16)
    for _ in range(2):  # warm up (allocator, lazy module loading) outside the capture
        mxmoe.torch.moe_forward(layer, x, logits=logits)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mxmoe.torch.moe_forward(layer, x, logits=logits)
    for _ in range(3):
        x.copy_(torch.randn(16, H, device="cuda").bfloat16())
        logits.copy_(torch.randn(16, E, device="cuda"))
        graph.replay()
        eager = mxmoe.torch.moe_forward(layer, x, logits=logits)
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


def op_workspaces(layer) -> dict:
    """The workspaces torch.ops.mxmoe.moe_forward keeps for ``layer``, by stream: the C++ kernel's
    own (mxmoe.torch.NATIVE_OP), else the ones mxmoe.moe_forward keeps (PreparedMoE._workspaces)."""
    import mxmoe.torch

    return mxmoe.torch._native.workspaces(layer) if mxmoe.torch.NATIVE_OP else dict(layer._workspaces)


@pytest.fixture
def kept_workspace_bound(monkeypatch):
    """Sets the size of the workspaces kept per stream (mxmoe._moe.CACHED_WORKSPACE_BYTES and the C++
    kernel's copy of it) for one test."""
    import mxmoe.torch

    native, original = mxmoe.torch._native, mxmoe._moe.CACHED_WORKSPACE_BYTES

    def set_bound(nbytes: int) -> None:
        monkeypatch.setattr(mxmoe._moe, "CACHED_WORKSPACE_BYTES", nbytes)
        if native is not None:
            native.set_kept_workspace_bytes(nbytes)

    yield set_bound
    if native is not None:
        native.set_kept_workspace_bytes(original)


def capturing(stream: int) -> bool:
    flag = ctypes.c_int32(-1)
    mxmoe._lib.check(mxmoe._lib.lib.mxmoe_stream_capturing(stream, ctypes.byref(flag)))
    return bool(flag.value)


@requires_cuda
def test_cuda_graph_captures_a_workspace_of_its_own(kept_workspace_bound):
    """Under capture the forward takes a workspace from the graph's pool, not the one the layer
    keeps for eager forwards on that stream; eager forwards too large to use the kept one take
    torch memory meanwhile, and replays stay bitwise equal to eager."""
    import mxmoe.torch

    layer, x, logits = cuda_problem("gpt_oss", 2)
    kept_workspace_bound(layer.workspace_bytes(2))
    for _ in range(2):
        mxmoe.torch.moe_forward(layer, x, logits=logits)
    torch.cuda.synchronize()
    kept = op_workspaces(layer)
    assert list(kept) == [torch.cuda.current_stream().cuda_stream]
    graph, seen = torch.cuda.CUDAGraph(), []
    with torch.cuda.graph(graph):
        stream = torch.cuda.current_stream().cuda_stream
        seen.append(capturing(stream))
        out = mxmoe.torch.moe_forward(layer, x, logits=logits)
    assert seen == [True] and not capturing(stream)
    assert op_workspaces(layer) == kept  # capture neither used nor added one
    big, big_logits = torch.randn(24, H, device="cuda").bfloat16(), torch.randn(24, E, device="cuda")
    for _ in range(3):
        x.copy_(torch.randn(2, H, device="cuda").bfloat16())
        logits.copy_(torch.randn(2, E, device="cuda"))
        mxmoe.torch.moe_forward(layer, big, logits=big_logits)  # torch memory for the call
        graph.replay()
        eager = mxmoe.torch.moe_forward(layer, x, logits=logits)
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    assert op_workspaces(layer) == kept


@requires_cuda
def test_cuda_workspace_kept_per_stream_up_to_its_bound(monkeypatch):
    """The default workspace: one per stream, made on the stream's first forward and reused by
    the next ones there; none kept for a forward past CACHED_WORKSPACE_BYTES; freed on close."""
    layer, x, logits = cuda_problem("qwen3", 3)
    default = torch.cuda.current_stream().cuda_stream
    want = mxmoe.moe_forward(layer, x, logits=logits)
    first = layer._workspaces[default]
    assert first[2] == mxmoe._moe.CACHED_WORKSPACE_BYTES >= layer.workspace_bytes(3) and first[1] == first[0].ptr
    assert torch.equal(mxmoe.moe_forward(layer, x, logits=logits), want)
    assert layer._workspaces[default] is first  # reused, not reallocated
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = mxmoe.moe_forward(layer, x, logits=logits)
    side.synchronize()
    assert torch.equal(got, want)
    assert set(layer._workspaces) == {default, side.cuda_stream}
    assert layer._workspaces[side.cuda_stream][1] != first[1]
    monkeypatch.setattr(mxmoe._moe, "CACHED_WORKSPACE_BYTES", layer.workspace_bytes(3))
    big, big_logits = torch.randn(40, H, device="cuda").bfloat16(), torch.randn(40, E, device="cuda")
    big_want = mxmoe.moe_forward(layer, big, logits=big_logits, workspace=torch.empty(
        layer.workspace_bytes(40), dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        big_got = mxmoe.moe_forward(layer, big, logits=big_logits)
    torch.cuda.synchronize()
    assert torch.equal(big_got, big_want)
    assert set(layer._workspaces) == {default, side.cuda_stream}  # past the bound: nothing kept
    layer.close()
    assert layer._workspaces == {}


@requires_cuda
def test_cuda_forwards_on_two_streams_at_once():
    """Forwards interleaved on two streams, each behind a delay on its own stream, give what one
    stream gives: the streams' workspaces are not shared."""
    layer, x1, logits1 = cuda_problem("gpt_oss", 5)
    x2, logits2 = torch.randn(5, H, device="cuda").bfloat16(), torch.randn(5, E, device="cuda")
    want1, want2 = mxmoe.moe_forward(layer, x1, logits=logits1), mxmoe.moe_forward(layer, x2, logits=logits2)
    streams = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    outs = {0: [], 1: []}
    for _ in range(8):
        for i, (s, x, lg) in enumerate(zip(streams, (x1, x2), (logits1, logits2))):
            with torch.cuda.stream(s):
                torch.cuda._sleep(1_000_000)
                outs[i].append(mxmoe.moe_forward(layer, x, logits=lg))
    torch.cuda.synchronize()
    assert all(torch.equal(o, want1) for o in outs[0]) and all(torch.equal(o, want2) for o in outs[1])


@requires_cuda
def test_cuda_forward_on_a_given_stream(monkeypatch):
    """stream= (a cudaStream_t that is not torch's current one): the forward and its default
    workspace are on that stream, the kept one and (past the bound) torch memory for the call
    allocated for that stream."""
    layer, x, logits = cuda_problem("qwen3", 4)
    want = mxmoe.moe_forward(layer, x, logits=logits)
    other = torch.cuda.Stream()
    torch.cuda.synchronize()
    got = mxmoe.moe_forward(layer, x, logits=logits, stream=other.cuda_stream)
    other.synchronize()
    assert torch.equal(got, want) and other.cuda_stream in layer._workspaces
    monkeypatch.setattr(mxmoe._moe, "CACHED_WORKSPACE_BYTES", 0)
    third = torch.cuda.Stream()
    outs = []
    for _ in range(4):  # each call's workspace goes back to torch for `third` only, in its order
        outs.append(mxmoe.moe_forward(layer, x, logits=logits, stream=third.cuda_stream))
    third.synchronize()
    assert all(torch.equal(o, want) for o in outs) and third.cuda_stream not in layer._workspaces


@requires_cuda
def test_cuda_forward_runs_on_the_current_stream():
    layer, x, logits = cuda_problem("qwen3", 64)
    want = mxmoe.moe_forward(layer, x + 1, logits=logits)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        y = x + 1  # written late on this stream
        got = mxmoe.moe_forward(layer, y, logits=logits)
    side.synchronize()
    assert torch.equal(got, want)


@requires_cuda
def test_cuda_out_of_range_ids_are_flagged():
    layer, x, logits = cuda_problem("qwen3", 4)
    ids = torch.tensor([[0, 1], [2, E], [3, 4], [5, 6]], dtype=torch.int32, device="cuda")  # E: out of range
    weights = torch.full((4, 2), 0.5, device="cuda")
    workspace = torch.empty(layer.workspace_bytes(4), dtype=torch.uint8, device="cuda")
    mxmoe.moe_forward(layer, x, topk_ids=ids, topk_weights=weights, workspace=workspace)
    assert layer.read_error_flags(workspace) & 1
    mxmoe.moe_forward(layer, x, topk_ids=ids.clamp(max=E - 1), topk_weights=weights, workspace=workspace)
    assert layer.read_error_flags(workspace) == 0
