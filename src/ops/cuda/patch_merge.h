// CUDA implementations of ops/patch_merge.h: same signatures as the public entries, which
// dispatch here when their tensors live on the GPU. Defined in src/ops/cuda/patch_merge.cu (not
// landed yet).
#pragma once

#include "ops/patch_merge.h"

namespace mt::ops::cuda {

void patch_merge_forward(Context& ctx, const PatchMergeParams& p, const Tensor& order,
                         const Tensor& x, Tensor& y);
void patch_merge_backward(Context& ctx, const PatchMergeParams& p, const Tensor& order,
                          const Tensor& dy, Tensor& dx);

}  // namespace mt::ops::cuda
