// Matrix multiply on the CPU through BLAS (row-major). This is the one place that calls cblas;
// ops use it instead of writing their own loops for anything larger than a tile.
#pragma once

#include <cstdint>

#include "core/context.h"
#include "core/tensor.h"

namespace mt::ops {

// C[M,N] = alpha * op(A) * op(B) + beta * C, row-major, op(X) = X or X^T.
// A is [M,K] (or [K,M] when trans_a), B is [K,N] (or [N,K] when trans_b).
void gemm(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc);

// Tensor form for 2-D operands: C = alpha * op(A) op(B) + beta * C, with shapes checked.
void matmul(Context& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
            float alpha = 1.0f, float beta = 0.0f);

}  // namespace mt::ops
