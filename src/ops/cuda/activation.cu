// Element-wise activations on the GPU: one thread per element, fp32 math in any storage type.
#include "ops/activation.h"
#include "ops/cuda/common.cuh"

namespace mt::ops::cuda {

namespace {

__device__ __forceinline__ float sigm(float x) {
  return 1.f / (1.f + __expf(-x));
}

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
    const T* px = ptr<T>(x);
    T* py = ptr<T>(y);
    for_each_index(ctx, x.numel(), [=] __device__(int64_t i) {
      const float v = ld(px, i);
      st(py, i, v * sigm(v));
    });
  });
}

void silu_backward(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx) {
  same("silu", x, {&dy, &dx});
  MT_DISPATCH_FLOAT(x, "silu", {
    const T* px = ptr<T>(x);
    const T* pdy = ptr<T>(dy);
    T* pdx = ptr<T>(dx);
    for_each_index(ctx, x.numel(), [=] __device__(int64_t i) {
      const float v = ld(px, i), s = sigm(v);
      st(pdx, i, ld(pdy, i) * s * (1.f + v * (1.f - s)));
    });
  });
}

void swiglu_forward(Context& ctx, const Tensor& gate, const Tensor& up, Tensor& y) {
  same("swiglu", gate, {&up, &y});
  MT_DISPATCH_FLOAT(gate, "swiglu", {
    const T* pg = ptr<T>(gate);
    const T* pu = ptr<T>(up);
    T* py = ptr<T>(y);
    for_each_index(ctx, gate.numel(), [=] __device__(int64_t i) {
      const float g = ld(pg, i);
      st(py, i, g * sigm(g) * ld(pu, i));
    });
  });
}

void swiglu_backward(Context& ctx, const Tensor& gate, const Tensor& up, const Tensor& dy,
                     Tensor& dgate, Tensor& dup) {
  same("swiglu", gate, {&up, &dy, &dgate, &dup});
  MT_DISPATCH_FLOAT(gate, "swiglu", {
    const T* pg = ptr<T>(gate);
    const T* pu = ptr<T>(up);
    const T* pdy = ptr<T>(dy);
    T* pdg = ptr<T>(dgate);
    T* pdu = ptr<T>(dup);
    for_each_index(ctx, gate.numel(), [=] __device__(int64_t i) {
      const float g = ld(pg, i), s = sigm(g), d = ld(pdy, i);
      st(pdu, i, d * g * s);
      st(pdg, i, d * ld(pu, i) * s * (1.f + g * (1.f - s)));
    });
  });
}

void sigmoid_gate_forward(Context& ctx, const Tensor& x, const Tensor& g, Tensor& y) {
  same("sigmoid_gate", x, {&g, &y});
  MT_DISPATCH_FLOAT(x, "sigmoid_gate", {
    const T* px = ptr<T>(x);
    const T* pg = ptr<T>(g);
    T* py = ptr<T>(y);
    for_each_index(ctx, x.numel(),
                   [=] __device__(int64_t i) { st(py, i, ld(px, i) * sigm(ld(pg, i))); });
  });
}

void sigmoid_gate_backward(Context& ctx, const Tensor& x, const Tensor& g, const Tensor& dy,
                           Tensor& dx, Tensor& dg) {
  same("sigmoid_gate", x, {&g, &dy, &dx, &dg});
  MT_DISPATCH_FLOAT(x, "sigmoid_gate", {
    const T* px = ptr<T>(x);
    const T* pg = ptr<T>(g);
    const T* pdy = ptr<T>(dy);
    T* pdx = ptr<T>(dx);
    T* pdg = ptr<T>(dg);
    for_each_index(ctx, x.numel(), [=] __device__(int64_t i) {
      const float s = sigm(ld(pg, i)), d = ld(pdy, i);
      st(pdx, i, d * s);
      st(pdg, i, d * ld(px, i) * s * (1.f - s));
    });
  });
}

}  // namespace mt::ops::cuda
