#include "ops/cpu/gemm.h"

#include <algorithm>

#include <cblas.h>

#include "ops/gemm.h"

namespace mt::ops::cpu {

void gemm(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc) {
  MT_CHECK(ctx.device() == Device::CPU, ValueError, "gemm: CPU path called on ",
           device_name(ctx.device()));
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS may skip the beta scaling when k == 0; do it ourselves
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

namespace {

// A one-row matrix may carry any row stride (a rows() view keeps its parent's); BLAS wants at
// least the row length.
int64_t leading_dim(const Tensor& t) {
  return std::max({t.dim(0) > 1 ? t.stride(0) : t.dim(1), t.dim(1), int64_t{1}});
}

}  // namespace

void matmul(Context& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
            float alpha, float beta) {
  const int64_t m = c.dim(0), n = c.dim(1), k = trans_a ? a.dim(0) : a.dim(1);
  gemm(ctx, trans_a, trans_b, m, n, k, alpha, a.f32_strided(), leading_dim(a), b.f32_strided(),
       leading_dim(b), beta, c.f32_strided(), leading_dim(c));
}

}  // namespace mt::ops::cpu
