// Double-precision reference of the gated DSA layer's sparse stage for a few query rows alone,
// at any length: the lightning indexer's scores of one row over its causal keys and their top-k,
// and attention in the absorbed MQA form as the layer runs it (W_UK folded into q, the shared
// [latent ; k_pe] entries of the row's listed keys, W_UV after, the element-wise sigmoid output
// gate), with its backward for an upstream gradient that is non-zero only on the sampled rows.
// Then a row's dq depends on that row alone and the key and weight gradients are sums over the
// sampled rows, so the per-row results below are exact for them. Used only by tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/dtype.h"

namespace mt::ref {

using DVec = std::vector<double>;

// I[t, s] = scale * sum_h w[h] * max(0, q[h, :] . k[s, :]) for s = 0 .. t (one document):
// q the row [heads, dim], w its head weights [heads], k [>= t + 1, dim] row-major.
inline DVec indexer_row_scores(const DVec& q, const DVec& w, const float* k, int64_t t,
                               int64_t heads, int64_t dim, double scale) {
  DVec out(static_cast<size_t>(t + 1));
  for (int64_t s = 0; s <= t; ++s) {
    double acc = 0;
    for (int64_t h = 0; h < heads; ++h) {
      double d = 0;
      for (int64_t e = 0; e < dim; ++e) d += q[h * dim + e] * k[s * dim + e];
      acc += w[h] * std::max(0.0, d);
    }
    out[static_cast<size_t>(s)] = scale * acc;
  }
  return out;
}

// The min(topk, n) positions with the largest scores (ties to the lower position), increasing.
inline std::vector<int64_t> topk_positions(const DVec& scores, int64_t topk) {
  std::vector<int64_t> order(scores.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  const size_t k = std::min(order.size(), static_cast<size_t>(topk));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](int64_t a, int64_t b) {
                      const double sa = scores[static_cast<size_t>(a)],
                                   sb = scores[static_cast<size_t>(b)];
                      return sa > sb || (sa == sb && a < b);
                    });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

struct DsaRowDims {
  int64_t heads = 0, nope = 0, rope = 0, v_dim = 0, kv_rank = 0;
  double scale = 0;  // softmax scale on q . k
  int64_t qk() const { return nope + rope; }
  int64_t latent() const { return kv_rank + rope; }
};

struct DsaRowIn {
  DVec q;       // [H, nope + rope]
  DVec g, dog;  // gate pre-activation and the gated output's gradient, [H * Dv]
  DVec kv;      // [keys, kv_rank + rope]: the listed keys' shared entries, in list order
  int64_t keys = 0;
};

struct DsaRowOut {
  DVec qa, ol, o, og, lse;  // [H, latent], [H, kvr], [H * Dv], [H * Dv], [H]
  DVec prob;                // [keys]: probabilities summed over the heads (the KL target)
  DVec dout, dg, dol, dqa, dq;
  DVec dkv;  // [keys, latent]: this row's share of the key gradient
};

// bf16 rounding (to nearest even, as the GPU stores) where `on`, else the value itself.
inline double stored(double v, bool on) {
  return on ? static_cast<double>(bf16_to_f32(f32_to_bf16(static_cast<float>(v)))) : v;
}

// One row forward and backward. w is kv_b_proj's weight [H (nope + Dv), kv_rank] (head h's rows:
// W_UK,h then W_UV,h). `round`: round to bf16 where the GPU path stores bf16 (qa, ol, o, og,
// dout, dg, dol, dqa, dq), the emulation that sets the bf16 bound.
inline DsaRowOut dsa_row(const DsaRowDims& d, const DVec& w, const DsaRowIn& in, bool round) {
  const int64_t H = d.heads, nope = d.nope, Dq = d.qk(), Dv = d.v_dim, kvr = d.kv_rank,
                Da = d.latent(), K = in.keys, wrows = nope + Dv;
  auto W = [&](int64_t h, int64_t r, int64_t c) { return w[(h * wrows + r) * kvr + c]; };
  auto KV = [&](int64_t j, int64_t c) { return in.kv[j * Da + c]; };
  DsaRowOut o;
  o.qa.assign(static_cast<size_t>(H * Da), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t c = 0; c < kvr; ++c) {
      double acc = 0;
      for (int64_t i = 0; i < nope; ++i) acc += in.q[h * Dq + i] * W(h, i, c);
      o.qa[h * Da + c] = stored(acc, round);
    }
    for (int64_t j = 0; j < d.rope; ++j) o.qa[h * Da + kvr + j] = in.q[h * Dq + nope + j];
  }
  // Attention over the listed keys.
  DVec p(static_cast<size_t>(H * K));
  o.lse.assign(static_cast<size_t>(H), 0.0);
  o.ol.assign(static_cast<size_t>(H * kvr), 0.0);
  o.prob.assign(static_cast<size_t>(K), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    double m = -1e300;
    for (int64_t j = 0; j < K; ++j) {
      double s = 0;
      for (int64_t c = 0; c < Da; ++c) s += o.qa[h * Da + c] * KV(j, c);
      p[h * K + j] = d.scale * s;
      m = std::max(m, p[h * K + j]);
    }
    double z = 0;
    for (int64_t j = 0; j < K; ++j) z += std::exp(p[h * K + j] - m);
    o.lse[h] = m + std::log(z);
    for (int64_t j = 0; j < K; ++j) {
      p[h * K + j] = std::exp(p[h * K + j] - o.lse[h]);
      o.prob[j] += p[h * K + j];
      for (int64_t c = 0; c < kvr; ++c) o.ol[h * kvr + c] += p[h * K + j] * KV(j, c);
    }
  }
  for (double& v : o.ol) v = stored(v, round);
  o.o.assign(static_cast<size_t>(H * Dv), 0.0);
  o.og.assign(o.o.size(), 0.0);
  o.dout.assign(o.o.size(), 0.0);
  o.dg.assign(o.o.size(), 0.0);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t e = 0; e < Dv; ++e) {
      double acc = 0;
      for (int64_t c = 0; c < kvr; ++c) acc += o.ol[h * kvr + c] * W(h, nope + e, c);
      const size_t i = static_cast<size_t>(h * Dv + e);
      o.o[i] = stored(acc, round);
      const double sg = 1 / (1 + std::exp(-in.g[i]));
      o.og[i] = stored(o.o[i] * sg, round);
      // y = x sigmoid(g): dx = dy sigmoid(g) (the ungated gradient attention sees),
      // dg = dy x sigmoid(g) (1 - sigmoid(g)).
      o.dout[i] = stored(in.dog[i] * sg, round);
      o.dg[i] = stored(in.dog[i] * o.o[i] * sg * (1 - sg), round);
    }
  // Backward through W_UV and the attention.
  o.dol.assign(static_cast<size_t>(H * kvr), 0.0);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t c = 0; c < kvr; ++c) {
      double acc = 0;
      for (int64_t e = 0; e < Dv; ++e) acc += o.dout[h * Dv + e] * W(h, nope + e, c);
      o.dol[h * kvr + c] = stored(acc, round);
    }
  o.dqa.assign(static_cast<size_t>(H * Da), 0.0);
  o.dkv.assign(static_cast<size_t>(K * Da), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    double delta = 0;  // sum_j P dP = dol . ol
    for (int64_t c = 0; c < kvr; ++c) delta += o.dol[h * kvr + c] * o.ol[h * kvr + c];
    for (int64_t j = 0; j < K; ++j) {
      double dp = 0;
      for (int64_t c = 0; c < kvr; ++c) dp += o.dol[h * kvr + c] * KV(j, c);
      const double pj = p[h * K + j], ds = d.scale * pj * (dp - delta);
      for (int64_t c = 0; c < Da; ++c) {
        o.dqa[h * Da + c] += ds * KV(j, c);
        o.dkv[j * Da + c] += ds * o.qa[h * Da + c] + (c < kvr ? pj * o.dol[h * kvr + c] : 0.0);
      }
    }
  }
  for (double& v : o.dqa) v = stored(v, round);
  o.dq.assign(static_cast<size_t>(H * Dq), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < nope; ++i) {
      double acc = 0;
      for (int64_t c = 0; c < kvr; ++c) acc += o.dqa[h * Da + c] * W(h, i, c);
      o.dq[h * Dq + i] = stored(acc, round);
    }
    for (int64_t j = 0; j < d.rope; ++j) o.dq[h * Dq + nope + j] = o.dqa[h * Da + kvr + j];
  }
  return o;
}

// This row's share of kv_b_proj's gradient, added into dw [H (nope + Dv), kv_rank]:
// dW_UK,h += q_nope,h^T dqa_h (latent part), dW_UV,h += dout_h^T ol_h.
inline void dsa_row_weight_grad(const DsaRowDims& d, const DsaRowIn& in, const DsaRowOut& o,
                                DVec& dw) {
  const int64_t nope = d.nope, Dq = d.qk(), Dv = d.v_dim, kvr = d.kv_rank, Da = d.latent(),
                wrows = nope + Dv;
  for (int64_t h = 0; h < d.heads; ++h) {
    for (int64_t i = 0; i < nope; ++i)
      for (int64_t c = 0; c < kvr; ++c)
        dw[(h * wrows + i) * kvr + c] += in.q[h * Dq + i] * o.dqa[h * Da + c];
    for (int64_t e = 0; e < Dv; ++e)
      for (int64_t c = 0; c < kvr; ++c)
        dw[(h * wrows + nope + e) * kvr + c] += o.dout[h * Dv + e] * o.ol[h * kvr + c];
  }
}

}  // namespace mt::ref
