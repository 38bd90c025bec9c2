"""Checkpoints through the binding: the MoE layers of files transformers itself saved (gpt-oss's
fused BF16 experts, Qwen3-MoE's per-expert names), a layer read or prepared from a file,
conversion to MXFP4 and back with the report and progress; bad files and bad arguments raise
the library's errors and leave nothing behind."""

import contextlib
import errno
import io
import os
import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import mxmoe  # noqa: E402
import mxmoe.hf  # noqa: E402
import reference  # noqa: E402
from conftest import requires_cuda  # noqa: E402
from test_hf import gpt_oss, qwen3_moe  # noqa: E402
from test_parallel import held_weights  # noqa: E402


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{name: (model, path of its model.safetensors)} for tiny gpt-oss and Qwen3-MoE models."""
    torch.manual_seed(7)
    out = {}
    for name, make in (("gpt_oss", gpt_oss), ("qwen3_moe", qwen3_moe)):
        model = make()
        d = tmp_path_factory.mktemp(name)
        model.save_pretrained(d)
        out[name] = (model, str(d / "model.safetensors"))
    return out


def blocks(model):
    return [b for _, b in mxmoe.hf.find_moe_blocks(model)]


def test_layers_of_saved_models(saved):
    with mxmoe.Checkpoint(saved["gpt_oss"][1]) as ckpt:
        assert [i.layer for i in ckpt.layers] == [0, 1]
        info = ckpt.layers[0]
        assert (info.layout, info.weight_dtype, info.format) == ("bf16_gpt_oss", "bf16", "bf16")
        assert info.optional == {"gate_up_bias": "bf16", "down_bias": "bf16", "router_weight": "bf16",
                                 "router_bias": "bf16"}
        cfg = info.config
        assert (cfg.experts, cfg.hidden, cfg.intermediate) == (8, 96, 64)
        assert (cfg.routing, cfg.top_k, cfg.activation, cfg.gate_up) == ("topk_softmax", 4, "swiglu_clamped",
                                                                          "interleaved")
        assert "2 MoE layers" in repr(ckpt)
    assert "closed" in repr(ckpt)
    with mxmoe.Checkpoint(saved["qwen3_moe"][1]) as ckpt:
        info = ckpt.layer_info(1)
        assert info.layout == "bf16_per_expert" and info.optional == {"router_weight": "bf16"}
        assert (info.config.routing, info.config.activation) == ("softmax_topk", "silu_mul")


def test_bf16_layers_read_as_the_models_parameters(saved):
    model, path = saved["qwen3_moe"]
    ex = blocks(model)[1].experts
    i = ex.gate_up_proj.shape[1] // 2
    w = mxmoe.Checkpoint(path).read_layer(1)
    assert w.format == "bf16" and w.config.gate_up == "interleaved"
    gate_up = w.tensors["gate_up"]  # [E, 2I, H], rows interleaved: even gate, odd up
    assert torch.equal(gate_up[:, 0::2], ex.gate_up_proj[:, :i]) and torch.equal(gate_up[:, 1::2], ex.gate_up_proj[:, i:])
    assert torch.equal(w.tensors["down"], ex.down_proj)
    assert torch.equal(w.tensors["router_weight"], blocks(model)[1].gate.weight)
    gpt, gpath = saved["gpt_oss"]
    ex = blocks(gpt)[0].experts  # gate_up_proj [E, H, 2I] in the x·W form
    w = mxmoe.Checkpoint(gpath).read_layer()
    assert torch.equal(w.tensors["gate_up"], ex.gate_up_proj.transpose(1, 2))
    assert torch.equal(w.tensors["gate_up_bias"], ex.gate_up_proj_bias)


def test_quantize_checkpoint_report_and_bytes(saved, tmp_path):
    model, path = saved["gpt_oss"]
    steps = []
    dst = tmp_path / "q.safetensors"
    report = mxmoe.quantize_checkpoint(path, dst, "even", progress=lambda d, t, note: steps.append((d, t, note)))
    assert [t.name for t in report.tensors] == [f"model.layers.{i}.mlp.experts.{n}_blocks" for i in (0, 1)
                                                for n in ("gate_up_proj", "down_proj")]
    assert report.tensors[0].shape == (8, 128, 3, 16) and report.tensors[1].shape == (8, 96, 2, 16)
    assert report.total.elements == 2 * 8 * 3 * 96 * 64
    assert sum(t.stats.elements for t in report.tensors) == report.total.elements
    assert 15.0 < report.total.sqnr_db < 25.0 and report.copied_tensors > 0 and report.seconds > 0
    assert report.output_bytes < report.input_bytes
    assert [d for d, _, _ in steps] == list(range(1, len(steps) + 1))
    assert len({t for _, t, _ in steps}) == 1 and steps[-1][0] <= steps[-1][1]
    assert steps[-1][2] == "layer 1 expert 7"
    # The file's MXFP4 bytes are those of quantizing the model's own parameters.
    with mxmoe.Checkpoint(dst) as q:
        info = q.layer_info(0)
        assert (info.layout, info.format) == ("mxfp4_gpt_oss", "mxfp4")
        w = q.read_layer(0)
    want = mxmoe.hf.quantize_block(blocks(model)[0], "even")
    for name in ("gate_up_blocks", "gate_up_scales", "down_blocks", "down_scales"):
        assert torch.equal(w.tensors[name], getattr(want, name)), name


def test_progress_ends_at_its_total(saved, tmp_path):
    steps = []
    mxmoe.quantize_checkpoint(saved["gpt_oss"][1], tmp_path / "q.safetensors", progress=lambda *a: steps.append(a))
    assert steps[-1][0] == steps[-1][1]


def test_nonfinite_weights_refused_unless_allowed(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(saved["gpt_oss"][1])
    name = next(n for n in tensors if n.endswith("layers.0.mlp.experts.gate_up_proj"))
    tensors[name][1, 3, 17] = float("nan")
    src, dst = tmp_path / "nan.safetensors", tmp_path / "q.safetensors"
    save_file(tensors, src, metadata={"format": "pt"})
    with pytest.raises(mxmoe.InvalidArgument) as e:
        mxmoe.quantize_checkpoint(src, dst)
    assert e.value.argument == name
    assert "NaN at [3, 17] of expert 1" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nan.safetensors"]
    report = mxmoe.quantize_checkpoint(src, dst, allow_nonfinite=True)
    assert report.total.nonfinite_blocks == 1 and report.tensors[0].stats.nonfinite_blocks == 1


def test_layer_from_a_file_runs_and_verifies(saved, tmp_path):
    _, path = saved["gpt_oss"]
    dst = tmp_path / "q.safetensors"
    mxmoe.quantize_checkpoint(path, dst)
    weights = mxmoe.Checkpoint(dst).read_layer(1)
    x, logits = mxmoe.synthetic_inputs(weights, 9, seed=3)  # logits from the file's router
    layer = mxmoe.load_layer(dst, 1, "cpu")
    assert layer.config == weights.config and layer.device == "cpu"
    out = mxmoe.moe_forward(layer, x.float(), logits=logits)
    assert torch.equal(out, mxmoe.moe_forward(weights.prepare("cpu"), x.float(), logits=logits))
    result = mxmoe.verify(weights, x, out, logits=logits)
    assert result.passed and result.reference == "f64", result
    assert reference.rel_l2(out, reference.moe_forward(weights, x, logits)) < 1e-5
    # The router weights in the file route the same as the logits computed from them.
    assert reference.rel_l2(mxmoe.moe_forward(layer, x.float()), out) < 1e-5


def quantized_layer(saved, tmp_path, L=1):
    """A checkpoint of the tiny gpt-oss quantized (E 8, H 96, I 64: 2 blocks of I), its layer L read
    back, and f32 x with the file's router logits for 9 tokens."""
    _, path = saved["gpt_oss"]
    dst = tmp_path / "q.safetensors"
    mxmoe.quantize_checkpoint(path, dst)
    ckpt = mxmoe.Checkpoint(dst)
    weights = ckpt.read_layer(L)
    x, logits = mxmoe.synthetic_inputs(weights, 9, seed=3)
    return ckpt, weights, x.float(), logits


# Contiguous over 2 ranks, and a scattered map (odd experts, in reverse local order).
EXPERT_MAPS = ([0, 1, 2, 3, -1, -1, -1, -1], [-1, 3, -1, 2, -1, 1, -1, 0])


def test_prepare_options_from_a_file(saved, tmp_path):
    """Checkpoint.prepare_layer's expert_map / tp_rank / tp_ranks: bit for bit the layer that
    mxmoe.prepare gives for the same options on the file's weights (the held experts taken out of
    them); the ranks of a placement, and the shards of I, sum to the whole layer."""
    ckpt, weights, x, logits = quantized_layer(saved, tmp_path)
    cfg = weights.config
    whole = mxmoe.moe_forward(ckpt.prepare_layer(1), x, logits=logits)

    def same_as_prepare(options, **expect):
        layer = ckpt.prepare_layer(1, "cpu", **options)
        tensors = held_weights(weights, options["expert_map"]) if "expert_map" in options else weights.tensors
        want = mxmoe.prepare(cfg, device="cpu", **options, **tensors)
        assert layer.config == want.config and layer.expert_map == want.expert_map
        for name, value in expect.items():
            assert getattr(layer, name) == value, name
        out = mxmoe.moe_forward(layer, x, logits=logits)
        assert torch.equal(out, mxmoe.moe_forward(want, x, logits=logits))
        return out

    for expert_map in EXPERT_MAPS:
        held = same_as_prepare(dict(expert_map=expert_map), expert_map=expert_map, config=cfg)
        rest = [-1] * cfg.experts
        for local, e in enumerate(e for e, m in enumerate(expert_map) if m < 0):
            rest[e] = local
        others = same_as_prepare(dict(expert_map=rest), expert_map=rest)
        assert reference.rel_l2(held + others, whole) < 1e-5
    shards = [same_as_prepare(dict(tp_rank=r, tp_ranks=2)) for r in range(2)]
    assert ckpt.prepare_layer(1, tp_rank=1, tp_ranks=2).config.intermediate == 32
    assert reference.rel_l2(shards[0] + shards[1], whole) < 1e-5
    same_as_prepare(dict(expert_map=EXPERT_MAPS[1], tp_rank=1, tp_ranks=2))
    assert torch.equal(mxmoe.moe_forward(mxmoe.load_layer(ckpt.path, 1, expert_map=EXPERT_MAPS[0]), x,
                                         logits=logits),
                       mxmoe.moe_forward(ckpt.prepare_layer(1, expert_map=EXPERT_MAPS[0]), x, logits=logits))
    expect_invalid("expert_map", ckpt.prepare_layer, 1, expert_map=[0, 1, 2])
    expect_invalid("expert_map", ckpt.prepare_layer, 1, expert_map=[0, 0, -1, -1, -1, -1, -1, -1])
    expect_invalid("tp.rank", ckpt.prepare_layer, 1, tp_rank=2, tp_ranks=2)


@requires_cuda
def test_cuda_prepare_options_from_a_file(saved, tmp_path):
    """The same options on the CUDA backend: the CPU backend's layer at the CUDA tolerance."""
    ckpt, weights, x, logits = quantized_layer(saved, tmp_path)
    for options in (dict(expert_map=EXPERT_MAPS[1]), dict(tp_rank=1, tp_ranks=2),
                    dict(expert_map=EXPERT_MAPS[0], tp_rank=0, tp_ranks=2)):
        cpu, cuda = ckpt.prepare_layer(1, "cpu", **options), ckpt.prepare_layer(1, "cuda", **options)
        assert cuda.config == cpu.config and cuda.expert_map == cpu.expert_map
        got = mxmoe.moe_forward(cuda, x.bfloat16().cuda(), logits=logits.cuda())
        want = mxmoe.moe_forward(cpu, x.bfloat16().float(), logits=logits)
        assert reference.rel_l2(got, want) < mxmoe.forward_tolerance("cuda").rel_l2, options


def test_dequantize_checkpoint_is_exact(saved, tmp_path):
    _, path = saved["qwen3_moe"]
    q, d = tmp_path / "q.safetensors", tmp_path / "d.safetensors"
    mxmoe.quantize_checkpoint(path, q, "mse")
    calls = []
    assert mxmoe.dequantize_checkpoint(q, d, progress=lambda *a: calls.append(a)) is None
    assert calls and calls[-1][2] == "layer 1 expert 15"
    mx = mxmoe.Checkpoint(q).read_layer(0)
    bf = mxmoe.Checkpoint(d)
    assert bf.layers[0].layout == "bf16_gpt_oss"
    back = bf.read_layer(0)
    gate_up, down = reference.expert_matrices(mx)
    assert torch.equal(back.tensors["gate_up"].double(), gate_up) and torch.equal(back.tensors["down"].double(), down)


def test_a_config_replaces_the_files(saved):
    _, path = saved["qwen3_moe"]
    info = mxmoe.Checkpoint(path).layer_info(0)
    cfg = mxmoe.MoEConfig(**{**info.config.__dict__, "top_k": 4})  # the model's num_experts_per_tok
    layer = mxmoe.load_layer(path, 0, config=cfg)  # a BF16 layer on the CPU backend
    assert layer.config.top_k == 4


def expect_invalid(argument, fn, *args, **kwargs):
    with pytest.raises(mxmoe.InvalidArgument) as info:
        fn(*args, **kwargs)
    assert info.value.argument == argument, str(info.value)
    return info.value


def test_bad_files_and_arguments(saved, tmp_path):
    _, path = saved["gpt_oss"]
    with pytest.raises(mxmoe.IOFailure) as e:
        mxmoe.Checkpoint(tmp_path / "absent.safetensors")
    assert e.value.errno == errno.ENOENT and isinstance(e.value, OSError) and "absent.safetensors" in str(e.value)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    with pytest.raises(mxmoe.FormatError, match="garbage.safetensors"):
        mxmoe.Checkpoint(garbage)
    expect_invalid("path", mxmoe.Checkpoint, 42)
    ckpt = mxmoe.Checkpoint(path)
    err = expect_invalid("layer", ckpt.read_layer, 5)
    assert "0, 1" in str(err)
    expect_invalid("device", ckpt.prepare_layer, 0, "tpu")
    expect_invalid("cfg.routing.top_k", ckpt.prepare_layer, 0, "cpu",
                   mxmoe.MoEConfig(8, 96, 64, routing="topk_softmax", top_k=9))
    expect_invalid("weights.gate_up", ckpt.prepare_layer, 0, "cpu", mxmoe.MoEConfig(8, 96, 32, top_k=2))
    if not mxmoe.cuda.available():
        expect_invalid("device_type", ckpt.prepare_layer, 0, "cuda")  # a BF16 layer: cpu only
    ckpt.close()
    ckpt.close()
    expect_invalid("checkpoint", ckpt.read_layer, 0)
    q = tmp_path / "q.safetensors"
    mxmoe.quantize_checkpoint(path, q)
    expect_invalid("IN", mxmoe.quantize_checkpoint, q, tmp_path / "again.safetensors")  # already MXFP4
    expect_invalid("IN", mxmoe.dequantize_checkpoint, path, tmp_path / "bf16.safetensors")  # not MXFP4
    expect_invalid("rule", mxmoe.quantize_checkpoint, path, tmp_path / "x.safetensors", "nearest")
    import safetensors.torch

    empty = tmp_path / "no_moe.safetensors"  # a file without MoE layers: opens, lists none, loading says so

    safetensors.torch.save_file({"w": torch.zeros(4, 4)}, str(empty))
    assert mxmoe.Checkpoint(empty).layers == []
    expect_invalid("path", mxmoe.load_layer, empty)
    assert sorted(os.listdir(tmp_path)) == sorted(["garbage.safetensors", "q.safetensors", "no_moe.safetensors"])


def test_existing_output_is_kept_unless_overwrite(saved, tmp_path):
    _, path = saved["qwen3_moe"]
    dst = tmp_path / "q.safetensors"
    dst.write_bytes(b"precious")
    expect_invalid("output", mxmoe.quantize_checkpoint, path, dst)
    assert dst.read_bytes() == b"precious"
    mxmoe.quantize_checkpoint(path, dst, overwrite=True)
    assert mxmoe.Checkpoint(dst).layers[0].layout == "mxfp4_gpt_oss"


def test_a_raising_progress_callback_stops_the_conversion(saved, tmp_path):
    _, path = saved["gpt_oss"]
    dst = tmp_path / "q.safetensors"

    def stop(done, total, note):
        if done == 3:
            raise RuntimeError("enough")

    with pytest.raises(mxmoe.Cancelled) as e:
        mxmoe.quantize_checkpoint(path, dst, progress=stop)
    assert isinstance(e.value.__cause__, RuntimeError) and "enough" in str(e.value)

    def interrupt(done, total, note):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        mxmoe.quantize_checkpoint(path, dst, progress=interrupt)
    assert os.listdir(tmp_path) == []  # no output, no temporary file


@requires_cuda
def test_cuda_layer_from_a_file(saved, tmp_path):
    _, path = saved["gpt_oss"]
    q, qc = tmp_path / "q.safetensors", tmp_path / "qc.safetensors"
    mxmoe.quantize_checkpoint(path, q)
    mxmoe.quantize_checkpoint(path, qc, device="cuda")
    assert q.read_bytes() == qc.read_bytes()  # the quantizer's device changes nothing
    weights = mxmoe.Checkpoint(q).read_layer(0)
    layer = mxmoe.load_layer(q, 0, "cuda")
    assert layer.device == "cuda:0"
    x, logits = mxmoe.synthetic_inputs(weights, 40, seed=5)
    out = mxmoe.moe_forward(layer, x.cuda(), logits=logits.cuda())
    result = mxmoe.verify(weights, x, out, logits=logits)
    assert result.passed and result.tolerance == mxmoe.forward_tolerance("cuda"), result


def test_the_docs_example_runs(saved, tmp_path, monkeypatch):
    """The first Python block of docs/python.md's Example, on a tiny gpt-oss saved by transformers."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "python.md").read_text()
    example = text.split("## Example", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    shutil.copy(saved["gpt_oss"][1], tmp_path / "bf16.safetensors")
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(example, "docs/python.md", "exec"), {})
    lines = printed.getvalue().splitlines()
    assert lines[0].startswith("4 MXFP4 tensors, SQNR ") and lines[1].startswith("passed vs the cpu f64 reference")
