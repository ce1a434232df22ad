// The CPU path of ops/grouped_matmul.h: one BLAS call per non-empty group. Called by the entries
// after they validated, so it does not re-check.
#pragma once

#include "ops/grouped_matmul.h"

namespace mt::ops::cpu {

void grouped_matmul(Context& ctx, const GroupedMatmulParams& p, const Tensor& a,
                    const Tensor& offsets, const Tensor& b, Tensor& c);

}  // namespace mt::ops::cpu
