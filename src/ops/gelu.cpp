#include "ops/gelu.h"

#include "ops/dispatch.h"

namespace mt::ops {

void gelu_forward(Context& ctx, GeluKind kind, const Tensor& x, Tensor& y) {
  expect_shape(x, x.shape(), "gelu x");
  expect_shape(y, x.shape(), "gelu y");
  dispatch(MT_OP_BODIES(gelu_forward), {&x, &y}, ctx, kind, x, y);
}

void gelu_backward(Context& ctx, GeluKind kind, const Tensor& x, const Tensor& dy, Tensor& dx) {
  expect_shape(x, x.shape(), "gelu x");
  expect_shape(dy, x.shape(), "gelu dy");
  expect_shape(dx, x.shape(), "gelu dx");
  dispatch(MT_OP_BODIES(gelu_backward), {&x, &dy, &dx}, ctx, kind, x, dy, dx);
}

}  // namespace mt::ops
