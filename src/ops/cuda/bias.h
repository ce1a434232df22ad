// CUDA implementations of ops/bias.h: same signatures as the public entries, which dispatch here
// when their tensors live on the GPU. Defined in src/ops/cuda/bias.cu (not landed yet).
#pragma once

#include "ops/bias.h"

namespace mt::ops::cuda {

void bias_add_forward(Context& ctx, const Tensor& b, Tensor& y);
void bias_add_backward(Context& ctx, const Tensor& dy, Tensor& db);

}  // namespace mt::ops::cuda
