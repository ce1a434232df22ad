// The CPU path of ops/norm.h: fp32 loops. Called by the entries after they validated, so it does
// not re-check.
#pragma once

#include "ops/norm.h"

namespace mt::ops::cpu {

void rmsnorm_forward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w, Tensor& y,
                     Tensor& rstd);
void rmsnorm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw);
void layernorm_forward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                       const Tensor& b, Tensor& y, Tensor& mean, Tensor& rstd);
void layernorm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dy, Tensor& dx,
                        Tensor& dw, Tensor& db);
void l2norm_forward(Context& ctx, const NormParams& p, const Tensor& x, Tensor& y, Tensor& rstd);
void l2norm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& rstd,
                     const Tensor& dy, Tensor& dx);

}  // namespace mt::ops::cpu
