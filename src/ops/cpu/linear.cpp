#include "ops/linear.h"

#include "core/arena.h"
#include "ops/cpu/gemm.h"

namespace mt::ops {

namespace {

void check_args(const LinearParams& p, const Tensor& x, const Tensor& w, const Tensor& a,
                const Tensor& b) {
  MT_CHECK(p.tokens >= 0 && p.in > 0 && p.out > 0 && p.lora_rank >= 0, ValueError,
           "linear: bad sizes tokens=", p.tokens, " in=", p.in, " out=", p.out,
           " rank=", p.lora_rank);
  expect_shape(x, {p.tokens, p.in}, "linear x");
  expect_shape(w, {p.out, p.in}, "linear weight");
  if (p.lora_rank) {
    expect_shape(a, {p.lora_rank, p.in}, "linear lora_A");
    expect_shape(b, {p.out, p.lora_rank}, "linear lora_B");
  }
}

}  // namespace

void linear_forward(Context& ctx, const LinearParams& p, const Tensor& x, const Tensor& w,
                    const Tensor& a, const Tensor& b, Tensor& y, Tensor& xa) {
  check_args(p, x, w, a, b);
  expect_shape(y, {p.tokens, p.out}, "linear y");
  const int64_t T = p.tokens, r = p.lora_rank;
  cpu::gemm(ctx, false, true, T, p.out, p.in, 1.f, x.f32(), p.in, w.f32(), p.in, 0.f, y.f32(),
            p.out);
  if (r) {
    expect_shape(xa, {T, r}, "linear xa");
    cpu::gemm(ctx, false, true, T, r, p.in, 1.f, x.f32(), p.in, a.f32(), p.in, 0.f, xa.f32(), r);
    cpu::gemm(ctx, false, true, T, p.out, r, p.lora_scale(), xa.f32(), r, b.f32(), r, 1.f, y.f32(),
              p.out);
  }
}

void linear_backward(Context& ctx, const LinearParams& p, const Tensor& x, const Tensor& w,
                     const Tensor& a, const Tensor& b, const Tensor& xa, const Tensor& dy,
                     Tensor& dx, Tensor& dw, Tensor& da, Tensor& db, bool accumulate_dx) {
  check_args(p, x, w, a, b);
  expect_shape(dy, {p.tokens, p.out}, "linear dy");
  const int64_t T = p.tokens, r = p.lora_rank;
  const float s = p.lora_scale();
  const bool want_dx = dx.defined(), want_dw = dw.defined();
  const bool want_da = r && da.defined(), want_db = r && db.defined();
  if (want_dx) expect_shape(dx, {T, p.in}, "linear dx");
  if (want_dw) expect_shape(dw, {p.out, p.in}, "linear dw");
  if (r) expect_shape(xa, {T, r}, "linear xa");
  if (want_da) expect_shape(da, {r, p.in}, "linear lora_A grad");
  if (want_db) expect_shape(db, {p.out, r}, "linear lora_B grad");

  if (want_dx)
    cpu::gemm(ctx, false, false, T, p.in, p.out, 1.f, dy.f32(), p.out, w.f32(), p.in,
              accumulate_dx ? 1.f : 0.f, dx.f32(), p.in);
  if (want_dw)
    cpu::gemm(ctx, true, false, p.out, p.in, T, 1.f, dy.f32(), p.out, x.f32(), p.in, 1.f, dw.f32(),
              p.in);
  if (want_db)
    cpu::gemm(ctx, true, false, p.out, r, T, s, dy.f32(), p.out, xa.f32(), r, 1.f, db.f32(), r);
  if (r && (want_dx || want_da)) {
    // dy B is the gradient reaching x A^T; both dx and dA are built from it.
    ArenaScope scope(ctx.workspace());
    Tensor dyb = ctx.workspace().alloc({T, r});
    cpu::gemm(ctx, false, false, T, r, p.out, 1.f, dy.f32(), p.out, b.f32(), r, 0.f, dyb.f32(), r);
    if (want_dx)
      cpu::gemm(ctx, false, false, T, p.in, r, s, dyb.f32(), r, a.f32(), p.in, 1.f, dx.f32(), p.in);
    if (want_da)
      cpu::gemm(ctx, true, false, r, p.in, T, s, dyb.f32(), r, x.f32(), p.in, 1.f, da.f32(), p.in);
  }
}

}  // namespace mt::ops
