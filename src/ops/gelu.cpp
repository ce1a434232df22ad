#include "ops/gelu.h"

#include "ops/dispatch.h"

namespace mt::ops {

void gelu_forward(Context& ctx, GeluKind kind, const Tensor& x, Tensor& y) {
  expect_shape(x, x.shape(), "gelu x");
  expect_shape(y, x.shape(), "gelu y");
  if (op_device("gelu_forward", {&x, &y}) == Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    return cuda::gelu_forward(ctx, kind, x, y);
#else
    no_cuda_backend("gelu_forward");
#endif
  }
  cpu::gelu_forward(ctx, kind, x, y);
}

void gelu_backward(Context& ctx, GeluKind kind, const Tensor& x, const Tensor& dy, Tensor& dx) {
  expect_shape(x, x.shape(), "gelu x");
  expect_shape(dy, x.shape(), "gelu dy");
  expect_shape(dx, x.shape(), "gelu dx");
  if (op_device("gelu_backward", {&x, &dy, &dx}) == Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    return cuda::gelu_backward(ctx, kind, x, dy, dx);
#else
    no_cuda_backend("gelu_backward");
#endif
  }
  cpu::gelu_backward(ctx, kind, x, dy, dx);
}

}  // namespace mt::ops
