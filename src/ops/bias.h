// A bias vector added to every row: the vision tower's projections and its patch embedding all
// carry one (the language model's do not, so ops/linear.h has none).
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

// y[r, :] += b for every row r; y [rows, n], b [n], both contiguous.
using BiasAddForward = void(Context& ctx, const Tensor& b, Tensor& y);
BiasAddForward bias_add_forward;
// db[:] += sum_r dy[r, :] (a parameter gradient: accumulates). The input gradient is dy itself.
using BiasAddBackward = void(Context& ctx, const Tensor& dy, Tensor& db);
BiasAddBackward bias_add_backward;

// The backends' bodies, called by the entries above once they validated: ops/cpu/bias.cpp, and
// ops/cuda/bias.cu in CUDA builds.
MT_OP_BACKENDS(BiasAddForward bias_add_forward; BiasAddBackward bias_add_backward;)

}  // namespace mt::ops
