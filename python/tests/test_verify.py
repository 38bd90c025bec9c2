"""Verification, synthetic layers and presets through the binding: mxmoe.verify / compare judge
with the library's tolerances (and can fail), the synthetic generator is deterministic and its
layers run, the presets are the models' (docs/models.md)."""

import math

import pytest
import torch

import mxmoe
import reference


def test_tolerances_are_the_librarys():
    cpu, cuda = mxmoe.forward_tolerance("cpu"), mxmoe.forward_tolerance("cuda:0")
    assert (cpu.rel_l2, cpu.max_err_rel) == (1e-4, math.inf)
    assert (cuda.rel_l2, cuda.max_err_rel) == (4e-3, 1.5e-2)


def test_compare_judges_and_can_fail():
    ref = torch.randn(64, 256)
    assert mxmoe.compare(ref.clone(), ref).status == "passed"
    noisy = ref + 1e-3 * ref.norm() / ref.numel() ** 0.5 * torch.randn(64, 256)  # rel-L2 ~ 1e-3
    r = mxmoe.compare(noisy, ref)
    assert r.status == "failed" and 5e-4 < r.rel_l2 < 2e-3 and r.elements == 64 * 256
    assert mxmoe.compare(noisy, ref, backend="cuda").passed  # within the CUDA tolerance
    spike = ref.clone()
    spike[3, 7] += 0.05 * ref.abs().max()  # one large error: rel-L2 small, max error not
    r = mxmoe.compare(spike, ref, backend="cuda")
    assert r.status == "failed" and r.rel_l2 < 4e-3 and r.max_err_rel > 1.5e-2
    bad = ref.clone()
    bad[0, 0] = float("inf")
    r = mxmoe.compare(bad, ref)
    assert r.status == "nonfinite_output" and r.nonfinite_out == 1 and math.isinf(r.rel_l2)
    assert mxmoe.compare(ref.bfloat16(), ref.bfloat16()).passed
    assert mxmoe.compare(ref.t(), ref.t().contiguous()).passed  # strided inputs are made contiguous


def test_verify_catches_a_wrong_output():
    w = mxmoe.synthetic_layer(mxmoe.MoEConfig(8, 64, 32, top_k=2), seed=1)
    x, logits = mxmoe.synthetic_inputs(w, 6, seed=2)
    out = torch.empty(6, 64)
    mxmoe.moe_forward(w.prepare(), x, logits=logits, out=out)
    good = mxmoe.verify(w, x, out, logits=logits)
    assert good.passed and good.reference == "f64" and good.rel_l2 < 1e-6 and good.reference_seconds >= 0
    assert "passed vs the cpu f64 reference" in str(good)
    wrong = mxmoe.verify(w, x, out, logits=logits.flip(1))  # the output of another routing
    assert wrong.status == "failed" and wrong.rel_l2 > 0.1
    assert mxmoe.verify(w, x, out, logits=logits, reference="auto").reference == "f64"
    with pytest.raises(mxmoe.InvalidArgument, match="'reference'") as e:
        mxmoe.verify(w, x, out, logits=logits, reference="f32")  # the CPU backend against itself
    assert e.value.argument == "reference"
    assert mxmoe.verify(w, x, out.bfloat16(), logits=logits, backend="cuda", reference="f32").passed


def test_verify_bad_input():
    w = mxmoe.synthetic_layer(mxmoe.MoEConfig(8, 64, 32, top_k=2))
    x, logits = mxmoe.synthetic_inputs(w, 4)
    out = torch.zeros(4, 64)
    for argument, call in [
        ("weights", lambda: mxmoe.verify(w.tensors, x, out, logits=logits)),
        ("x", lambda: mxmoe.verify(w, x[:, :32], out, logits=logits)),
        ("out", lambda: mxmoe.verify(w, x, out[:3], logits=logits)),
        ("routing.logits", lambda: mxmoe.verify(w, x, out, logits=logits[:, :4])),
        ("reference", lambda: mxmoe.verify(w, x, out, logits=logits, reference="f16")),
        ("device", lambda: mxmoe.verify(w, x, out, logits=logits, backend="tpu")),
        ("routing", lambda: mxmoe.verify(w, x, out)),  # no logits and no router weights
        ("out", lambda: mxmoe.compare(out, out[:2])),
        ("ref", lambda: mxmoe.compare(out, out.double())),
    ]:
        with pytest.raises(mxmoe.InvalidArgument) as e:
            call()
        assert e.value.argument == argument, (argument, str(e.value))


def test_presets_are_the_models():
    presets = mxmoe.presets()
    assert list(presets)[:5] == ["gpt-oss-120b", "gpt-oss-20b", "qwen3-30b-a3b", "deepseek-v3", "kimi-k2"]
    g = presets["gpt-oss-120b"]
    assert g.has_biases and (g.config.experts, g.config.hidden, g.config.intermediate, g.config.top_k) == (128, 2880,
                                                                                                           2880, 4)
    assert (g.config.routing, g.config.activation, g.config.gate_up) == ("topk_softmax", "swiglu_clamped",
                                                                         "interleaved")
    d = mxmoe.MoEConfig.from_preset("deepseek-v3")
    assert (d.routing, d.top_k, d.n_group, d.topk_group, d.routed_scaling_factor) == ("sigmoid_grouped_topk", 8, 8, 4,
                                                                                       2.5)
    assert mxmoe.MoEConfig.from_preset("kimi-k2", experts=16).experts == 16
    q = mxmoe.MoEConfig.from_preset("qwen3-30b-a3b")
    assert (q.experts, q.hidden, q.intermediate, q.top_k, q.renormalize) == (128, 2048, 768, 8, True)
    with pytest.raises(mxmoe.InvalidArgument, match="gpt-oss-20b") as e:
        mxmoe.MoEConfig.from_preset("gpt-5")
    assert e.value.argument == "name"
    for p in presets.values():
        p.config.validate()


def test_synthetic_layers_are_deterministic_and_run():
    a = mxmoe.synthetic_layer("gpt-oss-20b", seed=4, experts=4)
    assert a.config.experts == 4 and a.format == "mxfp4"
    assert sorted(a.tensors) == ["down_bias", "down_blocks", "down_scales", "gate_up_bias", "gate_up_blocks",
                                 "gate_up_scales"]
    assert a.tensors["gate_up_blocks"].shape == (4, 5760, 90, 16) and a.tensors["gate_up_bias"].dtype == torch.bfloat16
    b = mxmoe.synthetic_layer("gpt-oss-20b", seed=4, experts=4)
    c = mxmoe.synthetic_layer("gpt-oss-20b", seed=5, experts=4)
    assert all(torch.equal(a.tensors[n], b.tensors[n]) for n in a.tensors)
    assert not torch.equal(a.tensors["down_blocks"], c.tensors["down_blocks"])
    assert len(a.tensors["gate_up_scales"].unique()) <= 3  # centre +- 1 (synthetic.h)
    assert "gate_up_bias" not in mxmoe.synthetic_layer("gpt-oss-20b", experts=4, biases=False).tensors
    cfg = mxmoe.MoEConfig.from_preset("deepseek-v3", experts=16)
    cfg = mxmoe.MoEConfig(**{**cfg.__dict__, "hidden": 128, "intermediate": 64})
    d = mxmoe.synthetic_layer(cfg, seed=1, correction_bias=True)
    assert d.tensors["correction_bias"].shape == (16,) and d.tensors["correction_bias"].dtype == torch.float32
    x, logits = mxmoe.synthetic_inputs(cfg, 5, seed=9)
    assert x.dtype == torch.bfloat16 and x.shape == (5, 128) and logits.shape == (5, 16)
    assert torch.equal(x, mxmoe.synthetic_inputs(d, 5, seed=9)[0])
    out = mxmoe.moe_forward(d.prepare(), x, logits=logits, out=torch.empty(5, 128))
    assert 0.1 < out.std() < 10  # O(1) outputs: the recipe's point
    assert mxmoe.verify(d, x, out, logits=logits).passed
    assert reference.rel_l2(out, reference.moe_forward(d, x, logits)) < 1e-5


def test_synthetic_inputs_use_the_router():
    w = mxmoe.synthetic_layer(mxmoe.MoEConfig(8, 64, 32, top_k=2))
    w.tensors["router_weight"] = torch.randn(8, 64)
    w.tensors["router_bias"] = torch.randn(8)
    x, logits = mxmoe.synthetic_inputs(w, 7)
    want = x.double() @ w.tensors["router_weight"].double().T + w.tensors["router_bias"].double()
    assert torch.allclose(logits.double(), want, rtol=1e-6, atol=1e-6)


def test_synthetic_bad_input():
    for argument, call in [
        ("cfg.routing.top_k", lambda: mxmoe.synthetic_layer(mxmoe.MoEConfig(4, 64, 32, top_k=5))),
        ("cfg.shape.hidden", lambda: mxmoe.synthetic_layer(mxmoe.MoEConfig(4, 40, 32))),
        ("name", lambda: mxmoe.synthetic_layer("mixtral-8x7b")),
        ("experts", lambda: mxmoe.synthetic_layer(mxmoe.MoEConfig(4, 64, 32), experts=2)),
        ("cfg.routing.top_k", lambda: mxmoe.synthetic_layer("gpt-oss-20b", experts=2)),  # top-4 of 2 experts
        ("tokens", lambda: mxmoe.synthetic_inputs(mxmoe.MoEConfig(4, 64, 32), -1)),
        ("config", lambda: mxmoe.synthetic_inputs("qwen3", 4)),
        ("correction_bias", lambda: mxmoe.synthetic_layer(mxmoe.MoEConfig(4, 64, 32), correction_bias=True)),
    ]:
        with pytest.raises(mxmoe.InvalidArgument) as e:
            call()
        assert e.value.argument == argument, (argument, str(e.value))
