// CUDA path of ops/grouped_matmul.h; declarations only.
#pragma once

#include "ops/grouped_matmul.h"

namespace mt::ops::cuda {

void grouped_matmul(Context& ctx, const GroupedMatmulParams& p, const Tensor& a,
                    const Tensor& offsets, const Tensor& b, Tensor& c);

}  // namespace mt::ops::cuda
