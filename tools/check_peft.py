#!/usr/bin/env python3
"""Checks that LoRA adapters written by moetrain load into HF PEFT and give moetrain's logits.

For every case directory under --dir (made by `moetrain forward ... --lora-targets T
--save-adapter CASE/adapter`, see docs/formats.md):

    CASE/adapter/                     adapter_config.json + adapter_model.safetensors (moetrain)
    CASE/moetrain_lora.safetensors    moetrain's logits with that adapter
    CASE/moetrain_base.safetensors    moetrain's logits without it

the base model and inputs are <golden>/<case>/model and <golden>/<case>/inputs.safetensors.
Loads the transformers model (fp32, eager, CPU), wraps it with PeftModel.from_pretrained, checks
that every adapter tensor landed in the wrapped model unchanged, and compares logits. Both
PeftModel.from_pretrained, a direct state-dict load and one without PEFT's v4->v5 target
conversion are reported; all three must pass (see docs/formats.md). Draws whose router/indexer top-k has a gap below 1e-4 with the adapter
applied are reported as "ambiguous", not compared.

Inputs, per case (CASE = golden case name, optionally .TAG):
    moetrain forward --model tests/golden/CASE/model --tokens tests/golden/CASE/inputs.safetensors \
        --out DIR/CASE/moetrain_lora.safetensors \
        --lora-targets attention,kda,shared_experts,routed_experts,dense_ffn \
        --lora-rank 3 --lora-alpha 5 --lora-seed 7 --save-adapter DIR/CASE/adapter
    moetrain forward --model tests/golden/CASE/model --tokens tests/golden/CASE/inputs.safetensors \
        --out DIR/CASE/moetrain_base.safetensors

Usage: python3 tools/check_peft.py --dir build/peft_check --golden tests/golden --out peft.json
"""
import argparse
import json
import os
import sys

import torch


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def load_base(golden_case):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(golden_case, "model"), attn_implementation="eager",
        experts_implementation="eager", dtype=torch.float32)
    return model.eval()


def wrap(golden_case, adapter_dir, route):
    """route "from_pretrained": PeftModel.from_pretrained, the documented user path.
    route "state_dict": LoraConfig from adapter_config.json + get_peft_model +
    set_peft_model_state_dict with the file's tensors, which bypasses transformers' checkpoint
    key conversion (see docs/formats.md for why that matters on deepseek_v32)."""
    import peft
    from safetensors.torch import load_file

    model = load_base(golden_case)
    if route == "state_dict_no_v5_conversion":
        # PEFT >= 0.18 rewrites target_modules through transformers' v4->v5 checkpoint
        # conversions; for deepseek_v32 (mapped to qwen2_moe's) that retargets
        # shared_experts.*_proj. Without it the adapter lands exactly where it was exported.
        import peft.utils.transformers_weight_conversion as twc

        saved = twc.convert_peft_config_for_transformers
        twc.convert_peft_config_for_transformers = lambda *a, **k: None
        try:
            return wrap(golden_case, adapter_dir, "state_dict")
        finally:
            twc.convert_peft_config_for_transformers = saved
    if route == "from_pretrained":
        return peft.PeftModel.from_pretrained(model, adapter_dir, is_trainable=False).eval()
    cfg = peft.LoraConfig.from_pretrained(adapter_dir)
    cfg.inference_mode = True
    wrapped = peft.get_peft_model(model, cfg)
    tensors = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    peft.set_peft_model_state_dict(wrapped, tensors)
    return wrapped.eval()


def check_case(case_dir, golden_case):
    out = {}
    for route in ("from_pretrained", "state_dict", "state_dict_no_v5_conversion"):
        out[route] = check_route(case_dir, golden_case, route)
    return out


def check_route(case_dir, golden_case, route):
    from safetensors.torch import load_file

    model = load_base(golden_case)
    ids = load_file(os.path.join(golden_case, "inputs.safetensors"))["input_ids"]
    with torch.no_grad():
        base = model(input_ids=ids).logits.float()
    adapter_dir = os.path.join(case_dir, "adapter")
    wrapped = wrap(golden_case, adapter_dir, route)
    # Every tensor of the file must have landed, unchanged, in a LoRA module.
    state = wrapped.state_dict()
    file_tensors = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    missing, changed = [], []
    for key, t in file_tensors.items():
        live = key.replace(".lora_A.weight", ".lora_A.default.weight").replace(
            ".lora_B.weight", ".lora_B.default.weight")
        if live not in state:
            missing.append(key)
        elif not torch.equal(state[live].float(), t.float()):
            changed.append(key)
    n_lora_modules = sum(1 for _, m in wrapped.named_modules() if hasattr(m, "lora_A")
                         and "default" in getattr(m, "lora_A", {}))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_golden import routing_margins

    gaps, handles = routing_margins(wrapped)
    with torch.no_grad():
        lora = wrapped(input_ids=ids).logits.float()
    for h in handles:
        h.remove()
    mt_lora = load_file(os.path.join(case_dir, "moetrain_lora.safetensors"))["logits"]
    mt_base = load_file(os.path.join(case_dir, "moetrain_base.safetensors"))["logits"]
    return {
        "adapter_tensors": len(file_tensors),
        "peft_lora_modules": n_lora_modules,
        "missing_in_peft_model": missing,
        "changed_on_load": changed,
        "rel_err_base_logits": rel(mt_base, base),
        "rel_err_lora_logits": rel(mt_lora, lora),
        "adapter_effect_rel": rel(lora, base),
        # Smallest router / indexer top-k gap with the adapter applied: below 1e-4 the
        # selection is ambiguous in fp32 and a logits mismatch says nothing.
        "min_topk_gap": min(gaps) if gaps else None,
        "worst_positions": [int(i) for i in
                            ((mt_lora - lora).norm(dim=-1).flatten().topk(3).indices)],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="build/peft_check")
    ap.add_argument("--golden", default="tests/golden")
    ap.add_argument("--out", default="")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    import peft
    import transformers

    torch.manual_seed(0)
    result = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "peft": peft.__version__}, "cases": {}}
    ok = True
    for case in sorted(os.listdir(args.dir)):
        # CASE or CASE.TAG: the base model is <golden>/CASE.
        golden_case = os.path.join(args.golden, case.split(".")[0])
        r = check_case(os.path.join(args.dir, case), golden_case)
        for route in r.values():
            gap = route["min_topk_gap"]
            if gap is not None and gap < 1e-4:
                route["status"] = "ambiguous"  # an fp32 top-k tie: the comparison says nothing
            elif (not route["missing_in_peft_model"] and not route["changed_on_load"]
                  and route["rel_err_lora_logits"] <= args.tol
                  and route["rel_err_base_logits"] <= args.tol
                  and route["adapter_effect_rel"] > 100 * args.tol):
                route["status"] = "pass"
            else:
                route["status"] = "fail"
        # The exit status follows every route: since adapters put the deepseek types' MLP
        # projections and the routed experts under target_parameters, PEFT's v4->v5 conversion
        # leaves them alone and PeftModel.from_pretrained loads the adapter as written.
        ok &= all(route["status"] != "fail" for route in r.values())
        result["cases"][case] = r
        print(case, json.dumps(r))
    result["pass"] = ok
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
