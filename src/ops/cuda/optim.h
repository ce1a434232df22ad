// CUDA implementations of ops/optim.h: same signatures as the public entries, which dispatch here
// when their tensors live on the GPU. Defined in src/ops/cuda/optim.cu.
#pragma once

#include "ops/optim.h"

namespace mt::ops::cuda {

void adamw_step(Context& ctx, const AdamWParams& p, Tensor& param, const Tensor& grad, Tensor& m,
                Tensor& v);
void grad_norm_sq(Context& ctx, const std::vector<Tensor>& grads, Tensor& out);
void clip_grad_norm(Context& ctx, const std::vector<Tensor>& grads, double max_norm, Tensor& norm);

}  // namespace mt::ops::cuda
