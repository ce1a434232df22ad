#include "ops/linear.h"

#include "core/arena.h"
#include "ops/cpu/gemm.h"

namespace mt::ops::cpu {

void linear_forward(Context& ctx, const LinearParams& p, const Tensor& x, const Tensor& w,
                    const Tensor& a, const Tensor& b, Tensor& y, Tensor& xa) {
  const int64_t T = p.tokens, r = p.lora_rank;
  cpu::gemm(ctx, false, true, T, p.out, p.in, 1.f, x.f32(), p.in, w.f32(), p.in, 0.f, y.f32(),
            p.out);
  if (r) {
    cpu::gemm(ctx, false, true, T, r, p.in, 1.f, x.f32(), p.in, a.f32(), p.in, 0.f, xa.f32(), r);
    cpu::gemm(ctx, false, true, T, p.out, r, p.lora_scale(), xa.f32(), r, b.f32(), r, 1.f, y.f32(),
              p.out);
  }
}

void linear_backward(Context& ctx, const LinearParams& p, const Tensor& x, const Tensor& w,
                     const Tensor& a, const Tensor& b, const Tensor& xa, const Tensor& dy,
                     Tensor& dx, Tensor& dw, Tensor& da, Tensor& db, bool accumulate_dx) {
  const int64_t T = p.tokens, r = p.lora_rank;
  const float s = p.lora_scale();
  const bool want_dx = dx.defined(), want_dw = dw.defined();
  const bool want_da = r && da.defined(), want_db = r && db.defined();

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

}  // namespace mt::ops::cpu
