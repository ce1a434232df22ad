#include "ops/patch_merge.h"

#include <algorithm>

namespace mt::ops::cpu {

void patch_merge_forward(Context& ctx, const PatchMergeParams& p, const Tensor& order,
                         const Tensor& x, Tensor& y) {
  const int64_t D = p.dim;
  const int32_t* o = order.i32();
  const float* px = x.f32();
  float* py = y.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t s = 0; s < p.patches; ++s) {
    const float* src = px + static_cast<int64_t>(o[s]) * D;
    std::copy(src, src + D, py + s * D);
  }
}

}  // namespace mt::ops::cpu
