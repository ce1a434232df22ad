// Double-precision references of Kimi Delta Attention: the decay gate and the naive token-by-token
// delta-rule recurrence (the definition the chunked algorithm must reproduce). Used only by tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "ref/activation_ref.h"

namespace mt::ref {

// g[t, h*K + c] = -exp(a_log[h]) * softplus(raw[t, h*K + c] + dt_bias[h*K + c]).
inline DVec kda_gate(const DVec& raw, const DVec& a_log, const DVec& dt_bias, int64_t heads,
                     int64_t head_dim) {
  const size_t n = static_cast<size_t>(heads * head_dim);
  DVec g(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    const size_t c = i % n;
    g[i] = -std::exp(a_log[c / static_cast<size_t>(head_dim)]) * softplus(raw[i] + dt_bias[c]);
  }
  return g;
}

struct KdaDims {
  int64_t heads = 0, head_k = 0, head_v = 0;
  double scale = 0;              // 0: head_k^-0.5
  std::vector<int64_t> offsets;  // cu_seqlens: documents [offsets[n], offsets[n+1])
};

// q, k, g [T, H, K]; v [T, H, V]; beta [T, H]; h0 [N, H, K, V] or empty (zeros).
// Returns {o [T, H, V], hT [N, H, K, V]}.
inline std::pair<DVec, DVec> kda(const KdaDims& d, const DVec& q, const DVec& k, const DVec& v,
                                 const DVec& g, const DVec& beta, const DVec& h0) {
  const size_t H = static_cast<size_t>(d.heads), K = static_cast<size_t>(d.head_k),
               V = static_cast<size_t>(d.head_v);
  const size_t N = d.offsets.size() - 1, T = static_cast<size_t>(d.offsets.back());
  const double scale = d.scale != 0 ? d.scale : 1.0 / std::sqrt(static_cast<double>(K));
  DVec o(T * H * V, 0.0), hT(N * H * K * V, 0.0);
  DVec S(K * V), u(V);
  for (size_t n = 0; n < N; ++n) {
    for (size_t h = 0; h < H; ++h) {
      const size_t s0 = ((n * H) + h) * K * V;
      for (size_t e = 0; e < K * V; ++e) S[e] = h0.empty() ? 0.0 : h0[s0 + e];
      for (size_t t = static_cast<size_t>(d.offsets[n]); t < static_cast<size_t>(d.offsets[n + 1]);
           ++t) {
        const size_t r = t * H + h;
        for (size_t i = 0; i < K; ++i)
          for (size_t j = 0; j < V; ++j) S[i * V + j] *= std::exp(g[r * K + i]);
        for (size_t j = 0; j < V; ++j) {
          double ks = 0;
          for (size_t i = 0; i < K; ++i) ks += S[i * V + j] * k[r * K + i];
          u[j] = v[r * V + j] - ks;
        }
        for (size_t i = 0; i < K; ++i)
          for (size_t j = 0; j < V; ++j) S[i * V + j] += beta[r] * k[r * K + i] * u[j];
        for (size_t j = 0; j < V; ++j) {
          double acc = 0;
          for (size_t i = 0; i < K; ++i) acc += S[i * V + j] * scale * q[r * K + i];
          o[r * V + j] = acc;
        }
      }
      for (size_t e = 0; e < K * V; ++e) hT[s0 + e] = S[e];
    }
  }
  return {o, hT};
}

}  // namespace mt::ref
