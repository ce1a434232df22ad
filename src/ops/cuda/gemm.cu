// matmul on the GPU: cuBLASLt with the operands' row strides as leading dimensions (f32 or bf16
// operands, C f32 or bf16, fp32 accumulation).
#include "ops/cuda/blas.h"
#include "ops/cuda/common.cuh"
#include "ops/gemm.h"

namespace mt::ops::cuda {

void matmul(Context& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
            float alpha, float beta) {
  const int64_t m = c.dim(0), n = c.dim(1), k = trans_a ? a.dim(0) : a.dim(1);
  auto ld = [](const Tensor& t) { return t.dim(0) > 1 ? t.stride(0) : t.dim(1); };
  lt_matmul(ctx, trans_a, trans_b, m, n, k, alpha, {a.raw(), a.dtype(), ld(a)},
            {b.raw(), b.dtype(), ld(b)}, beta, c.raw(), c.dtype(), ld(c));
}

}  // namespace mt::ops::cuda
