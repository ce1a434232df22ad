#include "ops/bias.h"

namespace mt::ops::cpu {

void bias_add_forward(Context& ctx, const Tensor& b, Tensor& y) {
  const int64_t rows = y.dim(0), n = y.dim(1);
  const float* pb = b.f32();
  float* py = y.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) py[r * n + j] += pb[j];
}

void bias_add_backward(Context& ctx, const Tensor& dy, Tensor& db) {
  const int64_t rows = dy.dim(0), n = dy.dim(1);
  const float* pdy = dy.f32();
  float* pdb = db.f32();
  // Columns split across threads, so each sum has one writer and a fixed row order.
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t j = 0; j < n; ++j) {
    double s = 0;
    for (int64_t r = 0; r < rows; ++r) s += pdy[r * n + j];
    pdb[j] += static_cast<float>(s);
  }
}

}  // namespace mt::ops::cpu
