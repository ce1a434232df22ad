// Row-major matrix products on the GPU through cuBLASLt: C = alpha op(A) op(B) + beta C with A, B
// both f32 or both bf16, C f32 or bf16, fp32 accumulation (no TF32: f32 operands stay exact
// fp32 products, so the f32 harness pass compares like with like).
#pragma once

#include <cstdint>

#include "core/context.h"
#include "core/dtype.h"

namespace mt::ops::cuda {

struct MatRef {
  const void* data;
  DType dtype;
  int64_t ld;  // row stride in elements
};

// A is [m,k] (or [k,m] when trans_a), B is [k,n] (or [n,k] when trans_b), C is [m,n].
void lt_matmul(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               float alpha, MatRef a, MatRef b, float beta, void* c, DType c_dtype, int64_t ldc);

}  // namespace mt::ops::cuda
