// GELU (erf and tanh forms) on the GPU: one thread per element, fp32 math in any storage type,
// with the same formulas as the CPU body (ops/cpu/gelu.cpp).
#include "ops/cuda/common.cuh"
#include "ops/gelu.h"

namespace mt::ops::cuda {

namespace {

using namespace gelu_const;

void same(const Tensor& x, const Tensor& t, const char* what) {
  expect_same_dtype("gelu", x, t, what);
}

}  // namespace

void gelu_forward(Context& ctx, GeluKind kind, const Tensor& x, Tensor& y) {
  same(x, y, "y");
  const bool tanh_form = kind == GeluKind::Tanh;
  MT_DISPATCH_FLOAT(x, "gelu", {
    const T* px = ptr<T>(x);
    T* py = ptr<T>(y);
    for_each_index(ctx, x.numel(), [=] __device__(int64_t i) {
      const float v = ld(px, i);
      const float g = tanh_form ? 0.5f * v * (1.f + tanhf(kSqrt2OverPi * (v + kCubic * v * v * v)))
                                : 0.5f * v * (1.f + erff(v * kInvSqrt2));
      st(py, i, g);
    });
  });
}

void gelu_backward(Context& ctx, GeluKind kind, const Tensor& x, const Tensor& dy, Tensor& dx) {
  same(x, dy, "dy");
  same(x, dx, "dx");
  const bool tanh_form = kind == GeluKind::Tanh;
  MT_DISPATCH_FLOAT(x, "gelu", {
    const T* px = ptr<T>(x);
    const T* pdy = ptr<T>(dy);
    T* pdx = ptr<T>(dx);
    for_each_index(ctx, x.numel(), [=] __device__(int64_t i) {
      const float v = ld(px, i);
      float d;
      if (tanh_form) {
        const float t = tanhf(kSqrt2OverPi * (v + kCubic * v * v * v));
        const float dinner = kSqrt2OverPi * (1.f + 3.f * kCubic * v * v);
        d = 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * dinner;
      } else {
        d = 0.5f * (1.f + erff(v * kInvSqrt2)) + v * kInvSqrt2Pi * expf(-0.5f * v * v);
      }
      st(pdx, i, ld(pdy, i) * d);  // dx may be dy: read before the write
    });
  });
}

}  // namespace mt::ops::cuda
