// CUDA path of ops/gemm.h (cuBLASLt); declarations only, the kernels live in gemm.cu.
#pragma once

#include "core/context.h"
#include "core/tensor.h"

namespace mt::ops::cuda {

void matmul(Context& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
            float alpha, float beta);

}  // namespace mt::ops::cuda
