// Normalisations over the last dimension of a [rows, dim] tensor. A per-head norm with one weight
// shared across heads is the same op on the [tokens * heads, head_dim] view.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

struct NormParams {
  int64_t rows = 0, dim = 0;
  float eps = 1e-6f;
};

// RMSNorm: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); rstd [rows] is saved for backward.
using RmsnormForward = void(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                            Tensor& y, Tensor& rstd);
RmsnormForward rmsnorm_forward;
// dx written, dw accumulates (skipped when undefined).
using RmsnormBackward = void(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                             const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw);
RmsnormBackward rmsnorm_backward;

// LayerNorm with weight and bias: y = (x - mean) * rstd * w + b; mean, rstd [rows] saved.
using LayernormForward = void(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                              const Tensor& b, Tensor& y, Tensor& mean, Tensor& rstd);
LayernormForward layernorm_forward;
using LayernormBackward = void(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                               const Tensor& mean, const Tensor& rstd, const Tensor& dy, Tensor& dx,
                               Tensor& dw, Tensor& db);
LayernormBackward layernorm_backward;

// L2 norm (no weight): y = x / sqrt(sum(x^2) + eps) (eps inside the root, as fla does);
// rstd [rows] saved.
using L2normForward = void(Context& ctx, const NormParams& p, const Tensor& x, Tensor& y,
                           Tensor& rstd);
L2normForward l2norm_forward;
using L2normBackward = void(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& rstd,
                            const Tensor& dy, Tensor& dx);
L2normBackward l2norm_backward;

// The backends' bodies, called by the entries above once they validated: ops/cpu/norm.cpp, and
// ops/cuda/norm.cu in CUDA builds.
MT_OP_BACKENDS(RmsnormForward rmsnorm_forward; RmsnormBackward rmsnorm_backward;
               LayernormForward layernorm_forward; LayernormBackward layernorm_backward;
               L2normForward l2norm_forward; L2normBackward l2norm_backward;)

}  // namespace mt::ops
