// Normalisations over the last dimension of a [rows, dim] tensor. A per-head norm with one weight
// shared across heads is the same op on the [tokens * heads, head_dim] view.
#pragma once

#include "core/context.h"
#include "core/tensor.h"

namespace mt::ops {

struct NormParams {
  int64_t rows = 0, dim = 0;
  float eps = 1e-6f;
};

// RMSNorm: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); rstd [rows] is saved for backward.
void rmsnorm_forward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w, Tensor& y,
                     Tensor& rstd);
// dx written, dw accumulates (skipped when undefined).
void rmsnorm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw);

// LayerNorm with weight and bias: y = (x - mean) * rstd * w + b; mean, rstd [rows] saved.
void layernorm_forward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                       const Tensor& b, Tensor& y, Tensor& mean, Tensor& rstd);
void layernorm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dy, Tensor& dx,
                        Tensor& dw, Tensor& db);

// L2 norm (no weight): y = x / sqrt(sum(x^2) + eps) (eps inside the root, as fla does);
// rstd [rows] saved.
void l2norm_forward(Context& ctx, const NormParams& p, const Tensor& x, Tensor& y, Tensor& rstd);
void l2norm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& rstd,
                     const Tensor& dy, Tensor& dx);

}  // namespace mt::ops
