"""An MoE layer written the way the models' own PyTorch code writes it (gpt-oss, Qwen3-MoE /
Mixtral, DeepSeek-V3's grouped sigmoid routing), in float64, on weights dequantized with
mxmoe.dequantize: the tests' independent reference for mxmoe.moe_forward (it shares no code
with the library's reference, cpu::moe_forward)."""

import torch

import mxmoe


def route(cfg: mxmoe.MoEConfig, logits: torch.Tensor, correction_bias: torch.Tensor | None = None):
    """ids [T, k] and weights [T, k] (float64) of logits [T, E]."""
    logits = logits.double()
    k = cfg.top_k
    if cfg.routing == "topk_softmax":  # gpt-oss: top-k of the logits, softmax over those
        val, ids = logits.topk(k, dim=-1)
        return ids, val.softmax(-1)
    if cfg.routing == "softmax_topk":  # Qwen3-MoE (norm_topk_prob), Mixtral (renormalized too)
        val, ids = logits.softmax(-1).topk(k, dim=-1)
        return ids, val / val.sum(-1, keepdim=True) if cfg.renormalize else val
    # DeepSeek-V3: sigmoid scores; choice = score + correction bias; groups ranked by the sum of
    # their two best choices; top-k choices among the best topk_group groups; weights are the
    # scores of the chosen, renormalized, times the scaling factor.
    scores = logits.sigmoid()
    choice = scores + (correction_bias.double() if correction_bias is not None else 0.0)
    t, e = choice.shape
    groups = choice.view(t, cfg.n_group, e // cfg.n_group)
    group_score = groups.topk(min(2, e // cfg.n_group), dim=-1).values.sum(-1)
    keep = torch.zeros_like(group_score).scatter_(1, group_score.topk(cfg.topk_group, dim=-1).indices, 1.0)
    masked = choice.masked_fill(keep.repeat_interleave(e // cfg.n_group, dim=1) == 0, float("-inf"))
    ids = masked.topk(k, dim=-1).indices
    w = scores.gather(1, ids)
    if cfg.renormalize:
        w = w / w.sum(-1, keepdim=True)
    return ids, w * cfg.routed_scaling_factor


def expert_matrices(weights: mxmoe.MoEWeights):
    """gate_up [E, 2I, H] and down [E, H, I] in float64."""
    t = weights.tensors
    if weights.format == "bf16":
        return t["gate_up"].double(), t["down"].double()

    def dq(blocks, scales):
        e, n, kb, _ = blocks.shape
        return mxmoe.dequantize(blocks.reshape(e, n, kb * 16), scales).double()

    return dq(t["gate_up_blocks"], t["gate_up_scales"]), dq(t["down_blocks"], t["down_scales"])


def activation(cfg: mxmoe.MoEConfig, h: torch.Tensor) -> torch.Tensor:
    i = cfg.intermediate
    if cfg.gate_up == "interleaved":  # gpt-oss: row 2j gate j, row 2j+1 up j
        gate, up = h[..., 0::2], h[..., 1::2]
    else:
        gate, up = h[..., :i], h[..., i:]
    if cfg.activation == "silu_mul":
        return torch.nn.functional.silu(gate) * up
    gate = gate.clamp(max=cfg.limit)  # gpt-oss's clamped SwiGLU
    up = up.clamp(-cfg.limit, cfg.limit)
    return gate * torch.sigmoid(cfg.alpha * gate) * (up + 1)


def moe_forward(weights: mxmoe.MoEWeights, x: torch.Tensor, logits: torch.Tensor | None = None,
                ids: torch.Tensor | None = None, route_weights: torch.Tensor | None = None) -> torch.Tensor:
    """out [T, H] float64. Routing from logits, from (ids, route_weights), or from the router."""
    cfg, t = weights.config, weights.tensors
    x = x.double()
    if ids is None:
        if logits is None:
            logits = x @ t["router_weight"].double().T
            if t.get("router_bias") is not None:
                logits = logits + t["router_bias"].double()
        ids, route_weights = route(cfg, logits, t.get("correction_bias"))
    gate_up, down = expert_matrices(weights)
    out = torch.zeros(x.shape[0], cfg.hidden, dtype=torch.float64)
    for tok in range(x.shape[0]):
        for slot in range(ids.shape[1]):
            e = int(ids[tok, slot])
            h = gate_up[e] @ x[tok]
            if t.get("gate_up_bias") is not None:
                h = h + t["gate_up_bias"][e].double()
            y = down[e] @ activation(cfg, h)
            if t.get("down_bias") is not None:
                y = y + t["down_bias"][e].double()
            out[tok] += float(route_weights[tok, slot]) * y
    return out


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    return float((got - want).norm() / want.norm())
