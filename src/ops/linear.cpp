#include "ops/linear.h"

#include "ops/dispatch.h"

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
  if (p.lora_rank) expect_shape(xa, {p.tokens, p.lora_rank}, "linear xa");
  dispatch(MT_OP_BODIES(linear_forward), {&x, &w, &a, &b, &y, &xa}, ctx, p, x, w, a, b, y, xa);
}

void linear_backward(Context& ctx, const LinearParams& p, const Tensor& x, const Tensor& w,
                     const Tensor& a, const Tensor& b, const Tensor& xa, const Tensor& dy,
                     Tensor& dx, Tensor& dw, Tensor& da, Tensor& db, bool accumulate_dx) {
  check_args(p, x, w, a, b);
  expect_shape(dy, {p.tokens, p.out}, "linear dy");
  const int64_t T = p.tokens, r = p.lora_rank;
  if (dx.defined()) expect_shape(dx, {T, p.in}, "linear dx");
  if (dw.defined()) expect_shape(dw, {p.out, p.in}, "linear dw");
  if (r) expect_shape(xa, {T, r}, "linear xa");
  if (r && da.defined()) expect_shape(da, {r, p.in}, "linear lora_A grad");
  if (r && db.defined()) expect_shape(db, {p.out, r}, "linear lora_B grad");
  dispatch(MT_OP_BODIES(linear_backward), {&x, &w, &a, &b, &xa, &dy, &dx, &dw, &da, &db}, ctx, p, x,
           w, a, b, xa, dy, dx, dw, da, db, accumulate_dx);
}

}  // namespace mt::ops
