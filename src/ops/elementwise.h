// Element work that layers used to write as loops: residual adds, scales, the sigmoid, and the
// copies that split and concatenate fused projections through cols() views. As ops they dispatch
// by device like every other op, and each has a harness test against a double reference.
// Gradient contract: activation gradients are written unless the op says it adds.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

// acc += x (same shape, contiguous). A residual connection's forward, and its backward where two
// gradient paths meet.
using AddInto = void(Context& ctx, const Tensor& x, Tensor& acc);
AddInto add_into;

// y = s * x (same shape, contiguous; y may be x). Backward: dx = s * dy, the same call.
using Scale = void(Context& ctx, const Tensor& x, float s, Tensor& y);
Scale scale;

// y = sigmoid(x); backward from the output: dx = dy * y * (1 - y). Contiguous.
using SigmoidForward = void(Context& ctx, const Tensor& x, Tensor& y);
SigmoidForward sigmoid_forward;
using SigmoidBackward = void(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx);
SigmoidBackward sigmoid_backward;

// dst = src, same shape, either side any strides: the split of a fused buffer into parts (src a
// cols() view) or the concatenation of parts (dst a cols() view). Backward is the copy back.
// Between f32 and bf16 it converts (round to nearest even): the optimizer rounds its fp32
// masters into bf16 weights with it, on the device that holds them.
using Copy = void(Context& ctx, const Tensor& src, Tensor& dst);
Copy copy;

// y[t, h, :] = x[t, :] for every head h: one vector shared by all heads (MLA's rotary key).
// x [T, D] and y [T, H, D] may be strided (y is usually a cols() view of the keys).
// Backward: dx[t, :] = sum_h dy[t, h, :], written.
using ExpandHeadsForward = void(Context& ctx, const Tensor& x, Tensor& y);
ExpandHeadsForward expand_heads_forward;
using ExpandHeadsBackward = void(Context& ctx, const Tensor& dy, Tensor& dx);
ExpandHeadsBackward expand_heads_backward;

// The backends' bodies, called by the entries above once they validated: ops/cpu/elementwise.cpp,
// and ops/cuda/elementwise.cu in CUDA builds.
MT_OP_BACKENDS(AddInto add_into; Scale scale; SigmoidForward sigmoid_forward;
               SigmoidBackward sigmoid_backward; Copy copy; ExpandHeadsForward expand_heads_forward;
               ExpandHeadsBackward expand_heads_backward;)

}  // namespace mt::ops
