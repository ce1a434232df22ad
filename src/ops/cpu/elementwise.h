// The CPU path of ops/elementwise.h: fp32 loops, OpenMP. Called by the entries after they
// validated, so it does not re-check.
#pragma once

#include "ops/elementwise.h"

namespace mt::ops::cpu {

void add_into(Context& ctx, const Tensor& x, Tensor& acc);
void scale(Context& ctx, const Tensor& x, float s, Tensor& y);
void sigmoid_forward(Context& ctx, const Tensor& x, Tensor& y);
void sigmoid_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx);
void copy(Context& ctx, const Tensor& src, Tensor& dst);
void expand_heads_forward(Context& ctx, const Tensor& x, Tensor& y);
void expand_heads_backward(Context& ctx, const Tensor& dy, Tensor& dx);

}  // namespace mt::ops::cpu
