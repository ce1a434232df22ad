#include "ops/bias.h"

#include "ops/dispatch.h"

namespace mt::ops {

void bias_add_forward(Context& ctx, const Tensor& b, Tensor& y) {
  MT_CHECK(y.ndim() == 2, ShapeError, "bias_add y must be [rows, n], got ", y.shape());
  expect_shape(y, y.shape(), "bias_add y");
  expect_shape(b, {y.dim(1)}, "bias_add b");
  dispatch(MT_OP_BODIES(bias_add_forward), {&b, &y}, ctx, b, y);
}

void bias_add_backward(Context& ctx, const Tensor& dy, Tensor& db) {
  MT_CHECK(dy.ndim() == 2, ShapeError, "bias_add dy must be [rows, n], got ", dy.shape());
  expect_shape(dy, dy.shape(), "bias_add dy");
  expect_shape(db, {dy.dim(1)}, "bias_add db");
  dispatch(MT_OP_BODIES(bias_add_backward), {&dy, &db}, ctx, dy, db);
}

}  // namespace mt::ops
