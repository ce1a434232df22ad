// Layer configurations: everything that changes the math of a layer, already resolved (no HF
// spellings here; io/hf_config.* maps config.json onto these).
#pragma once

#include <cstdint>
#include <string>

#include "model/linear_module.h"
#include "ops/kda.h"
#include "ops/rope.h"

namespace mt {

// Kimi Delta Attention.
struct KdaConfig {
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;  // dk = dv
  int64_t conv_kernel = 4;
  float norm_eps = 1e-5f;  // per-head output RMSNorm
  int64_t chunk = 64;
  bool chunked = true;  // false: token-by-token recurrence (the reference algorithm)
  LoraSpec lora;        // applied to every projection of the layer
  // Which CUDA kernels run the core (ops/kda.h; the job's `kernels.kda`): not part of a
  // checkpoint's config; the planner sizes the choice's saved tensors and scratch.
  ops::KdaKernels kernels;
};

// Multi-head latent attention (dense, causal), as kimi_linear's full-attention layers use it and
// as the attention half of gated DSA.
struct MlaConfig {
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t q_lora_rank = 0;  // 0: q = W_q x directly
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_dim = 0;
  int64_t qk_rope_dim = 0;  // 0: no rotary part
  int64_t v_head_dim = 0;
  float rope_theta = 10000.f;
  ops::RopeStyle rope_style = ops::RopeStyle::Interleaved;
  ops::RopeScaling rope_scaling;  // YaRN; the DSA indexer shares it
  bool use_rope = true;           // kimi_linear: mla_use_nope = true -> no rope at all
  float norm_eps = 1e-6f;         // q_a_layernorm, kv_a_layernorm
  float softmax_scale = 0;        // 0: (qk_nope_dim + qk_rope_dim)^-0.5
  bool output_gate = false;  // element-wise sigmoid gate per head (Gated Attention, G1 position)
  LoraSpec lora;
};

// Gated DeepSeek sparse attention: MLA + lightning indexer + top-k selection.
struct DsaConfig {
  MlaConfig mla;  // output_gate = true for the hybrid
  int64_t index_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_rope_dim = 0;  // rotary part of the indexer head (first dims, half-split style)
  int64_t index_topk = 0;
  float indexer_norm_eps = 1e-6f;
  float indexer_loss_coeff = 1.0f;
  bool dense_warmup = false;  // dense attention; only the indexer learns (KL vs full attention)
};

enum class RouterScore { Softmax, Sigmoid };

// Latent Mixture-of-Experts block.
struct MoeConfig {
  int64_t hidden = 0;
  int64_t latent = 0;  // latent width l; l == hidden disables the d->l->d projections
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t expert_ffn = 0;
  int64_t num_shared = 0;  // shared experts, fused into one SwiGLU of num_shared * shared_ffn
  int64_t shared_ffn = 0;
  RouterScore score = RouterScore::Sigmoid;
  int64_t n_group = 1;  // group-limited routing: keep topk_group of n_group groups
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling = 1.0f;
  bool selection_bias = false;  // aux-loss-free bias (added to scores for selection only)
  float bias_update_rate = 1e-3f;
  float seq_aux_coeff = 0.0f;
  float z_loss_coeff = 0.0f;
  LoraSpec lora;         // shared experts + latent projections
  LoraSpec expert_lora;  // per routed expert (gate/up/down)
};

struct DenseFfnConfig {
  int64_t hidden = 0;
  int64_t ffn = 0;
  LoraSpec lora;
};

}  // namespace mt
