#!/usr/bin/env python3
"""Run a Hugging Face gpt-oss or Qwen3-MoE checkpoint's MoE blocks on mxmoe and check them.

For every MoE block of the model in --model (a local checkpoint directory: config.json and
safetensors; nothing is downloaded): quantize the block's own BF16 expert weights to MXFP4 (rule
--rule), make the model the reference (its blocks hold the dequantized weights, in its own
forward), run it on random tokens, then swap every block's forward for the mxmoe op
(torch.ops.mxmoe.moe_forward) and compare each block's output and the whole model's logits.

    python examples/hf_moe_swap.py --model /path/to/gpt-oss-20b --device cuda --layers 4
    python examples/hf_moe_swap.py --model /path/to/Qwen3-30B-A3B --device cpu --layers 2

Prints one line per block (rel-L2 and max error relative to max |ref| against the block's own
float32 forward, weight SQNR), the logits' and PASS/FAIL under mxmoe.forward_tolerance (CPU:
rel-L2 1e-4; CUDA: rel-L2 4e-3 and max error 1.5e-2 x max |ref|). Exit code 0 on pass, 1 on
failure, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (where the model and mxmoe run)")
    p.add_argument("--rule", default="even", help="scale rule: floor | even | rceil | mse")
    p.add_argument("--tokens", type=int, default=16, help="tokens per sequence (default 16)")
    p.add_argument("--batch", type=int, default=2, help="sequences (default 2)")
    p.add_argument("--layers", type=int, default=0, help="keep only the first N decoder layers (0: all)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="what the reference model runs in after quantization (default float32)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import mxmoe
    import mxmoe.hf

    config = AutoConfig.from_pretrained(args.model, local_files_only=True)
    if args.layers:
        config.num_hidden_layers = min(args.layers, config.num_hidden_layers)
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[: config.num_hidden_layers]
    # The expert weights as BF16 (gpt-oss MXFP4 checkpoints are dequantized by transformers).
    extra = {}
    if getattr(config, "quantization_config", None) and config.model_type == "gpt_oss":
        from transformers import Mxfp4Config

        extra["quantization_config"] = Mxfp4Config(dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(args.model, config=config, dtype=torch.bfloat16,
                                                 local_files_only=True, **extra)
    model = model.to(args.device).eval()
    torch.manual_seed(args.seed)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.tokens), device=args.device)

    try:
        result = mxmoe.hf.check_model(model, ids, rule=args.rule, dtype=getattr(torch, args.dtype))
    except mxmoe.InvalidArgument as e:
        print(f"hf_moe_swap: {e}", file=sys.stderr)
        return 2
    print(f"{type(model).__name__}: {len(result.blocks)} MoE blocks on mxmoe ({result.backend}), rule {args.rule}")
    print(f"{'block':40s} {'rel-L2':>10s} {'max err':>9s} {'SQNR gate_up':>13s} {'SQNR down':>10s}")
    for b in result.blocks:
        print(f"{b.name:40s} {b.rel_l2:10.3e} {b.check.max_err_rel:9.2e} {b.gate_up_sqnr_db:10.2f} dB "
              f"{b.down_sqnr_db:7.2f} dB  {b.check.status}")
    print(f"{'logits':40s} {result.logits_rel_l2:10.3e} {result.logits.max_err_rel:9.2e}  {result.logits.status}")
    tol = result.tolerance
    print(f"tolerance rel-L2 {tol.rel_l2:.0e}, max err {tol.max_err_rel:.1e} x max|ref|: "
          f"{'PASS' if result.passed else 'FAIL'}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
