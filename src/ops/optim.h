// AdamW with fp32 moments and decoupled weight decay, and global gradient-norm clipping.
#pragma once

#include <vector>

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

struct AdamWParams {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
  int64_t step = 1;  // 1-based, for bias correction
};

// A run's AdamW settings; each step turns them into AdamWParams. Here, below both the
// single-process optimizer (train/) and the sharded step (parallel/), so that neither reaches up.
struct AdamWOptions {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
  double clip_norm = 1.0;  // <= 0: no clipping
  AdamWParams at(float lr, int64_t step) const {
    return {.lr = lr,
            .beta1 = beta1,
            .beta2 = beta2,
            .eps = eps,
            .weight_decay = weight_decay,
            .step = step};
  }
};

// param -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * param); m, v updated in place.
using AdamwStep = void(Context& ctx, const AdamWParams& p, Tensor& param, const Tensor& grad,
                       Tensor& m, Tensor& v);
AdamwStep adamw_step;

// out f64 [1] = the sum of squares of all gradients (double accumulation), written.
using GradNormSq = void(Context& ctx, const std::vector<Tensor>& grads, Tensor& out);
GradNormSq grad_norm_sq;
// Scales all gradients so that their global L2 norm is at most max_norm; norm f64 [1] = the norm
// before clipping (written; the scale is computed where the gradients live, never on the host).
// max_norm <= 0 disables clipping.
using ClipGradNorm = void(Context& ctx, const std::vector<Tensor>& grads, double max_norm,
                          Tensor& norm);
ClipGradNorm clip_grad_norm;

// The backends' bodies, called by the entries above once they validated: ops/cpu/optim.cpp, and
// ops/cuda/optim.cu in CUDA builds.
MT_OP_BACKENDS(AdamwStep adamw_step; GradNormSq grad_norm_sq; ClipGradNorm clip_grad_norm;)

}  // namespace mt::ops
