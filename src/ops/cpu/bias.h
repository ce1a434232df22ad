// The CPU path of ops/bias.h. Called by the entries after they validated, so it does not re-check.
#pragma once

#include "ops/bias.h"

namespace mt::ops::cpu {

void bias_add_forward(Context& ctx, const Tensor& b, Tensor& y);
void bias_add_backward(Context& ctx, const Tensor& dy, Tensor& db);

}  // namespace mt::ops::cpu
