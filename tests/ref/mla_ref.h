// Double-precision reference of the MLA layer (dense causal, optional output gate, optional LoRA)
// composed from plain double helpers written here from the math. Used only by tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/config.h"
#include "ref/attention_ref.h"

namespace mt::ref {

using DVec = std::vector<double>;
using ParamMap = std::map<std::string, DVec>;

namespace mla_detail {

inline const DVec& get(const ParamMap& p, const std::string& name) {
  auto it = p.find(name);
  if (it == p.end()) throw std::runtime_error("reference: missing parameter " + name);
  return it->second;
}

// y [T, out] = x W^T (+ (alpha / r) (x A^T) B^T when the map holds the adapter).
inline DVec linear(const ParamMap& p, const std::string& name, const DVec& x, int64_t T, int64_t in,
                   int64_t out, const LoraSpec& lora) {
  const DVec& w = get(p, name + ".weight");
  DVec y(static_cast<size_t>(T * out), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += x[t * in + i] * w[o * in + i];
      y[t * out + o] = s;
    }
  if (lora.rank > 0) {
    const DVec& a = get(p, name + ".lora_A.weight");
    const DVec& b = get(p, name + ".lora_B.weight");
    const int64_t r = lora.rank;
    const double sc = static_cast<double>(lora.alpha) / static_cast<double>(r);
    for (int64_t t = 0; t < T; ++t) {
      DVec xa(static_cast<size_t>(r), 0.0);
      for (int64_t j = 0; j < r; ++j)
        for (int64_t i = 0; i < in; ++i) xa[j] += x[t * in + i] * a[j * in + i];
      for (int64_t o = 0; o < out; ++o) {
        double s = 0;
        for (int64_t j = 0; j < r; ++j) s += xa[j] * b[o * r + j];
        y[t * out + o] += sc * s;
      }
    }
  }
  return y;
}

inline DVec rmsnorm(const DVec& x, const DVec& w, int64_t rows, int64_t dim, double eps) {
  DVec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t d = 0; d < dim; ++d) ms += x[r * dim + d] * x[r * dim + d];
    const double inv = 1.0 / std::sqrt(ms / static_cast<double>(dim) + eps);
    for (int64_t d = 0; d < dim; ++d) y[r * dim + d] = x[r * dim + d] * inv * w[d];
  }
  return y;
}

inline DVec layernorm(const DVec& x, const DVec& w, const DVec& b, int64_t rows, int64_t dim,
                      double eps) {
  DVec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t d = 0; d < dim; ++d) mu += x[r * dim + d];
    mu /= static_cast<double>(dim);
    for (int64_t d = 0; d < dim; ++d) var += (x[r * dim + d] - mu) * (x[r * dim + d] - mu);
    const double inv = 1.0 / std::sqrt(var / static_cast<double>(dim) + eps);
    for (int64_t d = 0; d < dim; ++d) y[r * dim + d] = (x[r * dim + d] - mu) * inv * w[d] + b[d];
  }
  return y;
}

// Rotates dims [off, off + rot) of every head of x [T, heads, hd] in place by pos[t] * freq_i,
// freq_i = theta^(-2i/rot); interleaved pairs (2i, 2i+1), half-split pairs (i, i + rot/2).
inline void rope(DVec& x, const std::vector<int64_t>& pos, int64_t T, int64_t heads, int64_t hd,
                 int64_t off, int64_t rot, double theta, bool interleaved) {
  const int64_t half = rot / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double ang =
            static_cast<double>(pos[t]) *
            std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rot));
        const int64_t ia = interleaved ? off + 2 * i : off + i;
        const int64_t ib = interleaved ? off + 2 * i + 1 : off + i + half;
        double& a = x[(t * heads + h) * hd + ia];
        double& b = x[(t * heads + h) * hd + ib];
        const double na = a * std::cos(ang) - b * std::sin(ang);
        const double nb = a * std::sin(ang) + b * std::cos(ang);
        a = na;
        b = nb;
      }
}

inline std::vector<int64_t> positions(const std::vector<int64_t>& offsets) {
  std::vector<int64_t> p;
  for (size_t d = 0; d + 1 < offsets.size(); ++d)
    for (int64_t t = offsets[d]; t < offsets[d + 1]; ++t) p.push_back(t - offsets[d]);
  return p;
}

inline int64_t max_len(const std::vector<int64_t>& offsets) {
  int64_t m = 0;
  for (size_t d = 0; d + 1 < offsets.size(); ++d) m = std::max(m, offsets[d + 1] - offsets[d]);
  return m;
}

}  // namespace mla_detail

// Everything the DSA reference reuses from one MLA forward.
struct MlaRefState {
  DVec cqn;      // q latent after its RMSNorm [T, q_lora] (empty without q_lora)
  DVec q, k, v;  // [T, H, Dqk], [T, H, Dqk], [T, H, Dv]
};

// Projections of MLA up to (and including) RoPE.
inline MlaRefState mla_project(const MlaConfig& c, const ParamMap& p, const DVec& x,
                               const std::vector<int64_t>& offsets) {
  using namespace mla_detail;
  const int64_t T = offsets.back(), d = c.hidden, H = c.heads, nope = c.qk_nope_dim,
                rope_d = c.qk_rope_dim, Dqk = nope + rope_d, Dv = c.v_head_dim,
                kvr = c.kv_lora_rank;
  const std::vector<int64_t> pos = positions(offsets);
  MlaRefState s;
  if (c.q_lora_rank > 0) {
    DVec cq = linear(p, "q_a_proj", x, T, d, c.q_lora_rank, c.lora);
    s.cqn = rmsnorm(cq, get(p, "q_a_layernorm.weight"), T, c.q_lora_rank, c.norm_eps);
    s.q = linear(p, "q_b_proj", s.cqn, T, c.q_lora_rank, H * Dqk, c.lora);
  } else {
    s.q = linear(p, "q_proj", x, T, d, H * Dqk, c.lora);
  }
  DVec ckv = linear(p, "kv_a_proj_with_mqa", x, T, d, kvr + rope_d, c.lora);
  DVec lat(static_cast<size_t>(T * kvr)), kpe(static_cast<size_t>(T * rope_d));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < kvr; ++i) lat[t * kvr + i] = ckv[t * (kvr + rope_d) + i];
    for (int64_t i = 0; i < rope_d; ++i) kpe[t * rope_d + i] = ckv[t * (kvr + rope_d) + kvr + i];
  }
  DVec kv =
      linear(p, "kv_b_proj", rmsnorm(lat, get(p, "kv_a_layernorm.weight"), T, kvr, c.norm_eps), T,
             kvr, H * (nope + Dv), c.lora);
  const bool interleaved = c.rope_style == ops::RopeStyle::Interleaved;
  if (c.use_rope && rope_d > 0) {
    rope(s.q, pos, T, H, Dqk, nope, rope_d, c.rope_theta, interleaved);
    rope(kpe, pos, T, 1, rope_d, 0, rope_d, c.rope_theta, interleaved);
  }
  s.k.assign(static_cast<size_t>(T * H * Dqk), 0.0);
  s.v.assign(static_cast<size_t>(T * H * Dv), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < nope; ++i)
        s.k[(t * H + h) * Dqk + i] = kv[(t * H + h) * (nope + Dv) + i];
      for (int64_t i = 0; i < rope_d; ++i) s.k[(t * H + h) * Dqk + nope + i] = kpe[t * rope_d + i];
      for (int64_t i = 0; i < Dv; ++i)
        s.v[(t * H + h) * Dv + i] = kv[(t * H + h) * (nope + Dv) + nope + i];
    }
  return s;
}

inline double mla_scale(const MlaConfig& c) {
  return c.softmax_scale > 0 ? static_cast<double>(c.softmax_scale)
                             : 1.0 / std::sqrt(static_cast<double>(c.qk_nope_dim + c.qk_rope_dim));
}

// Gate and output projection of an attention output o [T, H, Dv].
inline DVec mla_output(const MlaConfig& c, const ParamMap& p, const DVec& x, const DVec& o,
                       int64_t T) {
  using namespace mla_detail;
  const int64_t HV = c.heads * c.v_head_dim;
  DVec og = o;
  if (c.output_gate) {
    DVec g = linear(p, "g_proj", x, T, c.hidden, HV, c.lora);
    for (size_t i = 0; i < og.size(); ++i) og[i] *= 1.0 / (1.0 + std::exp(-g[i]));
  }
  return linear(p, "o_proj", og, T, HV, c.hidden, c.lora);
}

// The layer: x [T, hidden] -> y [T, hidden], documents given by cumulative offsets.
inline DVec mla_layer(const MlaConfig& c, const ParamMap& p, const DVec& x,
                      const std::vector<int64_t>& offsets) {
  const int64_t T = offsets.back(), H = c.heads, Dqk = c.qk_nope_dim + c.qk_rope_dim;
  MlaRefState s = mla_project(c, p, x, offsets);
  const int64_t kmax = mla_detail::max_len(offsets);
  AttnRefOut a = attention(s.q, s.k, s.v, causal_index_table(offsets, kmax), T, H, H, Dqk,
                           c.v_head_dim, kmax, mla_scale(c));
  return mla_output(c, p, x, a.o, T);
}

}  // namespace mt::ref
