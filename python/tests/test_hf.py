"""The real client: Hugging Face transformers' own gpt-oss and Qwen3-MoE models (tiny configs,
random weights, nothing downloaded) with every MoE block swapped for the mxmoe op, against the
same model running the dequantized weights in its own forward."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import mxmoe  # noqa: E402
import mxmoe.hf  # noqa: E402
from conftest import requires_cuda  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "hf_moe_swap.py"
VOCAB = 320


def gpt_oss():
    cfg = transformers.GptOssConfig(
        vocab_size=VOCAB, hidden_size=96, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, num_local_experts=8, num_experts_per_tok=4, sliding_window=8,
        max_position_embeddings=4096)
    model = transformers.GptOssForCausalLM(cfg)
    with torch.no_grad():  # transformers initializes the expert biases to 0: make them count
        for _, block in mxmoe.hf.find_moe_blocks(model):
            block.experts.gate_up_proj_bias.normal_(0.0, 0.02)
            block.experts.down_proj_bias.normal_(0.0, 0.02)
            block.router.weight.normal_(0.0, 0.5)  # well-separated routing scores
    return model.to(torch.bfloat16).eval()


def qwen3_moe():
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=16, num_experts_per_tok=4,
        norm_topk_prob=True, max_position_embeddings=4096)
    model = transformers.Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        for _, block in mxmoe.hf.find_moe_blocks(model):
            block.gate.weight.normal_(0.0, 0.5)
    return model.to(torch.bfloat16).eval()


MODELS = {"gpt_oss": gpt_oss, "qwen3_moe": qwen3_moe}


def tokens(device="cpu"):
    return torch.randint(0, VOCAB, (2, 24), device=device)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_swapped_blocks_match_the_models_own_forward_on_cpu(name):
    model = MODELS[name]()
    result = mxmoe.hf.check_model(model, tokens(), rule="even")
    assert result.backend == "cpu" and result.tolerance == mxmoe.forward_tolerance("cpu")
    assert len(result.blocks) == 2
    for block in result.blocks:
        assert block.check.passed and block.rel_l2 <= result.tolerance.rel_l2, block
        assert 15.0 < block.gate_up_sqnr_db < 25.0 and 15.0 < block.down_sqnr_db < 25.0
    assert result.logits.passed and result.logits_rel_l2 <= result.tolerance.rel_l2
    assert result.passed
    # The blocks really run on mxmoe now, and can be put back.
    for _, block in mxmoe.hf.find_moe_blocks(model):
        assert isinstance(block.mxmoe_layer, mxmoe.PreparedMoE)
        mxmoe.hf.restore_block(block)
        assert not hasattr(block, "mxmoe_layer")


def test_a_wrong_layout_fails_the_check():
    """The comparison can fail: gpt-oss's interleaved gate/up read as concatenated."""
    model = gpt_oss()
    _, block = mxmoe.hf.find_moe_blocks(model)[0]
    q = mxmoe.hf.quantize_block(block)
    mxmoe.hf.load_dequantized(block, q)
    model.float()
    x = torch.randn(1, 10, model.config.hidden_size)
    want = block(x)[0]
    q.config = mxmoe.MoEConfig(**{**q.config.__dict__, "gate_up": "concatenated"})
    mxmoe.hf.swap_block(block, q)
    check = mxmoe.compare(block(x)[0], want)
    assert check.status == "failed" and check.rel_l2 > 0.1


def test_bf16_parameters_are_required():
    model = gpt_oss().float()
    _, block = mxmoe.hf.find_moe_blocks(model)[0]
    with pytest.raises(mxmoe.InvalidArgument, match="bf16"):
        mxmoe.hf.quantize_block(block)


@requires_cuda
@pytest.mark.parametrize("name", sorted(MODELS))
def test_swapped_blocks_match_the_models_own_forward_on_cuda(name):
    model = MODELS[name]().cuda()
    result = mxmoe.hf.check_model(model, tokens("cuda"), rule="even")
    assert result.backend == "cuda:0" and result.tolerance == mxmoe.forward_tolerance("cuda")
    for block in result.blocks:  # rel-L2 and the max error, both within the CUDA tolerance
        assert block.check.passed, block
    assert result.logits.passed, result.logits
    assert result.passed


@pytest.mark.parametrize("name", sorted(MODELS))
def test_example_on_a_saved_checkpoint(name, tmp_path):
    MODELS[name]().save_pretrained(tmp_path)
    run = subprocess.run([sys.executable, str(EXAMPLE), "--model", str(tmp_path), "--device", "cpu", "--layers", "1",
                          "--tokens", "12"], capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 MoE blocks on mxmoe (cpu)" in run.stdout and "PASS" in run.stdout, run.stdout
    bad = subprocess.run([sys.executable, str(EXAMPLE), "--model", str(tmp_path), "--rule", "nearest"],
                         capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert bad.returncode == 2 and "'rule'" in bad.stderr
