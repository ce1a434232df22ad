// CPU GEMM through BLAS (row-major). Only CPU kernels call the raw-pointer form; everything else
// calls ops::matmul on tensors.
#pragma once

#include <cstdint>

#include "core/context.h"
#include "core/tensor.h"

namespace mt::ops::cpu {

// C[M,N] = alpha * op(A) * op(B) + beta * C, row-major, op(X) = X or X^T.
// A is [M,K] (or [K,M] when trans_a), B is [K,N] (or [N,K] when trans_b).
void gemm(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc);

}  // namespace mt::ops::cpu
