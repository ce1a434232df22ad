#!/usr/bin/env python3
"""Golden outputs from HuggingFace transformers for moetrain's conformance tests.

Builds several tiny random kimi_linear and deepseek_v32 models, runs one forward/backward of the
mean next-token cross-entropy (labels = input_ids) in float32 and writes, per case:

    <out>/<case>/model/                 config.json + model.safetensors (save_pretrained)
    <out>/<case>/inputs.safetensors     input_ids  int64 [B, T]
    <out>/<case>/outputs.safetensors    logits [B, T, V], loss [], and the gradient of every
                                        parameter under its transformers name (a parameter with
                                        no gradient, e.g. the DSA indexer that transformers runs
                                        under no_grad, gets zeros)
    <out>/versions.json                 python, torch, transformers, safetensors (+ fla) versions

    <out>/<case>/versions.json          the same, per case (cases of several versions coexist:
                                        kimi_*/v32_* from 5.17, v3_* from 5.24)

Usage (needs torch, transformers (5.17 or 5.24), safetensors):
    python3 tools/make_golden.py --out tests/golden [--device cpu] [--only v3_a,v3_b,v3_fp8]

v3_fp8's model directory holds DeepSeek-style FP8 weights (e4m3, 128x128 block scales in
*_scale_inv, quantization_config fp8); its outputs come from the same model run on the
dequantised weights (PyTorch's float8_e4m3fn conversion times the block scale).

CPU is the default on purpose: transformers' kimi_linear falls back to its pure-PyTorch KDA when
no hub kernel is available, which keeps the goldens exact fp32 math. --device cuda works too
(fla's Triton kernels may then be used; results differ slightly).

Cases are rejected and re-drawn (new seed) when routing is ambiguous: if two experts' selection
scores (or two groups') are within MARGIN at the top-k boundary, fp32 rounding differences could
pick different experts and the comparison would be meaningless.
"""
import argparse
import json
import os
import platform
import shutil
import sys

import torch

MARGIN = 1e-4


def case_specs():
    """Tiny configurations: varied sizes, odd T, top-k < T, several experts per token."""
    kimi = [
        dict(name="kimi_a", B=2, T=9, seed=1,
             cfg=dict(vocab_size=97, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                      num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2,
                      kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4,
                      v_head_dim=8, num_local_experts=6, num_experts_per_tok=2, n_shared_experts=1,
                      n_group=1, topk_group=1, routed_scaling_factor=2.446, norm_topk_prob=True,
                      rms_norm_eps=1e-5, linear_head_dim=8, linear_num_heads=2,
                      linear_conv_kernel_dim=4,
                      layer_types=["linear_attention", "linear_attention", "full_attention",
                                   "linear_attention"],
                      mlp_layer_types=["dense", "sparse", "sparse", "sparse"])),
        dict(name="kimi_b", B=1, T=13, seed=2,
             cfg=dict(vocab_size=64, hidden_size=24, intermediate_size=40, moe_intermediate_size=12,
                      num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=3,
                      kv_lora_rank=12, q_lora_rank=None, qk_nope_head_dim=6, qk_rope_head_dim=2,
                      v_head_dim=6, num_local_experts=8, num_experts_per_tok=3, n_shared_experts=0,
                      n_group=2, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False,
                      rms_norm_eps=1e-6, linear_head_dim=6, linear_num_heads=3,
                      linear_conv_kernel_dim=3,
                      layer_types=["full_attention", "linear_attention", "linear_attention"],
                      mlp_layer_types=["sparse", "sparse", "dense"])),
        # Longer than one 64-token KDA chunk, so the inter-chunk state path is compared too.
        dict(name="kimi_c", B=1, T=67, seed=3,
             cfg=dict(vocab_size=50, hidden_size=16, intermediate_size=24, moe_intermediate_size=8,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      kv_lora_rank=8, q_lora_rank=None, qk_nope_head_dim=4, qk_rope_head_dim=2,
                      v_head_dim=4, num_local_experts=4, num_experts_per_tok=2, n_shared_experts=2,
                      n_group=1, topk_group=1, routed_scaling_factor=2.0, norm_topk_prob=True,
                      rms_norm_eps=1e-5, linear_head_dim=4, linear_num_heads=2,
                      linear_conv_kernel_dim=4,
                      layer_types=["linear_attention", "full_attention"],
                      mlp_layer_types=["sparse", "sparse"])),
    ]
    v32 = [
        dict(name="v32_a", B=2, T=11, seed=11,
             cfg=dict(vocab_size=101, hidden_size=32, intermediate_size=40, moe_intermediate_size=12,
                      num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
                      q_lora_rank=16, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4,
                      v_head_dim=8, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1,
                      n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
                      first_k_dense_replace=1, index_n_heads=4, index_head_dim=16, index_topk=5,
                      rms_norm_eps=1e-6)),
        dict(name="v32_b", B=1, T=7, seed=12,
             cfg=dict(vocab_size=61, hidden_size=24, intermediate_size=32, moe_intermediate_size=8,
                      num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=3,
                      q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4,
                      v_head_dim=6, n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=0,
                      n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False,
                      first_k_dense_replace=0, index_n_heads=3, index_head_dim=8, index_topk=3,
                      rms_norm_eps=1e-6)),
        dict(name="v32_c", B=2, T=15, seed=13,
             cfg=dict(vocab_size=80, hidden_size=16, intermediate_size=24, moe_intermediate_size=6,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      q_lora_rank=8, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=2,
                      v_head_dim=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=2,
                      n_group=2, topk_group=1, routed_scaling_factor=1.5, norm_topk_prob=True,
                      first_k_dense_replace=1, index_n_heads=6, index_head_dim=8, index_topk=4,
                      rms_norm_eps=1e-6, tie_word_embeddings=True)),
        # YaRN with the correction ramp inside the rotary dims (theta 100, 64-token original
        # context), mscale != mscale_all_dim so the cos/sin magnitude and the softmax scale both
        # differ from 1 and qk^-0.5.
        dict(name="v32_yarn", B=1, T=13, seed=14,
             cfg=dict(vocab_size=70, hidden_size=24, intermediate_size=32, moe_intermediate_size=8,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      q_lora_rank=12, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=8,
                      v_head_dim=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                      n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True,
                      first_k_dense_replace=1, index_n_heads=2, index_head_dim=12, index_topk=5,
                      rms_norm_eps=1e-6, max_position_embeddings=256,
                      rope_parameters=dict(rope_type="yarn", rope_theta=100.0, factor=4.0,
                                           original_max_position_embeddings=64, beta_fast=4,
                                           beta_slow=1, mscale=0.8, mscale_all_dim=1.0))),
        # Shaped like DeepSeek-V3.2-Exp's config: its rope_scaling verbatim (yarn, factor 40),
        # q_lora, 16 experts in 4 groups with 2 groups kept, 4 experts per token, 1 shared.
        dict(name="v32_real", B=1, T=19, seed=15,
             cfg=dict(vocab_size=128, hidden_size=48, intermediate_size=64, moe_intermediate_size=8,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                      q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                      v_head_dim=8, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1,
                      n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
                      first_k_dense_replace=1, index_n_heads=4, index_head_dim=16, index_topk=6,
                      rms_norm_eps=1e-6, max_position_embeddings=163840,
                      rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0,
                                           original_max_position_embeddings=4096, beta_fast=32,
                                           beta_slow=1, mscale=1.0, mscale_all_dim=1.0))),
        # Exact index-score ties at the top-k boundary: one indexer head, so ReLU zeroes whole
        # scores and rows with fewer than index_topk positive scores choose among equal zeros.
        # The reference runs with top-k patched to the engine's rule (the lower position wins;
        # torch.topk leaves the order among ties unspecified); made with transformers 5.24.
        dict(name="v32_ties", B=2, T=14, seed=16, index_ties=True,
             cfg=dict(vocab_size=64, hidden_size=24, intermediate_size=32, moe_intermediate_size=8,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      q_lora_rank=12, kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4,
                      v_head_dim=6, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                      n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True,
                      first_k_dense_replace=1, index_n_heads=1, index_head_dim=8, index_topk=4,
                      rms_norm_eps=1e-6)),
    ]
    # deepseek_v3 (DeepSeek-V3/R1, Kimi-K2): v3.2 without the indexer; made with transformers 5.24.
    v3 = [
        dict(name="v3_a", B=2, T=10, seed=21,
             cfg=dict(vocab_size=90, hidden_size=32, intermediate_size=40, moe_intermediate_size=12,
                      num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
                      q_lora_rank=16, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4,
                      v_head_dim=8, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1,
                      n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
                      first_k_dense_replace=1, rms_norm_eps=1e-6, num_nextn_predict_layers=0)),
        # No q_lora (q_proj), half-split rope (rope_interleave off), YaRN, tied embeddings.
        dict(name="v3_b", B=1, T=13, seed=22,
             cfg=dict(vocab_size=70, hidden_size=24, intermediate_size=32, moe_intermediate_size=8,
                      num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=3,
                      q_lora_rank=None, kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4,
                      v_head_dim=6, n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=2,
                      n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False,
                      first_k_dense_replace=0, rms_norm_eps=1e-6, rope_interleave=False,
                      tie_word_embeddings=True, max_position_embeddings=256,
                      num_nextn_predict_layers=0,
                      rope_parameters=dict(rope_type="yarn", rope_theta=100.0, factor=4.0,
                                           original_max_position_embeddings=64, beta_fast=4,
                                           beta_slow=1, mscale=0.8, mscale_all_dim=1.0))),
        # Weights shipped as DeepSeek ships V3: e4m3 with 128x128 block scales. hidden 136 and
        # q_lora 144 make full and partial blocks; the references run on the dequantised weights.
        dict(name="v3_fp8", B=1, T=9, seed=23, fp8=True,
             cfg=dict(vocab_size=64, hidden_size=136, intermediate_size=72, moe_intermediate_size=24,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      q_lora_rank=144, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                      v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                      n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                      first_k_dense_replace=1, rms_norm_eps=1e-6, num_nextn_predict_layers=0)),
    ]
    return ([("kimi_linear", c) for c in kimi] + [("deepseek_v32", c) for c in v32] +
            [("deepseek_v3", c) for c in v3])


FP8_MAX = 448.0


def quantize_fp8_blocks(w, block=(128, 128)):
    """DeepSeek's weight quantisation: per block, scale = amax / 448 and q = w / scale in e4m3
    (so each block's largest magnitude lands on +-448). Returns (q, scale_inv)."""
    R, C = w.shape
    br, bc = block
    nr, nc = -(-R // br), -(-C // bc)
    scale = torch.empty(nr, nc, dtype=torch.float32)
    for i in range(nr):
        for j in range(nc):
            blk = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            scale[i, j] = max(blk.abs().max().item(), 1e-12) / FP8_MAX
    full = scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:R, :C]
    q = (w / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8_blocks(q, scale, block=(128, 128)):
    """PyTorch's float8_e4m3fn -> float32 conversion times the block's scale."""
    R, C = q.shape
    full = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:R, :C]
    return q.to(torch.float32) * full


def fp8_quantizable(name, t):
    """What DeepSeek's FP8 checkpoints quantise: the 2-D projection weights (not embeddings,
    norms, the LM head or the router)."""
    return (t.dim() == 2 and name.endswith(".weight") and "embed_tokens" not in name and
            "lm_head" not in name and "norm" not in name and not name.endswith("mlp.gate.weight"))


def quantize_saved_model(model_dir):
    """Rewrites a save_pretrained directory in DeepSeek's FP8 layout and returns the dequantised
    state dict (what the reference model must run on)."""
    from safetensors.torch import load_file, save_file

    files = [f for f in os.listdir(model_dir) if f.endswith(".safetensors")]
    dequant = {}
    for f in files:
        path = os.path.join(model_dir, f)
        tensors = load_file(path)
        out = {}
        for name, t in tensors.items():
            if fp8_quantizable(name, t):
                q, s = quantize_fp8_blocks(t.float())
                out[name] = q.contiguous()
                out[name + "_scale_inv"] = s.contiguous()
                dequant[name] = dequantize_fp8_blocks(q, s)
            else:
                out[name] = t
                dequant[name] = t.float()
        save_file(out, path, metadata={"format": "pt"})
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as fh:
            idx = json.load(fh)
        for name, f in list(idx["weight_map"].items()):
            if name in dequant and dequant[name].dim() == 2 and fp8_quantizable(name, dequant[name]):
                idx["weight_map"][name + "_scale_inv"] = f
        with open(index, "w") as fh:
            json.dump(idx, fh, indent=2)
    cfg_path = os.path.join(model_dir, "config.json")
    with open(cfg_path) as fh:
        cfg = json.load(fh)
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                  "quant_method": "fp8", "weight_block_size": [128, 128]}
    with open(cfg_path, "w") as fh:
        json.dump(cfg, fh, indent=2)
    return dequant


def build(model_type, spec, seed, device):
    import transformers

    cfg = dict(spec["cfg"])
    # Token ids of the real checkpoints lie outside these tiny vocabularies.
    cfg.update(pad_token_id=None, bos_token_id=0, eos_token_id=1)
    if model_type == "kimi_linear":
        config = transformers.KimiLinearConfig(**cfg)
    elif model_type == "deepseek_v3":
        config = transformers.DeepseekV3Config(**cfg)
    else:
        config = transformers.DeepseekV32Config(**cfg)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", experts_implementation="eager",
        torch_dtype=torch.float32)
    model = model.to(device=device, dtype=torch.float32)
    model.train()  # dropout is 0 everywhere; train mode keeps autograd paths as in fine-tuning
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log") or name.endswith("dt_bias"):
                continue  # keep fla's decay initialisation: a realistic, stable gate range
            if p.dim() == 1 and ("norm" in name):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                # Larger than the 0.02 init so every path moves the logits measurably.
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=g))
    return model


def routing_margins(model, exact_ties=None):
    """Hooks every router and records the smallest top-k boundary gap it sees (float64). With a
    list `exact_ties`, indexer boundaries between two exactly-zero scores (ReLU ties, decided by
    the lower-position rule) are counted there instead of as gaps."""
    gaps = []

    def hook(module, inputs, _outputs):
        x = inputs[0].reshape(-1, module.weight.shape[1]).double()
        scores = torch.sigmoid(x @ module.weight.double().t())
        choice = scores + module.e_score_correction_bias.double()
        n_group, topk_group, k = module.n_group, module.topk_group, module.top_k
        E = choice.shape[-1]
        if n_group > 1:
            grp = choice.view(-1, n_group, E // n_group).topk(2, dim=-1)[0].sum(-1)
            srt = grp.sort(dim=-1, descending=True)[0]
            if topk_group < n_group:
                gaps.append((srt[:, topk_group - 1] - srt[:, topk_group]).min().item())
            keep = torch.zeros_like(grp).scatter_(1, grp.topk(topk_group, dim=-1)[1], 1.0)
            mask = keep.unsqueeze(-1).expand(-1, n_group, E // n_group).reshape(-1, E)
            choice = choice.masked_fill(mask == 0, float("-inf"))
        srt = choice.sort(dim=-1, descending=True)[0]
        if k < E:
            gap = srt[:, k - 1] - srt[:, k]
            gaps.append(gap[torch.isfinite(gap)].min().item() if torch.isfinite(gap).any() else 1.0)

    def indexer_hook(m, args, _output):
        # The indexer's top-k choice, recomputed in float64 from its own weights: the gap
        # between the k-th and (k+1)-th causal score of every query row must exceed MARGIN
        # (relu makes exact ties between positions common when few heads are used).
        from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb

        hs, q_resid, (cos, sin) = args[0], args[1], args[2]
        B, S, _ = hs.shape
        with torch.no_grad():
            q = m.wq_b(q_resid).view(B, S, m.n_heads, m.head_dim)
            r = m.qk_rope_head_dim
            q_rot, q_pass = q[..., :r], q[..., r:]
            k = m.k_norm(m.wk(hs)).unsqueeze(2)
            k_rot, k_pass = k[..., :r], k[..., r:]
            q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
            q = torch.cat([q_rot, q_pass], -1).double()
            k = torch.cat([k_rot, k_pass], -1).squeeze(2).double()
            sc = torch.relu(torch.einsum("bshd,btd->bhst", q, k)) * m.softmax_scale
            w = m.weights_proj(hs).double() * m.n_heads ** -0.5
            idx = torch.einsum("bsh,bhst->bst", w, sc)
        topk = m.index_topk
        for b in range(B):
            for s_ in range(topk, S):  # rows with more causal positions than top-k
                v = idx[b, s_, : s_ + 1].sort(descending=True)[0]
                if exact_ties is not None and v[topk - 1] == 0 and v[topk] == 0:
                    exact_ties.append((b, s_))
                else:
                    gaps.append((v[topk - 1] - v[topk]).item())

    handles = []
    for name, m in model.named_modules():
        if hasattr(m, "index_topk") and hasattr(m, "weights_proj"):
            handles.append(m.register_forward_hook(indexer_hook))
        if hasattr(m, "e_score_correction_bias") and hasattr(m, "weight") and hasattr(m, "top_k"):
            if not hasattr(m, "n_group"):
                m.n_group = getattr(m, "num_group", 1)
            handles.append(m.register_forward_hook(hook))
    return gaps, handles


def lower_position_topk(self, k, dim=-1, largest=True, sorted=True):
    """torch.topk with the engine's tie rule: among equal values the lower index comes first."""
    v, i = torch.sort(self, dim=dim, descending=largest, stable=True)
    return torch.return_types.topk((v.narrow(dim, 0, k), i.narrow(dim, 0, k)))


def run_unambiguous(name, model, run, index_ties=False):
    """run() under the routing hooks; its output after backward, or None (and a message) when
    a top-k boundary is within MARGIN, so the caller redraws. index_ties: exact zero ties at the
    indexer's boundary are wanted (at least one), resolved by lower_position_topk."""
    ties = [] if index_ties else None
    gaps, handles = routing_margins(model, ties)
    saved = torch.Tensor.topk
    if index_ties:
        torch.Tensor.topk = lower_position_topk
    try:
        out = run()
    finally:
        torch.Tensor.topk = saved
    for h in handles:
        h.remove()
    if gaps and min(gaps) < MARGIN:
        print(f"{name}: routing/index gap {min(gaps):.2e} < {MARGIN}, redrawing")
        return None
    if index_ties and not ties:
        print(f"{name}: no exact index-score tie at the top-k boundary, redrawing")
        return None
    if index_ties:
        print(f"{name}: {len(ties)} query rows choose among tied zero index scores")
    out.loss.backward()
    return out


def fp8_model(model_type, spec, seed, device):
    """The model with its weights replaced by their FP8 round trip, and the FP8 directory."""
    import tempfile

    model = build(model_type, spec, seed, device)
    tmp = tempfile.mkdtemp()
    model.save_pretrained(tmp, safe_serialization=True)
    dequant = quantize_saved_model(tmp)
    ref_dir = tempfile.mkdtemp()
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in dequant.items()},
              os.path.join(ref_dir, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(tmp, "config.json"), ref_dir)
    with open(os.path.join(ref_dir, "config.json")) as fh:
        cfg = json.load(fh)
    del cfg["quantization_config"]
    with open(os.path.join(ref_dir, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    import transformers
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        ref_dir, attn_implementation="eager", experts_implementation="eager",
        torch_dtype=torch.float32).to(device)
    ref.train()
    shutil.rmtree(ref_dir)
    return ref, tmp


def write_case(out_dir, model_type, spec, device):
    from safetensors.torch import save_file

    fp8_dir = None
    for attempt in range(20):
        seed = spec["seed"] * 100 + attempt
        if spec.get("fp8"):
            model, fp8_dir = fp8_model(model_type, spec, seed, device)
        else:
            model = build(model_type, spec, seed, device)
        g = torch.Generator().manual_seed(seed + 7)
        ids = torch.randint(0, spec["cfg"]["vocab_size"], (spec["B"], spec["T"]), generator=g)
        out = run_unambiguous(spec["name"], model,
                              lambda: model(input_ids=ids.to(device), labels=ids.to(device)),
                              index_ties=spec.get("index_ties", False))
        if out is not None:
            break
    else:
        raise SystemExit(f"{spec['name']}: no unambiguous routing in 20 draws")

    case = os.path.join(out_dir, spec["name"])
    shutil.rmtree(case, ignore_errors=True)
    os.makedirs(case)
    if fp8_dir:
        shutil.copytree(fp8_dir, os.path.join(case, "model"))
        shutil.rmtree(fp8_dir)
    else:
        model.save_pretrained(os.path.join(case, "model"), safe_serialization=True)
    tensors = {"logits": out.logits.detach().float().cpu().contiguous(),
               "loss": out.loss.detach().float().cpu().reshape(())}
    for name, p in model.named_parameters():
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        tensors[name] = grad.detach().float().cpu().contiguous()
    save_file(tensors, os.path.join(case, "outputs.safetensors"),
              metadata={"model_type": model_type, "seed": str(seed)})
    save_file({"input_ids": ids.to(torch.int64).contiguous()},
              os.path.join(case, "inputs.safetensors"))
    print(f"{spec['name']}: loss {out.loss.item():.6f}, {len(tensors) - 2} gradients")
    return case


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/golden")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", default="", help="comma-separated case names")
    args = ap.parse_args()

    import safetensors
    import transformers

    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.out, exist_ok=True)
    only = set(filter(None, args.only.split(",")))
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "safetensors": safetensors.__version__,
                "device": args.device}
    try:
        import fla
        versions["fla"] = getattr(fla, "__version__", "unknown")
    except ImportError:
        versions["fla"] = None
    for model_type, spec in case_specs():
        if not only or spec["name"] in only:
            case = write_case(args.out, model_type, spec, args.device)
            # Each case records what made it: goldens of several transformers versions coexist.
            with open(os.path.join(case, "versions.json"), "w") as f:
                json.dump(versions, f, indent=2)
                f.write("\n")
    if not only:
        with open(os.path.join(args.out, "versions.json"), "w") as f:
            json.dump(versions, f, indent=2)
            f.write("\n")
    print(json.dumps(versions))


if __name__ == "__main__":
    sys.exit(main())
