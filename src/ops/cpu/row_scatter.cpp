#include "ops/row_scatter.h"

#include <algorithm>

namespace mt::ops::cpu {

void row_scatter_forward(Context& ctx, const RowScatterParams& p, const Tensor& index,
                         const Tensor& src, Tensor& dst) {
  const int64_t D = p.dim;
  const int32_t* ix = index.i32();
  const float* ps = src.f32();
  float* pd = dst.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t k = 0; k < p.rows; ++k)
    std::copy(ps + k * D, ps + (k + 1) * D, pd + static_cast<int64_t>(ix[k]) * D);
}

void row_scatter_backward(Context& ctx, const RowScatterParams& p, const Tensor& index,
                          Tensor& ddst, Tensor& dsrc) {
  const int64_t D = p.dim;
  const int32_t* ix = index.i32();
  float* pd = ddst.f32();
  float* ps = dsrc.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t k = 0; k < p.rows; ++k) {
    float* row = pd + static_cast<int64_t>(ix[k]) * D;
    std::copy(row, row + D, ps + k * D);
    std::fill(row, row + D, 0.f);
  }
}

}  // namespace mt::ops::cpu
