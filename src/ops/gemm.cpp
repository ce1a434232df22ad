#include "ops/gemm.h"

#include "ops/dispatch.h"

namespace mt::ops {

void expect_matrix(const Tensor& t, const char* op, const char* what) {
  MT_CHECK(t.ndim() == 2 && (t.dtype() == DType::F32 || t.dtype() == DType::BF16), ShapeError, op,
           ": ", what, " must be a 2-D f32 or bf16 matrix, got ", t.shape(), " ",
           dtype_name(t.dtype()));
  MT_CHECK(t.dim(1) <= 1 || t.stride(1) == 1, ShapeError, op, ": ", what, " ", t.shape(),
           " has column stride ", t.stride(1), "; rows must be dense");
  MT_CHECK(t.dim(0) <= 1 || t.stride(0) >= t.dim(1), ShapeError, op, ": ", what, " ", t.shape(),
           " has row stride ", t.stride(0), " shorter than a row");
}

void matmul(Context& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
            float alpha, float beta) {
  expect_matrix(a, "matmul", "A");
  expect_matrix(b, "matmul", "B");
  expect_matrix(c, "matmul", "C");
  const int64_t m = trans_a ? a.dim(1) : a.dim(0), k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0), n = trans_b ? b.dim(0) : b.dim(1);
  MT_CHECK(k == kb && c.dim(0) == m && c.dim(1) == n, ShapeError, "matmul shapes ", a.shape(),
           trans_a ? "^T" : "", " x ", b.shape(), trans_b ? "^T" : "", " -> ", c.shape());
  dispatch(MT_OP_BODIES(matmul), {&a, &b, &c}, ctx, a, trans_a, b, trans_b, c, alpha, beta);
}

}  // namespace mt::ops
