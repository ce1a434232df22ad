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
inline DVec rope(const DVec& x, const DVec& positions, int64_t heads, int64_t head_dim,
                 int64_t rot_offset, int64_t rot_dim, double theta, bool half_split) {
  DVec y = x;
  const int64_t tokens = static_cast<int64_t>(positions.size()), half = rot_dim / 2;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = (t * heads + h) * head_dim + rot_offset;
      for (int64_t i = 0; i < half; ++i) {
        const double ang = positions[t] * std::pow(theta, -2.0 * static_cast<double>(i) /
                                                              static_cast<double>(rot_dim));
        const int64_t p = half_split ? base + i : base + 2 * i;
        const int64_t q = half_split ? base + i + half : base + 2 * i + 1;
        y[p] = x[p] * std::cos(ang) - x[q] * std::sin(ang);
        y[q] = x[p] * std::sin(ang) + x[q] * std::cos(ang);
      }
    }
  return y;
}

}  // namespace mt::ref
