// Element-wise activations: SiLU, SwiGLU (silu(gate) * up), sigmoid gating (x * sigmoid(g)).
// Activation gradients are written (=), never accumulated.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

// y = x * sigmoid(x); x, y, dy, dx all have the same shape.
using SiluForward = void(Context& ctx, const Tensor& x, Tensor& y);
SiluForward silu_forward;
using SiluBackward = void(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx);
SiluBackward silu_backward;

// y = silu(gate) * up, all [rows, n].
using SwigluForward = void(Context& ctx, const Tensor& gate, const Tensor& up, Tensor& y);
SwigluForward swiglu_forward;
using SwigluBackward = void(Context& ctx, const Tensor& gate, const Tensor& up, const Tensor& dy,
                            Tensor& dgate, Tensor& dup);
SwigluBackward swiglu_backward;

// y = x * sigmoid(g) (the output gate of KDA and gated attention), same shapes.
using SigmoidGateForward = void(Context& ctx, const Tensor& x, const Tensor& g, Tensor& y);
SigmoidGateForward sigmoid_gate_forward;
using SigmoidGateBackward = void(Context& ctx, const Tensor& x, const Tensor& g, const Tensor& dy,
                                 Tensor& dx, Tensor& dg);
SigmoidGateBackward sigmoid_gate_backward;

inline float sigmoidf(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// The backends' bodies, called by the entries above once they validated: ops/cpu/activation.cpp,
// and ops/cuda/activation.cu in CUDA builds.
MT_OP_BACKENDS(SiluForward silu_forward; SiluBackward silu_backward; SwigluForward swiglu_forward;
               SwigluBackward swiglu_backward; SigmoidGateForward sigmoid_gate_forward;
               SigmoidGateBackward sigmoid_gate_backward;)

}  // namespace mt::ops
