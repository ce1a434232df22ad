// Double-precision reference of the grouped matmul forms (ops/grouped_matmul.h). Tests only.
#pragma once

#include <cstdint>
#include <vector>

namespace mt::ref {

using DVec = std::vector<double>;

// Y[i, o] = sum_k X[i, k] W[g(i), o, k] for the rows i of group g = [off[g], off[g+1]).
inline DVec grouped_xwt(const DVec& x, const DVec& off, const DVec& w, int64_t groups, int64_t out,
                        int64_t in) {
  const auto rows = static_cast<int64_t>(off[static_cast<size_t>(groups)]);
  DVec y(static_cast<size_t>(rows * out), 0.0);
  for (int64_t g = 0; g < groups; ++g)
    for (auto i = static_cast<int64_t>(off[g]); i < static_cast<int64_t>(off[g + 1]); ++i)
      for (int64_t o = 0; o < out; ++o) {
        double s = 0;
        for (int64_t k = 0; k < in; ++k) s += x[i * in + k] * w[(g * out + o) * in + k];
        y[i * out + o] = s;
      }
  return y;
}

// dX[i, k] = sum_o dY[i, o] W[g(i), o, k].
inline DVec grouped_dyw(const DVec& dy, const DVec& off, const DVec& w, int64_t groups, int64_t out,
                        int64_t in) {
  const auto rows = static_cast<int64_t>(off[static_cast<size_t>(groups)]);
  DVec dx(static_cast<size_t>(rows * in), 0.0);
  for (int64_t g = 0; g < groups; ++g)
    for (auto i = static_cast<int64_t>(off[g]); i < static_cast<int64_t>(off[g + 1]); ++i)
      for (int64_t k = 0; k < in; ++k) {
        double s = 0;
        for (int64_t o = 0; o < out; ++o) s += dy[i * out + o] * w[(g * out + o) * in + k];
        dx[i * in + k] = s;
      }
  return dx;
}

// dW[g, o, k] = sum_{i in g} dY[i, o] X[i, k].
inline DVec grouped_dytx(const DVec& dy, const DVec& off, const DVec& x, int64_t groups,
                         int64_t out, int64_t in) {
  DVec dw(static_cast<size_t>(groups * out * in), 0.0);
  for (int64_t g = 0; g < groups; ++g)
    for (auto i = static_cast<int64_t>(off[g]); i < static_cast<int64_t>(off[g + 1]); ++i)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t k = 0; k < in; ++k)
          dw[(g * out + o) * in + k] += dy[i * out + o] * x[i * in + k];
  return dw;
}

}  // namespace mt::ref
