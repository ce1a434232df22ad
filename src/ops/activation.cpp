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
  dispatch(MT_OP_BODIES(silu_forward), {&x, &y}, ctx, x, y);
}

void silu_backward(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx) {
  same_shape(x, dy, "silu backward");
  same_shape(x, dx, "silu backward");
  dispatch(MT_OP_BODIES(silu_backward), {&x, &dy, &dx}, ctx, x, dy, dx);
}

void swiglu_forward(Context& ctx, const Tensor& gate, const Tensor& up, Tensor& y) {
  same_shape(gate, up, "swiglu");
  same_shape(gate, y, "swiglu");
  dispatch(MT_OP_BODIES(swiglu_forward), {&gate, &up, &y}, ctx, gate, up, y);
}

void swiglu_backward(Context& ctx, const Tensor& gate, const Tensor& up, const Tensor& dy,
                     Tensor& dgate, Tensor& dup) {
  same_shape(gate, up, "swiglu backward");
  same_shape(gate, dy, "swiglu backward");
  same_shape(gate, dgate, "swiglu backward");
  same_shape(gate, dup, "swiglu backward");
  dispatch(MT_OP_BODIES(swiglu_backward), {&gate, &up, &dy, &dgate, &dup}, ctx, gate, up, dy, dgate,
           dup);
}

void sigmoid_gate_forward(Context& ctx, const Tensor& x, const Tensor& g, Tensor& y) {
  same_shape(x, g, "sigmoid_gate");
  same_shape(x, y, "sigmoid_gate");
  dispatch(MT_OP_BODIES(sigmoid_gate_forward), {&x, &g, &y}, ctx, x, g, y);
}

void sigmoid_gate_backward(Context& ctx, const Tensor& x, const Tensor& g, const Tensor& dy,
                           Tensor& dx, Tensor& dg) {
  same_shape(x, g, "sigmoid_gate backward");
  same_shape(x, dy, "sigmoid_gate backward");
  same_shape(x, dx, "sigmoid_gate backward");
  same_shape(x, dg, "sigmoid_gate backward");
  dispatch(MT_OP_BODIES(sigmoid_gate_backward), {&x, &g, &dy, &dx, &dg}, ctx, x, g, dy, dx, dg);
}

}  // namespace mt::ops
