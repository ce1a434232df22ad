// Double-precision reference of the vision tower's encoder layer and of the tower + projector,
// composed from the op references. Parameters are keyed by the layers' local HF names.
#pragma once

#include <map>
#include <string>

#include "model/vision/vision_block.h"
#include "model/vision/vision_config.h"
#include "ref/linear_ref.h"
#include "ref/norm_ref.h"
#include "ref/vision_ref.h"

namespace mt::ref {

using Params = std::map<std::string, DVec>;

// x W^T + b (+ LoRA) for the projection `name` of `p` (prefix included in name).
inline DVec biased_linear(const Params& p, const std::string& name, const DVec& x, int64_t T,
                          int64_t in, int64_t out, const LoraSpec& lora) {
  const DVec none;
  const bool r = lora.rank > 0;
  return bias_add(
      linear(x, p.at(name + ".weight"), r ? p.at(name + ".lora_A.weight") : none,
             r ? p.at(name + ".lora_B.weight") : none, T, in, out, lora.rank, lora.alpha),
      p.at(name + ".bias"));
}

inline DVec vision_block(const VisionBlockConfig& cfg, const Params& p, const std::string& pre,
                         const DVec& x, const Grids& grids) {
  const int64_t D = cfg.hidden, H = cfg.heads, Dh = cfg.hidden / cfg.heads, I = cfg.intermediate;
  std::vector<int64_t> offsets{0};
  DVec pos;
  for (const auto& g : grids) {
    offsets.push_back(offsets.back() + g[0] * g[1]);
    for (int64_t r = 0; r < g[0]; ++r)
      for (int64_t c = 0; c < g[1]; ++c) {
        pos.push_back(static_cast<double>(r));
        pos.push_back(static_cast<double>(c));
      }
  }
  const int64_t T = offsets.back();
  auto lin = [&](const std::string& n, const DVec& in, int64_t a, int64_t b) {
    return biased_linear(p, pre + n, in, T, a, b, cfg.lora);
  };
  const DVec h1 =
      layernorm(x, p.at(pre + "norm1.weight"), p.at(pre + "norm1.bias"), T, D, cfg.norm_eps).y;
  const DVec q = rope2d(lin("attn.q_proj", h1, D, D), pos, T, H, Dh, cfg.rope_theta);
  const DVec k = rope2d(lin("attn.k_proj", h1, D, D), pos, T, H, Dh, cfg.rope_theta);
  const DVec v = lin("attn.v_proj", h1, D, D);
  const DVec o = full_attention(q, k, v, offsets, H, Dh, 1.0 / std::sqrt(static_cast<double>(Dh)));
  DVec x1 = lin("attn.proj", o, D, D);
  for (size_t i = 0; i < x1.size(); ++i) x1[i] += x[i];
  const DVec h2 =
      layernorm(x1, p.at(pre + "norm2.weight"), p.at(pre + "norm2.bias"), T, D, cfg.norm_eps).y;
  const DVec g = gelu(lin("mlp.fc1", h2, D, I), cfg.act == ops::GeluKind::Tanh);
  DVec y = lin("mlp.fc2", g, I, D);
  for (size_t i = 0; i < y.size(); ++i) y[i] += x1[i];
  return y;
}

// Tower + projector: pixels [N, C P P] -> [N / (kh kw), text_hidden]. Tower parameters under
// "tower.", projector parameters under "proj.".
inline DVec vision_tower(const VisionConfig& c, const Params& p, const DVec& pixels,
                         const Grids& grids) {
  int64_t T = 0;
  for (const auto& g : grids) T += g[0] * g[1];
  const int64_t D = c.hidden, kk = c.merge_rows * c.merge_cols, M = T / kk, K = D * kk;
  DVec h = patch_embed(pixels, p.at("tower.patch_embed.proj.weight"),
                       p.at("tower.patch_embed.proj.bias"), T, c.channels, c.patch_size, D);
  h = pos_embed(h, p.at("tower.patch_embed.pos_emb.position_embeddings"), grids, c.pos_rows,
                c.pos_cols, D, c.pos_interp == ops::PosInterp::Bicubic);
  for (int64_t l = 0; l < c.layers; ++l)
    h = vision_block(c.block(), p, "tower.layers." + std::to_string(l) + ".", h, grids);
  h = layernorm(h, p.at("tower.final_layernorm.weight"), p.at("tower.final_layernorm.bias"), T, D,
                c.norm_eps)
          .y;
  const DVec m = patch_merge(h, grids, c.merge_rows, c.merge_cols, D);
  const DVec n =
      layernorm(m, p.at("proj.pre_norm.weight"), p.at("proj.pre_norm.bias"), T, D, c.projector_eps)
          .y;
  const DVec a = gelu(biased_linear(p, "proj.in_proj", n, M, K, K, c.projector_lora), false);
  return biased_linear(p, "proj.out_proj", a, M, K, c.text_hidden, c.projector_lora);
}

}  // namespace mt::ref
