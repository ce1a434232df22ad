// CUDA implementations of ops/kda_gate.h: same signatures as the public entries, which dispatch
// here when their tensors live on the GPU. Defined in src/ops/cuda/kda_gate.cu.
#pragma once

#include "ops/kda_gate.h"

namespace mt::ops::cuda {

void kda_gate_forward(Context& ctx, const KdaGateParams& p, const Tensor& raw, const Tensor& a_log,
                      const Tensor& dt_bias, Tensor& g);
void kda_gate_backward(Context& ctx, const KdaGateParams& p, const Tensor& raw, const Tensor& a_log,
                       const Tensor& dt_bias, const Tensor& dg, Tensor& draw, Tensor& da_log,
                       Tensor& ddt_bias);

}  // namespace mt::ops::cuda
