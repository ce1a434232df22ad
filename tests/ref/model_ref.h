// Double-precision reference of the whole hybrid model, composed from the layer references.
// Returns the cross-entropy, the weighted router auxiliary losses and the indexer KL separately,
// because the engine applies the KL gradient to the indexer parameters only (its input is
// detached), so each parameter's gradient is checked against the loss that reaches it.
#pragma once

#include <algorithm>
#include <map>
#include <string>

#include "core/seq_info.h"
#include "model/model_config.h"
#include "ref/cross_entropy_ref.h"
#include "ref/dense_ffn_ref.h"
#include "ref/dsa_ref.h"
#include "ref/embedding_ref.h"
#include "ref/kda_layer_ref.h"
#include "ref/mla_ref.h"
#include "ref/moe_ref.h"
#include "ref/norm_ref.h"

namespace mt::ref {

struct ModelRefOut {
  double ce = 0;          // mean next-token cross-entropy
  double router_aux = 0;  // sum over MoE layers of seq_aux_coeff * seq_aux + z_coeff * z
  double indexer_kl = 0;  // sum over DSA layers of the (unweighted) KL
  // Every discrete decision (top-k positions, expert ids): the loss is piecewise smooth, and a
  // finite difference is only meaningful between two points where these agree.
  std::vector<double> decisions;
  // Where a DSA layer's KL reads the indexer scores (indexer_loss_coeff != 0), their ReLUs are
  // decisions too: each q . k's sign is in `decisions`, and relu_margin is the smallest |q . k| /
  // |q||k| over the layers (the fp32 engine may see a sign otherwise within ~1e-7 of a kink).
  double relu_margin = 1e300;
};

inline ModelRefOut model_forward(const ModelConfig& cfg, const std::map<std::string, DVec>& P,
                                 const DVec& ids, const DVec& targets, const SeqInfo& seq) {
  const int64_t T = seq.tokens, d = cfg.hidden;
  auto local = [&](const std::string& prefix) {
    std::map<std::string, DVec> m;
    for (const auto& [k, v] : P)
      if (k.rfind(prefix, 0) == 0) m[k.substr(prefix.size())] = v;
    return m;
  };
  auto add = [](const DVec& a, const DVec& b) {
    DVec c(a.size());
    for (size_t i = 0; i < a.size(); ++i) c[i] = a[i] + b[i];
    return c;
  };
  ModelRefOut out;
  DVec x = embedding(ids, P.at("model.embed_tokens.weight"), d);
  for (size_t l = 0; l < cfg.layers.size(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    DVec a = rmsnorm(x, P.at(p + "input_layernorm.weight"), T, d, cfg.norm_eps).y;
    DVec m;
    auto attn = local(p + "self_attn.");
    switch (cfg.layers[l].mixer) {
      case MixerKind::Kda:
        m = kda_layer(cfg.kda, attn, a, seq);
        break;
      case MixerKind::Mla:
        m = mla_layer(cfg.mla, attn, a, seq.offsets);
        break;
      case MixerKind::Dsa: {
        DsaRefOut o = dsa_layer(cfg.dsa, attn, a, seq.offsets);
        out.indexer_kl += o.kl;
        if (cfg.dsa.indexer_loss_coeff != 0.f) {
          out.relu_margin = std::min(out.relu_margin, o.relu_margin);
          out.decisions.insert(out.decisions.end(), o.relu_active.begin(), o.relu_active.end());
        }
        out.decisions.insert(out.decisions.end(), o.selected.begin(), o.selected.end());
        m = o.y;
        break;
      }
    }
    DVec mid = add(x, m);
    DVec b = rmsnorm(mid, P.at(p + "post_attention_layernorm.weight"), T, d, cfg.norm_eps).y;
    DVec f;
    auto mlp = local(p + "mlp.");
    if (cfg.layers[l].ffn == FfnKind::Dense) {
      f = dense_ffn(cfg.dense, mlp, b, seq);
    } else {
      MoeRefOut o = moe_layer(cfg.moe, mlp, b, seq.offsets);
      out.router_aux += cfg.moe.seq_aux_coeff * o.seq_aux + cfg.moe.z_loss_coeff * o.z;
      out.decisions.insert(out.decisions.end(), o.ids.begin(), o.ids.end());
      f = o.y;
    }
    x = add(mid, f);
  }
  DVec h = rmsnorm(x, P.at("model.norm.weight"), T, d, cfg.norm_eps).y;
  const DVec& head =
      cfg.tie_embeddings ? P.at("model.embed_tokens.weight") : P.at("lm_head.weight");
  out.ce = lm_head_cross_entropy(h, head, targets, d, cfg.vocab, -100).loss;
  return out;
}

}  // namespace mt::ref
