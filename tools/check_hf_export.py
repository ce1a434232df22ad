#!/usr/bin/env python3
"""Checks that a `moetrain export --format hf` directory loads in transformers and gives
moetrain's logits: AutoModelForCausalLM.from_pretrained(DIR) (fp32, eager, CPU) on the input ids
of --tokens against the logits `moetrain forward --checkpoint` wrote for the trained checkpoint.
Exit status 0 when the relative error (norm-wise) is at most --tol.

Usage: python3 tools/check_hf_export.py --model EXPORT_DIR --tokens inputs.safetensors \\
           --logits moetrain_forward.safetensors [--tol 1e-4]
"""
import argparse
import json
import sys

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--logits", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    import transformers
    from safetensors.torch import load_file

    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation="eager",
        experts_implementation="eager").eval()
    ids = load_file(args.tokens)["input_ids"]
    with torch.no_grad():
        hf = model(input_ids=ids).logits.float()
    mt = load_file(args.logits)["logits"].float()
    err = ((hf - mt).norm() / mt.norm()).item()
    print(json.dumps({"model": args.model, "rel_err_logits": err, "pass": err <= args.tol,
                      "transformers": transformers.__version__}))
    return 0 if err <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
