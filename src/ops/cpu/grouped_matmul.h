#pragma once

#include "ops/grouped_matmul.h"

namespace mt::ops::cpu {

// ops::grouped_matmul's CPU body: one BLAS call per non-empty group; shapes already checked.
void grouped_matmul(Context& ctx, const GroupedMatmulParams& p, const Tensor& a,
                    const Tensor& offsets, const Tensor& b, Tensor& c);

}  // namespace mt::ops::cpu
