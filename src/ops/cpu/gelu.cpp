#include "ops/gelu.h"

#include <cmath>

namespace mt::ops::cpu {

using namespace gelu_const;

void gelu_forward(Context& ctx, GeluKind kind, const Tensor& x, Tensor& y) {
  const float* px = x.f32();
  float* py = y.f32();
  const int64_t n = x.numel();
  if (kind == GeluKind::Tanh) {
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = px[i];
      py[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + kCubic * v * v * v)));
    }
  } else {
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
    for (int64_t i = 0; i < n; ++i) py[i] = 0.5f * px[i] * (1.0f + std::erf(px[i] * kInvSqrt2));
  }
}

void gelu_backward(Context& ctx, GeluKind kind, const Tensor& x, const Tensor& dy, Tensor& dx) {
  const float* px = x.f32();
  const float* pdy = dy.f32();
  float* pdx = dx.f32();
  const int64_t n = x.numel();
  if (kind == GeluKind::Tanh) {
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = px[i];
      const float t = std::tanh(kSqrt2OverPi * (v + kCubic * v * v * v));
      const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
      pdx[i] = pdy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner);
    }
  } else {
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = px[i];
      const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
      pdx[i] = pdy[i] * (cdf + v * kInvSqrt2Pi * std::exp(-0.5f * v * v));
    }
  }
}

}  // namespace mt::ops::cpu
