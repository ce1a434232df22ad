// Double-precision references of ops/elementwise.h and ops/expert_load.h. Tests only.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace mt::ref {

using DVec = std::vector<double>;

inline DVec add(const DVec& a, const DVec& b) {
  DVec y(a.size());
  for (size_t i = 0; i < a.size(); ++i) y[i] = a[i] + b[i];
  return y;
}

inline DVec scale(const DVec& x, double s) {
  DVec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = s * x[i];
  return y;
}

inline DVec sigmoid_vec(const DVec& x) {
  DVec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = 1.0 / (1.0 + std::exp(-x[i]));
  return y;
}

// Columns [c0, c1) of a row-major [rows, cols] matrix.
inline DVec col_slice(const DVec& x, int64_t rows, int64_t cols, int64_t c0, int64_t c1) {
  DVec y;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = c0; c < c1; ++c) y.push_back(x[static_cast<size_t>(r * cols + c)]);
  return y;
}

// y[t, h, :] = x[t, :].
inline DVec expand_heads(const DVec& x, int64_t T, int64_t H, int64_t D) {
  DVec y(static_cast<size_t>(T * H * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < D; ++i) y[static_cast<size_t>((t * H + h) * D + i)] = x[t * D + i];
  return y;
}

// load[slot_expert[s]] += off[s+1] - off[s] (identity when slot_expert is empty).
inline std::vector<int64_t> expert_load(const std::vector<int64_t>& load0,
                                        const std::vector<int32_t>& off,
                                        const std::vector<int32_t>& slot_expert) {
  std::vector<int64_t> l = load0;
  for (size_t s = 0; s + 1 < off.size(); ++s)
    l[slot_expert.empty() ? s : static_cast<size_t>(slot_expert[s])] += off[s + 1] - off[s];
  return l;
}

}  // namespace mt::ref
