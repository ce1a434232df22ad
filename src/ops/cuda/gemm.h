// The CUDA path of ops/gemm.h (src/ops/cuda/gemm.cu). A plain C++ header: the entries include
// it in every build and call it only in a MOETRAIN_WITH_CUDA one.
#pragma once

#include "core/context.h"
#include "core/tensor.h"

namespace mt::ops::cuda {

void matmul(Context& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
            float alpha, float beta);

}  // namespace mt::ops::cuda
