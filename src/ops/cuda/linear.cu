// Linear + LoRA on the GPU: every product through cuBLASLt; Delta W = B A is never formed. The
// LoRA intermediates (x A^T, dy B) are in the activations' type; weight gradients are f32.
#include "ops/cuda/blas.h"
#include "ops/cuda/common.cuh"
#include "ops/linear.h"

namespace mt::ops::cuda {

namespace {

MatRef m(const Tensor& t, int64_t ld) {
  return {t.raw(), t.dtype(), ld};
}

}  // namespace

void linear_forward(Context& ctx, const LinearParams& p, const Tensor& x, const Tensor& w,
                    const Tensor& a, const Tensor& b, Tensor& y, Tensor& xa) {
  expect_same_dtype("linear", x, w, "weight");
  expect_same_dtype("linear", x, y, "y");
  const int64_t T = p.tokens, r = p.lora_rank;
  lt_matmul(ctx, false, true, T, p.out, p.in, 1.f, m(x, p.in), m(w, p.in), 0.f, y.raw(), y.dtype(),
            p.out);
  if (r) {
    expect_same_dtype("linear", x, a, "lora_A");
    expect_same_dtype("linear", x, b, "lora_B");
    expect_same_dtype("linear", x, xa, "xa");
    lt_matmul(ctx, false, true, T, r, p.in, 1.f, m(x, p.in), m(a, p.in), 0.f, xa.raw(), xa.dtype(),
              r);
    lt_matmul(ctx, false, true, T, p.out, r, p.lora_scale(), m(xa, r), m(b, r), 1.f, y.raw(),
              y.dtype(), p.out);
  }
}

void linear_backward(Context& ctx, const LinearParams& p, const Tensor& x, const Tensor& w,
                     const Tensor& a, const Tensor& b, const Tensor& xa, const Tensor& dy,
                     Tensor& dx, Tensor& dw, Tensor& da, Tensor& db, bool accumulate_dx) {
  expect_same_dtype("linear", x, dy, "dy");
  expect_same_dtype("linear", x, dx, "dx");
  expect_f32("linear", dw, "weight gradient");
  const int64_t T = p.tokens, r = p.lora_rank;
  const float s = p.lora_scale();
  const bool want_dx = dx.defined(), want_dw = dw.defined();
  const bool want_da = r && da.defined(), want_db = r && db.defined();
  if (want_dx)
    lt_matmul(ctx, false, false, T, p.in, p.out, 1.f, m(dy, p.out), m(w, p.in),
              accumulate_dx ? 1.f : 0.f, dx.raw(), dx.dtype(), p.in);
  if (want_dw)
    lt_matmul(ctx, true, false, p.out, p.in, T, 1.f, m(dy, p.out), m(x, p.in), 1.f, dw.raw(),
              DType::F32, p.in);
  if (want_db) {
    expect_f32("linear", db, "lora_B gradient");
    lt_matmul(ctx, true, false, p.out, r, T, s, m(dy, p.out), m(xa, r), 1.f, db.raw(), DType::F32,
              r);
  }
  if (r && (want_dx || want_da)) {
    ArenaScope scope(ctx.workspace());
    Tensor dyb = ctx.workspace().alloc({T, r}, x.dtype());
    lt_matmul(ctx, false, false, T, r, p.out, 1.f, m(dy, p.out), m(b, r), 0.f, dyb.raw(),
              dyb.dtype(), r);
    if (want_dx)
      lt_matmul(ctx, false, false, T, p.in, r, s, m(dyb, r), m(a, p.in), 1.f, dx.raw(), dx.dtype(),
                p.in);
    if (want_da) {
      expect_f32("linear", da, "lora_A gradient");
      lt_matmul(ctx, true, false, r, p.in, T, s, m(dyb, r), m(x, p.in), 1.f, da.raw(), DType::F32,
                p.in);
    }
  }
}

}  // namespace mt::ops::cuda
