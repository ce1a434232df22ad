// The CUDA path of ops/elementwise.h (src/ops/cuda/elementwise.cu). A plain C++ header: the entries
// include it in every build and call it only in a MOETRAIN_WITH_CUDA one.
#pragma once

#include "ops/elementwise.h"

namespace mt::ops::cuda {

void add_into(Context& ctx, const Tensor& x, Tensor& acc);
void scale(Context& ctx, const Tensor& x, float s, Tensor& y);
void sigmoid_forward(Context& ctx, const Tensor& x, Tensor& y);
void sigmoid_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx);
void copy(Context& ctx, const Tensor& src, Tensor& dst);
void expand_heads_forward(Context& ctx, const Tensor& x, Tensor& y);
void expand_heads_backward(Context& ctx, const Tensor& dy, Tensor& dx);

}  // namespace mt::ops::cuda
