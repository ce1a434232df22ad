#include "ops/gemm.h"

#include <cblas.h>

namespace mt::ops {

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

void matmul(Context& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
            float alpha, float beta) {
  MT_CHECK(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2, ShapeError,
           "matmul needs 2-D tensors, got ", a.shape(), " ", b.shape(), " ", c.shape());
  int64_t m = trans_a ? a.dim(1) : a.dim(0), k = trans_a ? a.dim(0) : a.dim(1);
  int64_t kb = trans_b ? b.dim(1) : b.dim(0), n = trans_b ? b.dim(0) : b.dim(1);
  MT_CHECK(k == kb && c.dim(0) == m && c.dim(1) == n, ShapeError, "matmul shapes ", a.shape(),
           trans_a ? "^T" : "", " x ", b.shape(), trans_b ? "^T" : "", " -> ", c.shape());
  gemm(ctx, trans_a, trans_b, m, n, k, alpha, a.f32(), a.dim(1), b.f32(), b.dim(1), beta, c.f32(),
       c.dim(1));
}

}  // namespace mt::ops
