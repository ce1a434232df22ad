// GELU, exact (erf) and tanh-approximated: the vision tower's MLP uses transformers'
// "gelu_pytorch_tanh", the multimodal projector nn.GELU() (erf). Activation gradients are written.
#pragma once

#include "core/context.h"
#include "core/tensor.h"

namespace mt::ops {

enum class GeluKind {
  Erf,   // 0.5 x (1 + erf(x / sqrt 2))
  Tanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
};

// x, y, dy, dx: one shape, contiguous. y may be x; dx may be dy.
void gelu_forward(Context& ctx, GeluKind kind, const Tensor& x, Tensor& y);
void gelu_backward(Context& ctx, GeluKind kind, const Tensor& x, const Tensor& dy, Tensor& dx);

}  // namespace mt::ops
