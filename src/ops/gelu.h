// GELU, exact (erf) and tanh-approximated: the vision tower's MLP uses transformers'
// "gelu_pytorch_tanh", the multimodal projector nn.GELU() (erf). Activation gradients are written.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

enum class GeluKind {
  Erf,   // 0.5 x (1 + erf(x / sqrt 2))
  Tanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
};

// The constants of both forms, shared by the CPU and CUDA bodies.
namespace gelu_const {
inline constexpr float kSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kCubic = 0.044715f;
inline constexpr float kInvSqrt2 = 0.7071067811865476f;
inline constexpr float kInvSqrt2Pi = 0.3989422804014327f;
}  // namespace gelu_const

// x, y, dy, dx: one shape, contiguous. y may be x; dx may be dy.
using GeluForward = void(Context& ctx, GeluKind kind, const Tensor& x, Tensor& y);
GeluForward gelu_forward;
using GeluBackward = void(Context& ctx, GeluKind kind, const Tensor& x, const Tensor& dy,
                          Tensor& dx);
GeluBackward gelu_backward;

// The backends' bodies, called by the entries above once they validated: ops/cpu/gelu.cpp, and
// ops/cuda/gelu.cu in CUDA builds.
MT_OP_BACKENDS(GeluForward gelu_forward; GeluBackward gelu_backward;)

}  // namespace mt::ops
