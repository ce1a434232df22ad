// Double-precision reference of the gated DSA layer: MLA projections, the lightning indexer,
// top-k selection, attention on the selected set and the indexer KL loss. Used only by tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include "model/config.h"
#include "ref/attention_ref.h"
#include "ref/indexer_ref.h"
#include "ref/mla_ref.h"

namespace mt::ref {

struct DsaRefOut {
  DVec y;
  double kl = 0;
  DVec selected;  // [T, slots] as doubles, -1 padded
  DVec cand;      // [T, kin] causal candidates, -1 padded
  DVec scores;    // [T, kin] indexer scores of the candidates (sparse mode only)
  int64_t kin = 0;
  // ref::relu_kinks of the scores the KL reads (on `selected`): margin and signs.
  double relu_margin = 0;
  DVec relu_active;
};

// Smallest gap, over rows with more candidates than top-k, between the k-th and (k+1)-th
// indexer score, relative to the row's largest |score|: how far the selection is from a tie.
inline double selection_margin(const DsaRefOut& o, int64_t topk) {
  double margin = 1e300;
  for (size_t t = 0; o.kin > 0 && t < o.cand.size() / static_cast<size_t>(o.kin); ++t) {
    std::vector<double> row;
    double scale = 1e-30;
    for (int64_t j = 0; j < o.kin; ++j) {
      const size_t e = t * static_cast<size_t>(o.kin) + static_cast<size_t>(j);
      if (o.cand[e] < 0) continue;
      row.push_back(o.scores[e]);
      scale = std::max(scale, std::abs(o.scores[e]));
    }
    if (static_cast<int64_t>(row.size()) <= topk) continue;
    std::sort(row.begin(), row.end(), std::greater<double>());
    margin = std::min(
        margin, (row[static_cast<size_t>(topk - 1)] - row[static_cast<size_t>(topk)]) / scale);
  }
  return margin;
}

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
  out.cand = cand;
  out.kin = kin;
  int64_t slots = kin;
  if (c.dense_warmup) {
    out.selected = cand;
  } else {
    slots = c.index_topk;
    out.scores = indexer_scores(qi, ki, w, cand, T, HI, DI, kin, iscale);
    out.selected = topk_select(out.scores, cand, T, kin, slots);
  }

  AttnRefOut a =
      attention(s.q, s.k, s.v, out.selected, T, H, H, Dqk, m.v_head_dim, slots, mla_scale(m));
  out.y = mla_output(m, p, x, a.o, T);

  DVec target(static_cast<size_t>(T * slots), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < slots; ++j) target[t * slots + j] += a.p[(t * H + h) * slots + j];
  ReluKinks kinks = relu_kinks(qi, ki, out.selected, T, HI, DI, slots);
  out.relu_margin = kinks.margin;
  out.relu_active = std::move(kinks.active);
  out.kl = indexer_kl(indexer_scores(qi, ki, w, out.selected, T, HI, DI, slots, iscale), target,
                      out.selected, T, slots);
  return out;
}

}  // namespace mt::ref
