// The CPU path of ops/rope2d.h. Called by the entries after they validated, so it does not
// re-check.
#pragma once

#include "ops/rope2d.h"

namespace mt::ops::cpu {

void rope2d_forward(Context& ctx, const Rope2dParams& p, const Tensor& positions, const Tensor& x,
                    Tensor& y);
void rope2d_backward(Context& ctx, const Rope2dParams& p, const Tensor& positions, const Tensor& dy,
                     Tensor& dx);

}  // namespace mt::ops::cpu
