// Double-precision reference of the KDA layer: plain loops, composed from the KDA references and
// small helpers of its own (no mt::ops). Parameters are keyed by the layer's local names.
#pragma once

#include <map>
#include <string>

#include "core/seq_info.h"
#include "model/config.h"
#include "ref/activation_ref.h"
#include "ref/kda_ref.h"

namespace mt::ref {

// Small helpers of this layer's own (an independent reading of the dense ops' conventions).
namespace kda_detail {

// y [T, out] = x [T, in] (W + (alpha / r) B A)^T; a, b empty when r == 0.
inline DVec linear(const DVec& x, const DVec& w, const DVec& a, const DVec& b, int64_t T,
                   int64_t in, int64_t out, int64_t r, double alpha) {
  DVec y(static_cast<size_t>(T * out), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    DVec xa(static_cast<size_t>(r), 0.0);
    for (int64_t j = 0; j < r; ++j)
      for (int64_t i = 0; i < in; ++i) xa[j] += a[j * in + i] * x[t * in + i];
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += w[o * in + i] * x[t * in + i];
      for (int64_t j = 0; j < r; ++j) s += alpha / static_cast<double>(r) * b[o * r + j] * xa[j];
      y[t * out + o] = s;
    }
  }
  return y;
}

// Depthwise causal conv per document, w [C, 1, kw] with w[c, kw - 1] on the current token.
inline DVec short_conv(const DVec& x, const DVec& w, const std::vector<int64_t>& offsets, int64_t C,
                       int64_t kw) {
  DVec y(x.size(), 0.0);
  for (size_t n = 0; n + 1 < offsets.size(); ++n)
    for (int64_t t = offsets[n]; t < offsets[n + 1]; ++t)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t j = 0; j < kw; ++j) {
          const int64_t src = t - (kw - 1) + j;
          if (src >= offsets[n]) y[t * C + c] += w[c * kw + j] * x[src * C + c];
        }
  return y;
}

// Rows of `dim`: x / sqrt(sum x^2 + eps) (l2 = true) or x / sqrt(mean x^2 + eps) * w.
inline DVec row_norm(const DVec& x, const DVec& w, int64_t dim, double eps, bool l2) {
  DVec y(x.size());
  for (size_t r = 0; r < x.size() / static_cast<size_t>(dim); ++r) {
    double ss = 0;
    for (int64_t d = 0; d < dim; ++d) ss += x[r * dim + d] * x[r * dim + d];
    const double inv = 1.0 / std::sqrt((l2 ? ss : ss / static_cast<double>(dim)) + eps);
    for (int64_t d = 0; d < dim; ++d) y[r * dim + d] = x[r * dim + d] * inv * (l2 ? 1.0 : w[d]);
  }
  return y;
}

}  // namespace kda_detail

inline DVec kda_layer(const KdaConfig& cfg, const std::map<std::string, DVec>& p, const DVec& x,
                      const SeqInfo& seq) {
  const int64_t T = seq.tokens, d = cfg.hidden, H = cfg.heads, K = cfg.head_dim, HK = H * K;
  const int64_t r = cfg.lora.rank;
  auto lin = [&](const std::string& name, const DVec& in, int64_t n_in, int64_t n_out) {
    const DVec none;
    return kda_detail::linear(in, p.at(name + ".weight"), r ? p.at(name + ".lora_A.weight") : none,
                              r ? p.at(name + ".lora_B.weight") : none, T, n_in, n_out, r,
                              cfg.lora.alpha);
  };
  auto conv_silu = [&](const std::string& name, const DVec& in) {
    return silu(kda_detail::short_conv(in, p.at(name + "_conv1d.weight"), seq.offsets, HK,
                                       cfg.conv_kernel));
  };
  const DVec q = kda_detail::row_norm(conv_silu("q", lin("q_proj", x, d, HK)), {}, K, 1e-6, true);
  const DVec k = kda_detail::row_norm(conv_silu("k", lin("k_proj", x, d, HK)), {}, K, 1e-6, true);
  const DVec v = conv_silu("v", lin("v_proj", x, d, HK));
  const DVec g = kda_gate(lin("f_b_proj", lin("f_a_proj", x, d, K), K, HK), p.at("A_log"),
                          p.at("dt_bias"), H, K);
  DVec beta = lin("b_proj", x, d, H);
  for (double& b : beta) b = sigmoid(b);
  const KdaDims dims{.heads = H, .head_k = K, .head_v = K, .offsets = seq.offsets};
  const DVec o = kda(dims, q, k, v, g, beta, {}).first;
  const DVec on = kda_detail::row_norm(o, p.at("o_norm.weight"), K, cfg.norm_eps, false);
  const DVec gate = lin("g_b_proj", lin("g_a_proj", x, d, K), K, HK);
  return lin("o_proj", sigmoid_gate(on, gate), HK, d);
}

}  // namespace mt::ref
