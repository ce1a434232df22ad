#include "ops/norm.h"

#include <cstdio>
#include <initializer_list>
#include <utility>

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

using Named = std::pair<const Tensor*, const char*>;

// "<op> <operand>" on the stack: the entries run inside the training step, which must not
// allocate (tests/train/test_step_alloc.cpp).
struct Name {
  char text[32];
  Name(const char* op, const char* what) { std::snprintf(text, sizeof text, "%s %s", op, what); }
};

// What every norm entry checks, forward and backward alike: the sizes, the [rows, dim] operands
// (x, then y, or dy and dx), the weight [dim] (null: l2norm has none) and the per-row rstd [rows].
// Messages name "<op> <operand>".
void check_norm(const NormParams& p, const char* op, std::initializer_list<Named> rows,
                const Tensor* w, const Tensor& rstd) {
  MT_CHECK(p.rows >= 0 && p.dim > 0, ValueError, "norm: bad sizes rows=", p.rows, " dim=", p.dim);
  MT_CHECK(p.eps >= 0, ValueError, "norm: eps must be >= 0, got ", p.eps);
  for (const auto& [t, what] : rows) expect_shape(*t, {p.rows, p.dim}, Name(op, what).text);
  if (w) expect_shape(*w, {p.dim}, Name(op, "weight").text);
  expect_shape(rstd, {p.rows}, Name(op, "rstd").text);
}

}  // namespace

void rmsnorm_forward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w, Tensor& y,
                     Tensor& rstd) {
  check_norm(p, "rmsnorm", {{&x, "x"}, {&y, "y"}}, &w, rstd);
  dispatch(MT_OP_BODIES(rmsnorm_forward), {&x, &w, &y, &rstd}, ctx, p, x, w, y, rstd);
}

void rmsnorm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw) {
  check_norm(p, "rmsnorm", {{&x, "x"}, {&dy, "dy"}, {&dx, "dx"}}, &w, rstd);
  if (dw.defined()) expect_shape(dw, {p.dim}, "rmsnorm dw");
  dispatch(MT_OP_BODIES(rmsnorm_backward), {&x, &w, &rstd, &dy, &dx, &dw}, ctx, p, x, w, rstd, dy,
           dx, dw);
}

void layernorm_forward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                       const Tensor& b, Tensor& y, Tensor& mean, Tensor& rstd) {
  check_norm(p, "layernorm", {{&x, "x"}, {&y, "y"}}, &w, rstd);
  expect_shape(b, {p.dim}, "layernorm bias");
  expect_shape(mean, {p.rows}, "layernorm mean");
  dispatch(MT_OP_BODIES(layernorm_forward), {&x, &w, &b, &y, &mean, &rstd}, ctx, p, x, w, b, y,
           mean, rstd);
}

void layernorm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dy, Tensor& dx,
                        Tensor& dw, Tensor& db) {
  check_norm(p, "layernorm", {{&x, "x"}, {&dy, "dy"}, {&dx, "dx"}}, &w, rstd);
  expect_shape(mean, {p.rows}, "layernorm mean");
  if (dw.defined()) expect_shape(dw, {p.dim}, "layernorm dw");
  if (db.defined()) expect_shape(db, {p.dim}, "layernorm db");
  dispatch(MT_OP_BODIES(layernorm_backward), {&x, &w, &mean, &rstd, &dy, &dx, &dw, &db}, ctx, p, x,
           w, mean, rstd, dy, dx, dw, db);
}

void l2norm_forward(Context& ctx, const NormParams& p, const Tensor& x, Tensor& y, Tensor& rstd) {
  check_norm(p, "l2norm", {{&x, "x"}, {&y, "y"}}, nullptr, rstd);
  dispatch(MT_OP_BODIES(l2norm_forward), {&x, &y, &rstd}, ctx, p, x, y, rstd);
}

void l2norm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& rstd,
                     const Tensor& dy, Tensor& dx) {
  check_norm(p, "l2norm", {{&x, "x"}, {&dy, "dy"}, {&dx, "dx"}}, nullptr, rstd);
  dispatch(MT_OP_BODIES(l2norm_backward), {&x, &rstd, &dy, &dx}, ctx, p, x, rstd, dy, dx);
}

}  // namespace mt::ops
