// The CUDA path of ops/grouped_matmul.h (src/ops/cuda/grouped_matmul.cu). A plain C++ header: the
// entries include it in every build and call it only in a MOETRAIN_WITH_CUDA one.
#pragma once

#include "ops/grouped_matmul.h"

namespace mt::ops::cuda {

void grouped_matmul(Context& ctx, const GroupedMatmulParams& p, const Tensor& a,
                    const Tensor& offsets, const Tensor& b, Tensor& c);

}  // namespace mt::ops::cuda
