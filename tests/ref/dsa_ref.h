// Double-precision reference of the gated DSA layer: MLA projections, the lightning indexer,
// top-k selection, attention on the selected set and the indexer KL loss. Used only by tests.
#pragma once

#include <cmath>

#include "model/config.h"
#include "ref/attention_ref.h"
#include "ref/indexer_ref.h"
#include "ref/mla_ref.h"

namespace mt::ref {

struct DsaRefOut {
  DVec y;
  double kl = 0;
  DVec selected;  // [T, slots] as doubles, -1 padded
};

inline DsaRefOut dsa_layer(const DsaConfig& c, const ParamMap& p, const DVec& x,
                           const std::vector<int64_t>& offsets) {
  using namespace mla_detail;
  const MlaConfig& m = c.mla;
  const int64_t T = offsets.back(), H = m.heads, Dqk = m.qk_nope_dim + m.qk_rope_dim,
                HI = c.index_heads, DI = c.index_head_dim, R = c.index_rope_dim;
  MlaRefState s = mla_project(m, p, x, offsets);

  // Indexer.
  const std::vector<int64_t> pos = positions(offsets);
  DVec qi = linear(p, "indexer.wq_b", s.cqn, T, m.q_lora_rank, HI * DI, m.lora);
  DVec ki = layernorm(linear(p, "indexer.wk", x, T, m.hidden, DI, m.lora),
                      get(p, "indexer.k_norm.weight"), get(p, "indexer.k_norm.bias"), T, DI,
                      c.indexer_norm_eps);
  if (R > 0) {
    rope(qi, pos, T, HI, DI, 0, R, m.rope_theta, false);
    rope(ki, pos, T, 1, DI, 0, R, m.rope_theta, false);
  }
  DVec w = linear(p, "indexer.weights_proj", x, T, m.hidden, HI, m.lora);
  for (double& v : w) v /= std::sqrt(static_cast<double>(HI));
  const double iscale = 1.0 / std::sqrt(static_cast<double>(DI));

  const int64_t kin = max_len(offsets);
  DVec cand = causal_index_table(offsets, kin);
  DsaRefOut out;
  int64_t slots = kin;
  if (c.dense_warmup) {
    out.selected = cand;
  } else {
    slots = c.index_topk;
    out.selected =
        topk_select(indexer_scores(qi, ki, w, cand, T, HI, DI, kin, iscale), cand, T, kin, slots);
  }

  AttnRefOut a =
      attention(s.q, s.k, s.v, out.selected, T, H, H, Dqk, m.v_head_dim, slots, mla_scale(m));
  out.y = mla_output(m, p, x, a.o, T);

  DVec target(static_cast<size_t>(T * slots), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < slots; ++j) target[t * slots + j] += a.p[(t * H + h) * slots + j];
  out.kl = indexer_kl(indexer_scores(qi, ki, w, out.selected, T, HI, DI, slots, iscale), target,
                      out.selected, T, slots);
  return out;
}

}  // namespace mt::ref
