// CUDA implementations of ops/rope2d.h: same signatures as the public entries, which dispatch
// here when their tensors live on the GPU. Defined in src/ops/cuda/rope2d.cu (not landed yet).
#pragma once

#include "ops/rope2d.h"

namespace mt::ops::cuda {

void rope2d_forward(Context& ctx, const Rope2dParams& p, const Tensor& positions, const Tensor& x,
                    Tensor& y);
void rope2d_backward(Context& ctx, const Rope2dParams& p, const Tensor& positions, const Tensor& dy,
                     Tensor& dx);

}  // namespace mt::ops::cuda
