// Matrix multiply on tensors: the one GEMM entry of the engine. The CPU path goes through BLAS
// (ops/cpu/gemm.h holds the raw-pointer call, for CPU kernels only); a CUDA path slots in behind
// the same signature.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

// C = alpha * op(A) op(B) + beta * C on 2-D f32 tensors, op(X) = X or X^T: A is [M,K] (or [K,M]
// when trans_a), B is [K,N] (or [N,K] when trans_b), C is [M,N]. Operands may be row-strided
// views (rows()/cols() of a larger matrix): the leading dimensions come from stride(0); the
// elements of a row must be adjacent (stride(1) == 1).
void matmul(Context& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
            float alpha = 1.0f, float beta = 0.0f);
// The backends share the entry's type; the defaults stay on the entry.
using Matmul = decltype(matmul);

// Throws ShapeError naming `op` and `what` unless t is a 2-D f32 matrix whose rows are dense
// (stride(1) == 1), which is what a BLAS-style leading dimension can describe.
void expect_matrix(const Tensor& t, const char* op, const char* what);

// The backends' bodies, called by matmul once it checked the shapes: ops/cpu/gemm.cpp, and
// ops/cuda/gemm.cu in CUDA builds.
MT_OP_BACKENDS(Matmul matmul;)

}  // namespace mt::ops
