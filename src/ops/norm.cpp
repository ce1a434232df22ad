#include "ops/norm.h"

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

void check_rows(const NormParams& p, const Tensor& t, const char* what) {
  expect_shape(t, {p.rows, p.dim}, what);
}

void check_params(const NormParams& p) {
  MT_CHECK(p.rows >= 0 && p.dim > 0, ValueError, "norm: bad sizes rows=", p.rows, " dim=", p.dim);
  MT_CHECK(p.eps >= 0, ValueError, "norm: eps must be >= 0, got ", p.eps);
}

}  // namespace

void rmsnorm_forward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w, Tensor& y,
                     Tensor& rstd) {
  check_params(p);
  check_rows(p, x, "rmsnorm x");
  check_rows(p, y, "rmsnorm y");
  expect_shape(w, {p.dim}, "rmsnorm weight");
  expect_shape(rstd, {p.rows}, "rmsnorm rstd");
  dispatch(MT_OP_BODIES(rmsnorm_forward), {&x, &w, &y, &rstd}, ctx, p, x, w, y, rstd);
}

void rmsnorm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw) {
  check_params(p);
  check_rows(p, x, "rmsnorm x");
  check_rows(p, dy, "rmsnorm dy");
  check_rows(p, dx, "rmsnorm dx");
  expect_shape(w, {p.dim}, "rmsnorm weight");
  expect_shape(rstd, {p.rows}, "rmsnorm rstd");
  if (dw.defined()) expect_shape(dw, {p.dim}, "rmsnorm dw");
  dispatch(MT_OP_BODIES(rmsnorm_backward), {&x, &w, &rstd, &dy, &dx, &dw}, ctx, p, x, w, rstd, dy,
           dx, dw);
}

void layernorm_forward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                       const Tensor& b, Tensor& y, Tensor& mean, Tensor& rstd) {
  check_params(p);
  check_rows(p, x, "layernorm x");
  check_rows(p, y, "layernorm y");
  expect_shape(w, {p.dim}, "layernorm weight");
  expect_shape(b, {p.dim}, "layernorm bias");
  expect_shape(mean, {p.rows}, "layernorm mean");
  expect_shape(rstd, {p.rows}, "layernorm rstd");
  dispatch(MT_OP_BODIES(layernorm_forward), {&x, &w, &b, &y, &mean, &rstd}, ctx, p, x, w, b, y,
           mean, rstd);
}

void layernorm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dy, Tensor& dx,
                        Tensor& dw, Tensor& db) {
  check_params(p);
  check_rows(p, x, "layernorm x");
  check_rows(p, dy, "layernorm dy");
  check_rows(p, dx, "layernorm dx");
  expect_shape(w, {p.dim}, "layernorm weight");
  expect_shape(mean, {p.rows}, "layernorm mean");
  expect_shape(rstd, {p.rows}, "layernorm rstd");
  if (dw.defined()) expect_shape(dw, {p.dim}, "layernorm dw");
  if (db.defined()) expect_shape(db, {p.dim}, "layernorm db");
  dispatch(MT_OP_BODIES(layernorm_backward), {&x, &w, &mean, &rstd, &dy, &dx, &dw, &db}, ctx, p, x,
           w, mean, rstd, dy, dx, dw, db);
}

void l2norm_forward(Context& ctx, const NormParams& p, const Tensor& x, Tensor& y, Tensor& rstd) {
  check_params(p);
  check_rows(p, x, "l2norm x");
  check_rows(p, y, "l2norm y");
  expect_shape(rstd, {p.rows}, "l2norm rstd");
  dispatch(MT_OP_BODIES(l2norm_forward), {&x, &y, &rstd}, ctx, p, x, y, rstd);
}

void l2norm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& rstd,
                     const Tensor& dy, Tensor& dx) {
  check_params(p);
  check_rows(p, x, "l2norm x");
  check_rows(p, dy, "l2norm dy");
  check_rows(p, dx, "l2norm dx");
  expect_shape(rstd, {p.rows}, "l2norm rstd");
  dispatch(MT_OP_BODIES(l2norm_backward), {&x, &rstd, &dy, &dx}, ctx, p, x, rstd, dy, dx);
}

}  // namespace mt::ops
