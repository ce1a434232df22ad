// Element-wise activations on the GPU: fp32 math in any storage type, 16-byte packs a thread where
// the bases allow (map_elements).
#include "ops/activation.h"
#include "ops/cuda/common.cuh"

namespace mt::ops::cuda {

namespace {

void same(const char* op, const Tensor& a, std::initializer_list<const Tensor*> rest) {
  for (const Tensor* t : rest) {
    expect_same_dtype(op, a, *t, "an operand");
    MT_CHECK(t->numel() == a.numel(), ShapeError, op, ": operands ", a.shape(), " and ", t->shape(),
             " differ");
  }
}

}  // namespace

void silu_forward(Context& ctx, const Tensor& x, Tensor& y) {
  same("silu", x, {&y});
  MT_DISPATCH_FLOAT(x, "silu", {
    map_elements<T, T, 1, 1>(
        ctx, x.numel(), {ptr<T>(x)}, {ptr<T>(y)},
        [] __device__(const float(&a)[1], float(&b)[1]) { b[0] = a[0] * sigm(a[0]); });
  });
}

void silu_backward(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx) {
  same("silu", x, {&dy, &dx});
  MT_DISPATCH_FLOAT(x, "silu", {
    map_elements<T, T, 2, 1>(
        ctx, x.numel(), {ptr<T>(x), ptr<T>(dy)}, {ptr<T>(dx)},
        [] __device__(const float(&a)[2], float(&b)[1]) { b[0] = silu_grad(a[0], a[1]); });
  });
}

void swiglu_forward(Context& ctx, const Tensor& gate, const Tensor& up, Tensor& y) {
  same("swiglu", gate, {&up, &y});
  MT_DISPATCH_FLOAT(gate, "swiglu", {
    map_elements<T, T, 2, 1>(
        ctx, gate.numel(), {ptr<T>(gate), ptr<T>(up)}, {ptr<T>(y)},
        [] __device__(const float(&a)[2], float(&b)[1]) { b[0] = a[0] * sigm(a[0]) * a[1]; });
  });
}

void swiglu_backward(Context& ctx, const Tensor& gate, const Tensor& up, const Tensor& dy,
                     Tensor& dgate, Tensor& dup) {
  same("swiglu", gate, {&up, &dy, &dgate, &dup});
  MT_DISPATCH_FLOAT(gate, "swiglu", {
    map_elements<T, T, 3, 2>(ctx, gate.numel(), {ptr<T>(gate), ptr<T>(up), ptr<T>(dy)},
                             {ptr<T>(dgate), ptr<T>(dup)},
                             [] __device__(const float(&a)[3], float(&b)[2]) {
                               const float g = a[0], s = sigm(g), d = a[2];
                               b[1] = d * g * s;
                               b[0] = d * a[1] * s * (1.f + g * (1.f - s));
                             });
  });
}

void sigmoid_gate_forward(Context& ctx, const Tensor& x, const Tensor& g, Tensor& y) {
  same("sigmoid_gate", x, {&g, &y});
  MT_DISPATCH_FLOAT(x, "sigmoid_gate", {
    map_elements<T, T, 2, 1>(
        ctx, x.numel(), {ptr<T>(x), ptr<T>(g)}, {ptr<T>(y)},
        [] __device__(const float(&a)[2], float(&b)[1]) { b[0] = a[0] * sigm(a[1]); });
  });
}

void sigmoid_gate_backward(Context& ctx, const Tensor& x, const Tensor& g, const Tensor& dy,
                           Tensor& dx, Tensor& dg) {
  same("sigmoid_gate", x, {&g, &dy, &dx, &dg});
  MT_DISPATCH_FLOAT(x, "sigmoid_gate", {
    map_elements<T, T, 3, 2>(ctx, x.numel(), {ptr<T>(x), ptr<T>(g), ptr<T>(dy)},
                             {ptr<T>(dx), ptr<T>(dg)},
                             [] __device__(const float(&a)[3], float(&b)[2]) {
                               const float s = sigm(a[1]), d = a[2];
                               b[0] = d * s;
                               b[1] = d * a[0] * s * (1.f - s);
                             });
  });
}

}  // namespace mt::ops::cuda
