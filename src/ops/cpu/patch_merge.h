// The CPU path of ops/patch_merge.h. Called by the entries after they validated, so it does not
// re-check.
#pragma once

#include "ops/patch_merge.h"

namespace mt::ops::cpu {

void patch_merge_forward(Context& ctx, const PatchMergeParams& p, const Tensor& order,
                         const Tensor& x, Tensor& y);
void patch_merge_backward(Context& ctx, const PatchMergeParams& p, const Tensor& order,
                          const Tensor& dy, Tensor& dx);

}  // namespace mt::ops::cpu
