// The CPU path of ops/activation.h: fp32 loops. Called by the entries after they validated, so it
// does not re-check.
#pragma once

#include "ops/activation.h"

namespace mt::ops::cpu {

void silu_forward(Context& ctx, const Tensor& x, Tensor& y);
void silu_backward(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx);
void swiglu_forward(Context& ctx, const Tensor& gate, const Tensor& up, Tensor& y);
void swiglu_backward(Context& ctx, const Tensor& gate, const Tensor& up, const Tensor& dy,
                     Tensor& dgate, Tensor& dup);
void sigmoid_gate_forward(Context& ctx, const Tensor& x, const Tensor& g, Tensor& y);
void sigmoid_gate_backward(Context& ctx, const Tensor& x, const Tensor& g, const Tensor& dy,
                           Tensor& dx, Tensor& dg);

}  // namespace mt::ops::cpu
