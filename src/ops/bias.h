// A bias vector added to every row: the vision tower's projections and its patch embedding all
// carry one (the language model's do not, so ops/linear.h has none).
#pragma once

#include "core/context.h"
#include "core/tensor.h"

namespace mt::ops {

// y[r, :] += b for every row r; y [rows, n], b [n], both contiguous.
void bias_add_forward(Context& ctx, const Tensor& b, Tensor& y);
// db[:] += sum_r dy[r, :] (a parameter gradient: accumulates). The input gradient is dy itself.
void bias_add_backward(Context& ctx, const Tensor& dy, Tensor& db);

}  // namespace mt::ops
