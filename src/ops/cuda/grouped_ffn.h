// The CUDA path of ops/grouped_ffn.h (src/ops/cuda/grouped_ffn.cu); its projections are
// grouped_matmul calls. A plain C++ header: the entries include it in every build and call it only
// in a MOETRAIN_WITH_CUDA one.
#pragma once

#include "ops/grouped_ffn.h"

namespace mt::ops::cuda {

void grouped_ffn_swiglu_forward(Context& ctx, const Tensor& gate_up, Tensor& h);
void grouped_ffn_swiglu_backward(Context& ctx, const Tensor& gate_up, const Tensor& dh,
                                 Tensor& dgate_up);

}  // namespace mt::ops::cuda
