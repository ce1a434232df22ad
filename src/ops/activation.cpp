#include "ops/activation.h"

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

void same_shape(const Tensor& a, const Tensor& b, const char* what) {
  MT_CHECK(a.shape() == b.shape(), ShapeError, what, ": ", a.shape(), " vs ", b.shape());
}

}  // namespace

void silu_forward(Context& ctx, const Tensor& x, Tensor& y) {
  same_shape(x, y, "silu");
  if (op_device("silu_forward", {&x, &y}) == Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    return cuda::silu_forward(ctx, x, y);
#else
    no_cuda_backend("silu_forward");
#endif
  }
  cpu::silu_forward(ctx, x, y);
}

void silu_backward(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx) {
  same_shape(x, dy, "silu backward");
  same_shape(x, dx, "silu backward");
  if (op_device("silu_backward", {&x, &dy, &dx}) == Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    return cuda::silu_backward(ctx, x, dy, dx);
#else
    no_cuda_backend("silu_backward");
#endif
  }
  cpu::silu_backward(ctx, x, dy, dx);
}

void swiglu_forward(Context& ctx, const Tensor& gate, const Tensor& up, Tensor& y) {
  same_shape(gate, up, "swiglu");
  same_shape(gate, y, "swiglu");
  if (op_device("swiglu_forward", {&gate, &up, &y}) == Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    return cuda::swiglu_forward(ctx, gate, up, y);
#else
    no_cuda_backend("swiglu_forward");
#endif
  }
  cpu::swiglu_forward(ctx, gate, up, y);
}

void swiglu_backward(Context& ctx, const Tensor& gate, const Tensor& up, const Tensor& dy,
                     Tensor& dgate, Tensor& dup) {
  same_shape(gate, up, "swiglu backward");
  same_shape(gate, dy, "swiglu backward");
  same_shape(gate, dgate, "swiglu backward");
  same_shape(gate, dup, "swiglu backward");
  if (op_device("swiglu_backward", {&gate, &up, &dy, &dgate, &dup}) == Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    return cuda::swiglu_backward(ctx, gate, up, dy, dgate, dup);
#else
    no_cuda_backend("swiglu_backward");
#endif
  }
  cpu::swiglu_backward(ctx, gate, up, dy, dgate, dup);
}

void sigmoid_gate_forward(Context& ctx, const Tensor& x, const Tensor& g, Tensor& y) {
  same_shape(x, g, "sigmoid_gate");
  same_shape(x, y, "sigmoid_gate");
  if (op_device("sigmoid_gate_forward", {&x, &g, &y}) == Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    return cuda::sigmoid_gate_forward(ctx, x, g, y);
#else
    no_cuda_backend("sigmoid_gate_forward");
#endif
  }
  cpu::sigmoid_gate_forward(ctx, x, g, y);
}

void sigmoid_gate_backward(Context& ctx, const Tensor& x, const Tensor& g, const Tensor& dy,
                           Tensor& dx, Tensor& dg) {
  same_shape(x, g, "sigmoid_gate backward");
  same_shape(x, dy, "sigmoid_gate backward");
  same_shape(x, dx, "sigmoid_gate backward");
  same_shape(x, dg, "sigmoid_gate backward");
  if (op_device("sigmoid_gate_backward", {&x, &g, &dy, &dx, &dg}) == Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    return cuda::sigmoid_gate_backward(ctx, x, g, dy, dx, dg);
#else
    no_cuda_backend("sigmoid_gate_backward");
#endif
  }
  cpu::sigmoid_gate_backward(ctx, x, g, dy, dx, dg);
}

}  // namespace mt::ops
