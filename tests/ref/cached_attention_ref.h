// Double-precision references of decoding over a cache (ops/cached_attention.h): softmax attention
// of n queries over cached keys, and the lightning indexer's top-k over cached positions. Written
// from the definitions, never calling mt::ops. Used only by tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "ref/activation_ref.h"

namespace mt::ref {

// q [n, H, Dqk], k [>= cached, H, Dqk], v [>= cached, H, Dv], positions [n]; indices [n, kmax]
// (empty: row i's keys are 0 .. positions[i]). Returns o [n, H, Dv].
inline DVec cached_attention(const DVec& q, const DVec& k, const DVec& v,
                             const std::vector<int32_t>& positions,
                             const std::vector<int32_t>& indices, int64_t kmax, int64_t H,
                             int64_t Dqk, int64_t Dv, int64_t cached, double scale) {
  const int64_t n = static_cast<int64_t>(positions.size());
  DVec o(static_cast<size_t>(n * H * Dv), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<int64_t> keys;
      if (indices.empty())
        for (int64_t s = 0; s <= positions[static_cast<size_t>(i)]; ++s) keys.push_back(s);
      else
        for (int64_t j = 0; j < kmax; ++j) {
          const int64_t s = indices[static_cast<size_t>(i * kmax + j)];
          if (s >= 0 && s < cached) keys.push_back(s);
        }
      if (keys.empty()) continue;
      DVec logit;
      for (int64_t s : keys) {
        double dot = 0;
        for (int64_t e = 0; e < Dqk; ++e)
          dot += q[static_cast<size_t>((i * H + h) * Dqk + e)] *
                 k[static_cast<size_t>((s * H + h) * Dqk + e)];
        logit.push_back(scale * dot);
      }
      const double m = *std::max_element(logit.begin(), logit.end());
      double z = 0;
      for (double& l : logit) z += l = std::exp(l - m);
      for (size_t j = 0; j < keys.size(); ++j)
        for (int64_t e = 0; e < Dv; ++e)
          o[static_cast<size_t>((i * H + h) * Dv + e)] +=
              logit[j] / z * v[static_cast<size_t>((keys[j] * H + h) * Dv + e)];
    }
  return o;
}

// The indexer score of query row i at cached position s: scale * sum_h w[i,h] ReLU(q[i,h].k[s]).
inline double cached_indexer_score(const DVec& q, const DVec& k, const DVec& w, int64_t i,
                                   int64_t s, int64_t HI, int64_t DI, double scale) {
  double acc = 0;
  for (int64_t h = 0; h < HI; ++h) {
    double dot = 0;
    for (int64_t e = 0; e < DI; ++e)
      dot += q[static_cast<size_t>((i * HI + h) * DI + e)] * k[static_cast<size_t>(s * DI + e)];
    acc += w[static_cast<size_t>(i * HI + h)] * std::max(0.0, dot);
  }
  return scale * acc;
}

// Row i: the min(topk, positions[i] + 1) positions s <= positions[i] of largest score (ties to the
// lower position), increasing, then -1. Returns [n, topk]; `margin` (when given) receives the
// smallest gap between the last selected and the first rejected score over the rows, the
// distance at which fp32 could pick otherwise.
inline std::vector<int32_t> cached_indexer_topk(const DVec& q, const DVec& k, const DVec& w,
                                                const std::vector<int32_t>& positions, int64_t HI,
                                                int64_t DI, int64_t topk, double scale,
                                                double* margin = nullptr) {
  const int64_t n = static_cast<int64_t>(positions.size());
  std::vector<int32_t> out(static_cast<size_t>(n * topk), -1);
  double gap = INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<std::pair<double, int32_t>> c;
    for (int32_t s = 0; s <= positions[static_cast<size_t>(i)]; ++s)
      c.emplace_back(cached_indexer_score(q, k, w, i, s, HI, DI, scale), s);
    std::stable_sort(c.begin(), c.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    const size_t keep = std::min(c.size(), static_cast<size_t>(topk));
    if (keep < c.size()) gap = std::min(gap, c[keep - 1].first - c[keep].first);
    std::vector<int32_t> row;
    for (size_t j = 0; j < keep; ++j) row.push_back(c[j].second);
    std::sort(row.begin(), row.end());
    std::copy(row.begin(), row.end(), out.begin() + i * topk);
  }
  if (margin) *margin = gap;
  return out;
}

}  // namespace mt::ref
