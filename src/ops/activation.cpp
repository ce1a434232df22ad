#include "ops/activation.h"

#include <initializer_list>

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

// Every operand of these elementwise ops has the first one's shape.
void same_shapes(const char* what, const Tensor& first, std::initializer_list<const Tensor*> rest) {
  for (const Tensor* t : rest)
    MT_CHECK(first.shape() == t->shape(), ShapeError, what, ": ", first.shape(), " vs ",
             t->shape());
}

// swiglu and sigmoid_gate: x gated by g elementwise, every operand of one shape.
template <typename F>
void gate_forward(Context& ctx, const OpBodies<F>& op, const char* what, const Tensor& x,
                  const Tensor& g, Tensor& y) {
  same_shapes(what, x, {&g, &y});
  dispatch(op, {&x, &g, &y}, ctx, x, g, y);
}

template <typename F>
void gate_backward(Context& ctx, const OpBodies<F>& op, const char* what, const Tensor& x,
                   const Tensor& g, const Tensor& dy, Tensor& dx, Tensor& dg) {
  same_shapes(what, x, {&g, &dy, &dx, &dg});
  dispatch(op, {&x, &g, &dy, &dx, &dg}, ctx, x, g, dy, dx, dg);
}

}  // namespace

void silu_forward(Context& ctx, const Tensor& x, Tensor& y) {
  same_shapes("silu", x, {&y});
  dispatch(MT_OP_BODIES(silu_forward), {&x, &y}, ctx, x, y);
}

void silu_backward(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx) {
  same_shapes("silu backward", x, {&dy, &dx});
  dispatch(MT_OP_BODIES(silu_backward), {&x, &dy, &dx}, ctx, x, dy, dx);
}

void swiglu_forward(Context& ctx, const Tensor& gate, const Tensor& up, Tensor& y) {
  gate_forward(ctx, MT_OP_BODIES(swiglu_forward), "swiglu", gate, up, y);
}

void swiglu_backward(Context& ctx, const Tensor& gate, const Tensor& up, const Tensor& dy,
                     Tensor& dgate, Tensor& dup) {
  gate_backward(ctx, MT_OP_BODIES(swiglu_backward), "swiglu backward", gate, up, dy, dgate, dup);
}

void sigmoid_gate_forward(Context& ctx, const Tensor& x, const Tensor& g, Tensor& y) {
  gate_forward(ctx, MT_OP_BODIES(sigmoid_gate_forward), "sigmoid_gate", x, g, y);
}

void sigmoid_gate_backward(Context& ctx, const Tensor& x, const Tensor& g, const Tensor& dy,
                           Tensor& dx, Tensor& dg) {
  gate_backward(ctx, MT_OP_BODIES(sigmoid_gate_backward), "sigmoid_gate backward", x, g, dy, dx,
                dg);
}

}  // namespace mt::ops
