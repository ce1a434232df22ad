#!/usr/bin/env python3
"""A small random HuggingFace model directory of one family, as transformers saves it (sharded),
for trying `moetrain train --model DIR` end to end without downloading a checkpoint.

    <out>/config.json, model-0000N-of-0000M.safetensors, model.safetensors.index.json
    <out>/tokenizer.json | tiktoken.model, tokenizer_config.json   with --tokenizer DIR (e.g. one
                                  tools/make_tokenizers.py trained: tests/tokenizer/deepseek_v3,
                                  tests/tokenizer/kimi); config.json takes its bos/eos ids
    <out>/../inputs.safetensors   input_ids int64 [B, T] (`moetrain forward`; check_peft.py
                                  reads CASE/model and CASE/inputs.safetensors)

Families: kimi_linear, deepseek_v3, deepseek_v32 (shaped like tools/make_golden.py's kimi_a, v3_a
and v32_a). --dtype bf16 stores the weights as the hub checkpoints do; --fp8 quantises the
projection weights as DeepSeek ships V3 (e4m3, 128x128 block scales in *_scale_inv).

Usage: python3 tools/make_hf_model.py --family deepseek_v3 --vocab 512 --out build/hf/deepseek_v3
"""
import argparse
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden  # noqa: E402

BASE = {"kimi_linear": "kimi_a", "deepseek_v3": "v3_a", "deepseek_v32": "v32_a"}


def special_ids(tok_dir):
    """(bos, eos) ids of a tokenizer directory's bos_token / eos_token."""
    with open(os.path.join(tok_dir, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    names = {}
    if os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        with open(os.path.join(tok_dir, "tokenizer.json")) as f:
            names = {a["content"]: a["id"] for a in json.load(f)["added_tokens"]}
    names.update({v["content"]: int(k) for k, v in cfg.get("added_tokens_decoder", {}).items()})

    def content(t):
        return t.get("content") if isinstance(t, dict) else t
    return (names.get(content(cfg.get("bos_token"))), names.get(content(cfg.get("eos_token"))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", required=True, choices=sorted(BASE))
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--shard", default="100KB", help="max_shard_size for save_pretrained")
    ap.add_argument("--tokenizer", default="", help="copy this tokenizer directory's files in")
    args = ap.parse_args()
    import transformers
    from safetensors.torch import save_file

    spec = next(c for t, c in make_golden.case_specs() if c["name"] == BASE[args.family])
    cfg = dict(spec["cfg"], vocab_size=args.vocab)
    if args.family == "deepseek_v32":
        # Training sequences (64 tokens) still select 16 of their positions; the 12-token check
        # inputs keep every position, so ReLU ties in the indexer (torch.topk orders them
        # arbitrarily) cannot make the logits comparison meaningless.
        cfg["index_topk"] = 16
    bos, eos = special_ids(args.tokenizer) if args.tokenizer else (0, 1)
    cfg.update(pad_token_id=None, bos_token_id=bos, eos_token_id=eos)
    cls = {"kimi_linear": transformers.KimiLinearConfig,
           "deepseek_v3": transformers.DeepseekV3Config,
           "deepseek_v32": transformers.DeepseekV32Config}[args.family]
    torch.manual_seed(args.seed)
    model = transformers.AutoModelForCausalLM.from_config(
        cls(**cfg), attn_implementation="eager", experts_implementation="eager",
        dtype=torch.float32)
    # Weights of scale 1/sqrt(fan_in) (as make_golden.py draws them), not the 0.02 init: a
    # fine-tune should start from a model whose layers move the logits, like a trained one.
    g = torch.Generator().manual_seed(args.seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log") or name.endswith("dt_bias"):
                continue
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    model = model.to(getattr(torch, args.dtype))
    model.save_pretrained(args.out, max_shard_size=args.shard, safe_serialization=True)
    for f in ("tokenizer.json", "tiktoken.model", "tokenizer_config.json"):
        if args.tokenizer and os.path.exists(os.path.join(args.tokenizer, f)):
            shutil.copy(os.path.join(args.tokenizer, f), os.path.join(args.out, f))
    if args.fp8:
        make_golden.quantize_saved_model(args.out)
    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(0, args.vocab, (2, 12), generator=g)
    save_file({"input_ids": ids.to(torch.int64)},
              os.path.join(os.path.dirname(os.path.abspath(args.out)), "inputs.safetensors"))
    n = len([f for f in os.listdir(args.out) if f.startswith("model-")])
    print(f"{args.family}: {sum(p.numel() for p in model.parameters())} parameters, {n} shards "
          f"in {args.out}")


if __name__ == "__main__":
    main()
