// CUDA implementations of ops/conv1d.h: same signatures as the public entries, which dispatch here
// when their tensors live on the GPU. Defined in src/ops/cuda/conv1d.cu.
#pragma once

#include "ops/conv1d.h"

namespace mt::ops::cuda {

void causal_conv1d_forward(Context& ctx, const CausalConvParams& p, const Tensor& cu_seqlens,
                           const Tensor& x, const Tensor& w, Tensor& y);
void causal_conv1d_backward(Context& ctx, const CausalConvParams& p, const Tensor& cu_seqlens,
                            const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                            Tensor& dw);

}  // namespace mt::ops::cuda
