// The CPU path of ops/conv1d.h: fp32 loops. Called by the entries after they validated, so it does
// not re-check.
#pragma once

#include "ops/conv1d.h"

namespace mt::ops::cpu {

void causal_conv1d_forward(Context& ctx, const CausalConvParams& p, const Tensor& cu_seqlens,
                           const Tensor& x, const Tensor& w, Tensor& y);
void causal_conv1d_backward(Context& ctx, const CausalConvParams& p, const Tensor& cu_seqlens,
                            const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                            Tensor& dw);

}  // namespace mt::ops::cpu
