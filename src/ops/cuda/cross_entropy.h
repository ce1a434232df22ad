// CUDA implementations of ops/cross_entropy.h: same signatures as the public entries, which
// dispatch here when their tensors live on the GPU. Defined in src/ops/cuda/cross_entropy.cu.
#pragma once

#include "ops/cross_entropy.h"

namespace mt::ops::cuda {

void lm_head_cross_entropy_forward(Context& ctx, const CrossEntropyParams& p, const Tensor& h,
                                   const Tensor& w, const Tensor& targets, Tensor& lse,
                                   Tensor& loss);
void lm_head_cross_entropy_backward(Context& ctx, const CrossEntropyParams& p, const Tensor& h,
                                    const Tensor& w, const Tensor& targets, const Tensor& lse,
                                    float dloss, Tensor& dh, Tensor& dw);
void lm_head_logits(Context& ctx, const Tensor& h, const Tensor& w, Tensor& logits);

}  // namespace mt::ops::cuda
