// Double-precision reference of the MoE router (scores, group-limited top-k, gate weights) and of
// its balance losses. Written from the math in ops/router.h; used only by tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace mt::ref {

using DVec = std::vector<double>;

struct RouterRefParams {
  int64_t tokens = 0, experts = 0, top_k = 0;
  bool sigmoid = true;
  int64_t n_group = 1, topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling = 1.0;
};

struct RouterRefOut {
  DVec scores;           // [T,E]
  std::vector<int> ids;  // [T,k]
  DVec weights;          // [T,k]
};

inline RouterRefOut router(const RouterRefParams& p, const DVec& logits, const DVec& bias) {
  const int64_t T = p.tokens, E = p.experts, K = p.top_k, G = p.n_group, gs = E / G;
  RouterRefOut o;
  o.scores.assign(static_cast<size_t>(T * E), 0.0);
  o.ids.assign(static_cast<size_t>(T * K), 0);
  o.weights.assign(static_cast<size_t>(T * K), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    double* s = &o.scores[t * E];
    const double* l = &logits[t * E];
    if (p.sigmoid) {
      for (int64_t i = 0; i < E; ++i) s[i] = 1.0 / (1.0 + std::exp(-l[i]));
    } else {
      const double mx = *std::max_element(l, l + E);
      double z = 0;
      for (int64_t i = 0; i < E; ++i) z += std::exp(l[i] - mx);
      for (int64_t i = 0; i < E; ++i) s[i] = std::exp(l[i] - mx) / z;
    }
    DVec sel(static_cast<size_t>(E));
    for (int64_t i = 0; i < E; ++i) sel[i] = s[i] + (bias.empty() ? 0.0 : bias[i]);
    auto better = [](double va, int64_t a, double vb, int64_t b) {
      return va > vb || (va == vb && a < b);
    };
    // Which experts survive the group limit.
    std::vector<bool> allowed(static_cast<size_t>(E), true);
    if (G > 1) {
      DVec gscore(static_cast<size_t>(G));
      for (int64_t g = 0; g < G; ++g) {
        DVec v(sel.begin() + g * gs, sel.begin() + (g + 1) * gs);
        std::sort(v.begin(), v.end(), std::greater<double>());
        gscore[g] = (p.sigmoid && gs >= 2) ? v[0] + v[1] : v[0];
      }
      std::vector<bool> kept(static_cast<size_t>(G), false);
      for (int64_t r = 0; r < p.topk_group; ++r) {
        int64_t best = -1;
        for (int64_t g = 0; g < G; ++g)
          if (!kept[g] && (best < 0 || better(gscore[g], g, gscore[best], best))) best = g;
        kept[best] = true;
      }
      for (int64_t i = 0; i < E; ++i) allowed[i] = kept[i / gs];
    }
    // k rounds of "best remaining allowed expert".
    std::vector<bool> taken(static_cast<size_t>(E), false);
    double denom = 0;
    for (int64_t j = 0; j < K; ++j) {
      int64_t best = -1;
      for (int64_t i = 0; i < E; ++i)
        if (allowed[i] && !taken[i] && (best < 0 || better(sel[i], i, sel[best], best))) best = i;
      taken[best] = true;
      o.ids[t * K + j] = static_cast<int>(best);
      denom += s[best];
    }
    for (int64_t j = 0; j < K; ++j) {
      const double v = s[o.ids[t * K + j]];
      o.weights[t * K + j] = p.routed_scaling * (p.norm_topk_prob ? v / (denom + 1e-20) : v);
    }
  }
  return o;
}

// Sequence-level balance loss (unweighted), averaged over the documents given by `offsets`.
inline double router_seq_aux(const RouterRefParams& p, const DVec& scores,
                             const std::vector<int>& ids, const std::vector<int64_t>& offsets) {
  const int64_t E = p.experts, K = p.top_k;
  const int64_t D = static_cast<int64_t>(offsets.size()) - 1;
  double total = 0;
  for (int64_t d = 0; d < D; ++d) {
    const int64_t b = offsets[d], e = offsets[d + 1], n = e - b;
    DVec f(static_cast<size_t>(E), 0.0), P(static_cast<size_t>(E), 0.0);
    for (int64_t t = b; t < e; ++t) {
      for (int64_t j = 0; j < K; ++j) f[ids[t * K + j]] += static_cast<double>(E) / double(K * n);
      double sum = 0;
      for (int64_t i = 0; i < E; ++i) sum += scores[t * E + i];
      for (int64_t i = 0; i < E; ++i) P[i] += scores[t * E + i] / sum / double(n);
    }
    for (int64_t i = 0; i < E; ++i) total += f[i] * P[i];
  }
  return total / double(D);
}

// Router z-loss (unweighted): mean over tokens of logsumexp(logits)^2.
inline double router_z(const RouterRefParams& p, const DVec& logits) {
  const int64_t T = p.tokens, E = p.experts;
  double total = 0;
  for (int64_t t = 0; t < T; ++t) {
    const double* l = &logits[t * E];
    const double mx = *std::max_element(l, l + E);
    double z = 0;
    for (int64_t i = 0; i < E; ++i) z += std::exp(l[i] - mx);
    const double lse = mx + std::log(z);
    total += lse * lse;
  }
  return total / double(T);
}

}  // namespace mt::ref
