// The CPU path of ops/linear.h: fp32 loops. Called by the entries after they validated, so it does
// not re-check.
#pragma once

#include "ops/linear.h"

namespace mt::ops::cpu {

void linear_forward(Context& ctx, const LinearParams& p, const Tensor& x, const Tensor& w,
                    const Tensor& a, const Tensor& b, Tensor& y, Tensor& xa);
void linear_backward(Context& ctx, const LinearParams& p, const Tensor& x, const Tensor& w,
                     const Tensor& a, const Tensor& b, const Tensor& xa, const Tensor& dy,
                     Tensor& dx, Tensor& dw, Tensor& da, Tensor& db, bool accumulate_dx = false);

}  // namespace mt::ops::cpu
