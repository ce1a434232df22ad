// Element-wise activations: SiLU, SwiGLU (silu(gate) * up), sigmoid gating (x * sigmoid(g)).
// Activation gradients are written (=), never accumulated.
#pragma once

#include "core/context.h"
#include "core/tensor.h"

namespace mt::ops {

// y = x * sigmoid(x); x, y, dy, dx all have the same shape.
void silu_forward(Context& ctx, const Tensor& x, Tensor& y);
void silu_backward(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx);

// y = silu(gate) * up, all [rows, n].
void swiglu_forward(Context& ctx, const Tensor& gate, const Tensor& up, Tensor& y);
void swiglu_backward(Context& ctx, const Tensor& gate, const Tensor& up, const Tensor& dy,
                     Tensor& dgate, Tensor& dup);

// y = x * sigmoid(g) (the output gate of KDA and gated attention), same shapes.
void sigmoid_gate_forward(Context& ctx, const Tensor& x, const Tensor& g, Tensor& y);
void sigmoid_gate_backward(Context& ctx, const Tensor& x, const Tensor& g, const Tensor& dy,
                           Tensor& dx, Tensor& dg);

inline float sigmoidf(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

}  // namespace mt::ops
