#include "ops/activation.h"

#include <cmath>

namespace mt::ops::cpu {

void silu_forward(Context& ctx, const Tensor& x, Tensor& y) {
  const float* px = x.f32();
  float* py = y.f32();
  const int64_t n = x.numel();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < n; ++i) py[i] = px[i] * sigmoidf(px[i]);
}

void silu_backward(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx) {
  const float* px = x.f32();
  const float* pdy = dy.f32();
  float* pdx = dx.f32();
  const int64_t n = x.numel();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float s = sigmoidf(px[i]);
    pdx[i] = pdy[i] * s * (1.0f + px[i] * (1.0f - s));
  }
}

void swiglu_forward(Context& ctx, const Tensor& gate, const Tensor& up, Tensor& y) {
  const float* g = gate.f32();
  const float* u = up.f32();
  float* py = y.f32();
  const int64_t n = gate.numel();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < n; ++i) py[i] = g[i] * sigmoidf(g[i]) * u[i];
}

void swiglu_backward(Context& ctx, const Tensor& gate, const Tensor& up, const Tensor& dy,
                     Tensor& dgate, Tensor& dup) {
  const float* g = gate.f32();
  const float* u = up.f32();
  const float* pdy = dy.f32();
  float* dg = dgate.f32();
  float* du = dup.f32();
  const int64_t n = gate.numel();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float s = sigmoidf(g[i]);
    du[i] = pdy[i] * g[i] * s;
    dg[i] = pdy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
  }
}

void sigmoid_gate_forward(Context& ctx, const Tensor& x, const Tensor& g, Tensor& y) {
  const float* px = x.f32();
  const float* pg = g.f32();
  float* py = y.f32();
  const int64_t n = x.numel();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < n; ++i) py[i] = px[i] * sigmoidf(pg[i]);
}

void sigmoid_gate_backward(Context& ctx, const Tensor& x, const Tensor& g, const Tensor& dy,
                           Tensor& dx, Tensor& dg) {
  const float* px = x.f32();
  const float* pg = g.f32();
  const float* pdy = dy.f32();
  float* pdx = dx.f32();
  float* pdg = dg.f32();
  const int64_t n = x.numel();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float s = sigmoidf(pg[i]);
    pdx[i] = pdy[i] * s;
    pdg[i] = pdy[i] * px[i] * s * (1.0f - s);
  }
}

}  // namespace mt::ops::cpu
