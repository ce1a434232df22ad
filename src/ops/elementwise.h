// Element work that layers used to write as loops: residual adds, scales, the sigmoid, and the
// copies that split and concatenate fused projections through cols() views. As ops they dispatch
// by device like every other op, and each has a harness test against a double reference.
// Gradient contract: activation gradients are written unless the op says it adds.
#pragma once

#include "core/context.h"
#include "core/tensor.h"

namespace mt::ops {

// acc += x (same shape, contiguous). A residual connection's forward, and its backward where two
// gradient paths meet.
void add_into(Context& ctx, const Tensor& x, Tensor& acc);

// y = s * x (same shape, contiguous; y may be x). Backward: dx = s * dy, the same call.
void scale(Context& ctx, const Tensor& x, float s, Tensor& y);

// y = sigmoid(x); backward from the output: dx = dy * y * (1 - y). Contiguous.
void sigmoid_forward(Context& ctx, const Tensor& x, Tensor& y);
void sigmoid_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx);

// dst = src, same shape, either side any strides: the split of a fused buffer into parts (src a
// cols() view) or the concatenation of parts (dst a cols() view). Backward is the copy back.
void copy(Context& ctx, const Tensor& src, Tensor& dst);

// y[t, h, :] = x[t, :] for every head h: one vector shared by all heads (MLA's rotary key).
// x [T, D] and y [T, H, D] may be strided (y is usually a cols() view of the keys).
// Backward: dx[t, :] = sum_h dy[t, h, :], written.
void expand_heads_forward(Context& ctx, const Tensor& x, Tensor& y);
void expand_heads_backward(Context& ctx, const Tensor& dy, Tensor& dx);

}  // namespace mt::ops
