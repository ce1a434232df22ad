// Double-precision reference of rotary position embedding on a slice of each head.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace mt::ref {

using DVec = std::vector<double>;

// x [tokens, heads, head_dim]; positions per token. Pair i of the rotated slice is
// (off + i, off + i + rot_dim/2) when half_split, else (off + 2i, off + 2i + 1); it turns by the
// angle pos * theta^(-2i / rot_dim).
// Same with explicit per-pair inverse frequencies and cos/sin multiplied by `magnitude`.
inline DVec rope_freqs(const DVec& x, const DVec& positions, int64_t heads, int64_t head_dim,
                       int64_t rot_offset, const DVec& inv_freq, double magnitude,
                       bool half_split) {
  DVec y = x;
  const int64_t tokens = static_cast<int64_t>(positions.size());
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = (t * heads + h) * head_dim + rot_offset;
      for (int64_t i = 0; i < half; ++i) {
        const double ang = positions[t] * inv_freq[i];
        const double c = magnitude * std::cos(ang), s = magnitude * std::sin(ang);
        const int64_t p = half_split ? base + i : base + 2 * i;
        const int64_t q = half_split ? base + i + half : base + 2 * i + 1;
        y[p] = x[p] * c - x[q] * s;
        y[q] = x[p] * s + x[q] * c;
      }
    }
  return y;
}

inline DVec rope(const DVec& x, const DVec& positions, int64_t heads, int64_t head_dim,
                 int64_t rot_offset, int64_t rot_dim, double theta, bool half_split) {
  DVec f(static_cast<size_t>(rot_dim / 2));
  for (size_t i = 0; i < f.size(); ++i)
    f[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
  return rope_freqs(x, positions, heads, head_dim, rot_offset, f, 1.0, half_split);
}

// YaRN inverse frequencies in transformers' variant: pair i makes L * f_i / (2 pi) turns over the
// pretraining context L; the pair index at which that count equals b solves
// L * theta^(-2d/dim) / (2 pi) = b. Pairs below the beta_fast index keep f_i, pairs above the
// beta_slow index use f_i / factor, a linear ramp (over the floor/ceil-truncated indices) blends.
inline DVec yarn_inv_freq(int64_t rot_dim, double theta, double factor, double beta_fast,
                          double beta_slow, double original_max, bool truncate) {
  const double pi = std::acos(-1.0), dim = static_cast<double>(rot_dim);
  auto index_of_turns = [&](double b) {
    // theta^(-2d/dim) = 2 pi b / L  ->  d = dim / 2 * log_theta(L / (2 pi b))
    return dim / 2 * std::log(original_max / (2 * pi * b)) / std::log(theta);
  };
  double lo = index_of_turns(beta_fast), hi = index_of_turns(beta_slow);
  if (truncate) lo = std::floor(lo), hi = std::ceil(hi);
  lo = lo < 0 ? 0 : lo;
  hi = hi > dim - 1 ? dim - 1 : hi;
  if (hi == lo) hi += 0.001;
  DVec f(static_cast<size_t>(rot_dim / 2));
  for (size_t i = 0; i < f.size(); ++i) {
    const double plain = std::pow(theta, -2.0 * static_cast<double>(i) / dim);
    double w = (static_cast<double>(i) - lo) / (hi - lo);  // weight of the interpolated one
    w = w < 0 ? 0 : (w > 1 ? 1 : w);
    f[i] = (1 - w) * plain + w * plain / factor;
  }
  return f;
}

}  // namespace mt::ref
