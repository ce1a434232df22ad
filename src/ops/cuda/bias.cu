// The bias add on the GPU: the forward is element-wise; the gradient is a column sum over the
// rows (colsum.cuh: fixed order, no atomics, so it is bit-repeatable).
#include "ops/bias.h"
#include "ops/cuda/colsum.cuh"

namespace mt::ops::cuda {

void bias_add_forward(Context& ctx, const Tensor& b, Tensor& y) {
  expect_same_dtype("bias_add", y, b, "b");
  const int64_t n = y.dim(1);
  MT_DISPATCH_FLOAT(y, "bias_add", {
    const T* pb = ptr<T>(b);
    T* py = ptr<T>(y);
    for_each_index(ctx, y.numel(),
                   [=] __device__(int64_t i) { st(py, i, ld(py, i) + ld(pb, i % n)); });
  });
}

void bias_add_backward(Context& ctx, const Tensor& dy, Tensor& db) {
  expect_f32("bias_add", db, "db");
  const int64_t rows = dy.dim(0), n = dy.dim(1);
  MT_DISPATCH_FLOAT(dy, "bias_add", {
    const T* pdy = ptr<T>(dy);
    colsum_accumulate(ctx, rows, n, ptr<float>(db),
                      [=] __device__(int64_t r, int64_t c) { return ld(pdy, r * n + c); });
  });
}

}  // namespace mt::ops::cuda
