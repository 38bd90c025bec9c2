"""Expert and tensor parallelism through the binding (prepare's expert_map, tp_rank / tp_ranks;
include/mxmoe/forward.h prepare_options, docs/parallel.md), checked the way tests/cpu/test_parallel.cpp
checks the C++ API: a layer holding some experts against the models' own formulation
(reference.py) restricted to those experts, ranks whose maps partition the experts and shards of I
summing to the whole layer, bad options named. CUDA: the same layers against the CPU backend."""

import pytest
import torch

import mxmoe
import reference
from conftest import requires_cuda

E, H, I = 8, 64, 96  # I = 3 blocks of 32: up to 3 tensor-parallel ranks
CONFIGS = {
    "qwen3": mxmoe.MoEConfig(E, H, I, routing="softmax_topk", top_k=2),
    "gpt_oss": mxmoe.MoEConfig(E, H, I, routing="topk_softmax", top_k=4, activation="swiglu_clamped",
                               gate_up="interleaved"),
}
EXPERT_TENSORS = ("gate_up_blocks", "gate_up_scales", "down_blocks", "down_scales", "gate_up_bias", "down_bias")


def layer_and_inputs(name, tokens=11):
    w = mxmoe.synthetic_layer(CONFIGS[name], 3, biases=True)
    x, logits = mxmoe.synthetic_inputs(w, tokens, seed=4)
    return w, x, logits


def held_weights(w, expert_map):
    """The expert tensors of the experts expert_map holds, in local-index order (router tensors
    whole): what a rank's prepare takes."""
    order = sorted((local, e) for e, local in enumerate(expert_map) if local >= 0)
    idx = torch.tensor([e for _, e in order])
    return {k: (v[idx] if k in EXPERT_TENSORS else v) for k, v in w.tensors.items()}


def restricted_reference(w, x, logits, expert_map):
    """The whole layer's reference with every slot routed to an expert not held weighted 0."""
    ids, weights = reference.route(w.config, logits)
    held = torch.tensor([m >= 0 for m in expert_map])
    return reference.moe_forward(w, x, ids=ids, route_weights=weights * held[ids])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_layer_holding_some_experts_computes_their_part(name):
    w, x, logits = layer_and_inputs(name)
    expert_map = mxmoe.contiguous_expert_map(E, 3, 1)
    assert expert_map == [-1, -1, -1, 0, 1, 2, -1, -1]  # even_split{8, 3}: 3, 3, 2
    layer = mxmoe.prepare(w.config, device="cpu", expert_map=expert_map, **held_weights(w, expert_map))
    assert layer.expert_map == expert_map and layer.config == w.config
    out = mxmoe.moe_forward(layer, x, logits=logits, out=torch.empty(x.shape[0], H))
    want = restricted_reference(w, x, logits, expert_map)
    assert reference.rel_l2(out, want) < 1e-5
    # Precomputed routing over all E: the same; a token none of whose experts is held gets 0.
    ids = torch.tensor([[0, 1], [3, 6]], dtype=torch.int32).repeat(1, w.config.top_k // 2)
    weights = torch.full(ids.shape, 0.5)
    got = mxmoe.moe_forward(layer, x[:2].float(), topk_ids=ids, topk_weights=weights)
    assert torch.equal(got[0], torch.zeros(H)) and got[1].abs().sum() > 0
    assert reference.rel_l2(got, reference.moe_forward(w, x[:2], ids=ids.long(),
                                                       route_weights=weights * (ids >= 3) * (ids <= 5))) < 1e-5


@pytest.mark.parametrize("placement", ["contiguous", "scattered"])
def test_ranks_partitioning_the_experts_sum_to_the_layer(placement):
    w, x, logits = layer_and_inputs("gpt_oss")
    owners = [e * 3 // E for e in range(E)] if placement == "contiguous" else [2, 0, 1, 0, 2, 2, 1, 0]
    total = torch.zeros(x.shape[0], H, dtype=torch.float64)
    for rank in range(3):
        expert_map, nxt = [], 0
        for owner in owners:
            expert_map.append(nxt if owner == rank else -1)
            nxt += owner == rank
        if placement == "contiguous":
            assert expert_map == mxmoe.contiguous_expert_map(E, 3, rank)
        layer = mxmoe.prepare(w.config, device="cpu", expert_map=expert_map, **held_weights(w, expert_map))
        total += mxmoe.moe_forward(layer, x.float(), logits=logits).double()
    assert reference.rel_l2(total, reference.moe_forward(w, x, logits)) < 1e-5


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("ranks", [2, 3])
def test_tensor_parallel_shards_sum_to_the_layer(name, ranks):
    w, x, logits = layer_and_inputs(name)
    want = reference.moe_forward(w, x, logits)
    parts, begin = [], 0
    for rank in range(ranks):
        first, size = mxmoe.shard_intermediate(I, rank, ranks)
        assert first == begin and size % 32 == 0
        begin += size
        layer = w.prepare("cpu", tp_rank=rank, tp_ranks=ranks)
        assert layer.config.intermediate == size and layer.config.hidden == H
        parts.append(mxmoe.moe_forward(layer, x.float(), logits=logits).double())
    assert begin == I
    assert reference.rel_l2(sum(parts), want) < 1e-5
    assert reference.rel_l2(sum(parts[:-1]), want) > 1e-2  # the last shard carries part of the layer


def test_expert_and_tensor_parallel_at_once_sum_to_the_layer():
    w, x, logits = layer_and_inputs("gpt_oss")
    total = torch.zeros(x.shape[0], H, dtype=torch.float64)
    for ep in range(2):
        expert_map = mxmoe.contiguous_expert_map(E, 2, ep)
        for tp in range(3):
            layer = mxmoe.prepare(w.config, device="cpu", expert_map=expert_map, tp_rank=tp, tp_ranks=3,
                                  **held_weights(w, expert_map))
            assert layer.config.intermediate == 32 and layer.expert_map == expert_map
            total += mxmoe.moe_forward(layer, x.float(), logits=logits).double()
    assert reference.rel_l2(total, reference.moe_forward(w, x, logits)) < 1e-5


def test_bad_options_are_named():
    w, _, _ = layer_and_inputs("qwen3")
    half = mxmoe.contiguous_expert_map(E, 2, 0)
    cases = {
        "expert_map": dict(expert_map=half[:-1], **held_weights(w, half)),  # E - 1 entries
        "weights.gate_up_blocks": dict(expert_map=half, **w.tensors),  # all 8 experts for a map of 4
        "tp.ranks": dict(tp_ranks=4, **w.tensors),  # I = 96: 3 blocks
        "tp.rank": dict(tp_rank=3, tp_ranks=3, **w.tensors),
    }
    for argument, kwargs in cases.items():
        with pytest.raises(mxmoe.InvalidArgument) as e:
            mxmoe.prepare(w.config, device="cpu", **kwargs)
        assert e.value.argument == argument, e.value
        assert f"argument '{argument}': expected" in str(e.value)
    with pytest.raises(mxmoe.InvalidArgument, match="argument 'ranks': expected a value in"):
        mxmoe.contiguous_expert_map(4, 5, 0)
    with pytest.raises(mxmoe.InvalidArgument, match="argument 'intermediate'"):
        mxmoe.shard_intermediate(100, 0, 1)
    with pytest.raises(mxmoe.InvalidArgument, match="argument 'tp.rank'"):
        mxmoe.shard_intermediate(96, 2, 2)


@requires_cuda
def test_cuda_expert_map_and_shards_match_the_cpu_backend():
    w, x, logits = layer_and_inputs("gpt_oss")
    tol = mxmoe.forward_tolerance("cuda")
    expert_map = mxmoe.contiguous_expert_map(E, 2, 1)
    for options in (dict(expert_map=expert_map), dict(tp_rank=1, tp_ranks=3),
                    dict(expert_map=expert_map, tp_rank=2, tp_ranks=3)):
        weights = held_weights(w, expert_map) if "expert_map" in options else w.tensors
        cpu = mxmoe.prepare(w.config, device="cpu", **options, **weights)
        cuda = mxmoe.prepare(w.config, device="cuda", **options, **weights)
        assert cuda.config == cpu.config and cuda.expert_map == cpu.expert_map
        got = mxmoe.moe_forward(cuda, x.cuda(), logits=logits.cuda())
        want = mxmoe.moe_forward(cpu, x, logits=logits, out=torch.empty(x.shape[0], H))
        assert reference.rel_l2(got, want) < tol.rel_l2, options
