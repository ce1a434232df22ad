// CUDA implementations of ops/gelu.h: same signatures as the public entries, which dispatch here
// when their tensors live on the GPU. Defined in src/ops/cuda/gelu.cu (not landed yet).
#pragma once

#include "ops/gelu.h"

namespace mt::ops::cuda {

void gelu_forward(Context& ctx, GeluKind kind, const Tensor& x, Tensor& y);
void gelu_backward(Context& ctx, GeluKind kind, const Tensor& x, const Tensor& dy, Tensor& dx);

}  // namespace mt::ops::cuda
