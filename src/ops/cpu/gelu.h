// The CPU path of ops/gelu.h: fp32 loops. Called by the entries after they validated, so it does
// not re-check.
#pragma once

#include "ops/gelu.h"

namespace mt::ops::cpu {

void gelu_forward(Context& ctx, GeluKind kind, const Tensor& x, Tensor& y);
void gelu_backward(Context& ctx, GeluKind kind, const Tensor& x, const Tensor& dy, Tensor& dx);

}  // namespace mt::ops::cpu
