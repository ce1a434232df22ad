// Double-precision reference of a linear projection with an optional LoRA adapter.
#pragma once

#include <cstdint>
#include <vector>

namespace mt::ref {

using DVec = std::vector<double>;

// x [T, in], w [out, in] -> [T, out], y[t, o] = sum_i x[t, i] w[o, i].
inline DVec matmul_nt(const DVec& x, const DVec& w, int64_t T, int64_t in, int64_t out) {
  DVec y(static_cast<size_t>(T * out), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += x[t * in + i] * w[o * in + i];
      y[t * out + o] = s;
    }
  return y;
}

// y = x W^T + (alpha / rank) * x (B A)^T; the adapter's delta weight is formed explicitly here,
// independently of the fast path that never forms it. rank 0: a and b are ignored.
inline DVec linear(const DVec& x, const DVec& w, const DVec& a, const DVec& b, int64_t T,
                   int64_t in, int64_t out, int64_t rank, double alpha) {
  if (rank == 0) return matmul_nt(x, w, T, in, out);
  DVec weff = w;
  const double s = alpha / static_cast<double>(rank);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      double d = 0;
      for (int64_t r = 0; r < rank; ++r) d += b[o * rank + r] * a[r * in + i];
      weff[o * in + i] += s * d;
    }
  return matmul_nt(x, weff, T, in, out);
}

}  // namespace mt::ref
