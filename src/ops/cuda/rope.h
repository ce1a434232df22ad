// CUDA implementations of ops/rope.h: same signatures as the public entries, which dispatch here
// when their tensors live on the GPU. Defined in src/ops/cuda/rope.cu.
#pragma once

#include "ops/rope.h"

namespace mt::ops::cuda {

void rope_forward(Context& ctx, const RopeParams& p, const Tensor& positions, const Tensor& x,
                  Tensor& y);
void rope_backward(Context& ctx, const RopeParams& p, const Tensor& positions, const Tensor& dy,
                   Tensor& dx);

}  // namespace mt::ops::cuda
