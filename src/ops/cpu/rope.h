// The CPU path of ops/rope.h: fp32 loops. Called by the entries after they validated, so it does
// not re-check.
#pragma once

#include "ops/rope.h"

namespace mt::ops::cpu {

void rope_forward(Context& ctx, const RopeParams& p, const Tensor& positions, const Tensor& x,
                  Tensor& y);
void rope_backward(Context& ctx, const RopeParams& p, const Tensor& positions, const Tensor& dy,
                   Tensor& dx);

}  // namespace mt::ops::cpu
