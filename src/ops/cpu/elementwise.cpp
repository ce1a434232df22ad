#include "ops/elementwise.h"

#include "ops/activation.h"

namespace mt::ops::cpu {

void add_into(Context& ctx, const Tensor& x, Tensor& acc) {
  const float* px = x.f32();
  float* pa = acc.f32();
  const int64_t n = x.numel();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < n; ++i) pa[i] += px[i];
}

void scale(Context& ctx, const Tensor& x, float s, Tensor& y) {
  const float* px = x.f32();
  float* py = y.f32();
  const int64_t n = x.numel();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < n; ++i) py[i] = s * px[i];
}

void sigmoid_forward(Context& ctx, const Tensor& x, Tensor& y) {
  const float* px = x.f32();
  float* py = y.f32();
  const int64_t n = x.numel();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < n; ++i) py[i] = sigmoidf(px[i]);
}

void sigmoid_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx) {
  const float* py = y.f32();
  const float* pd = dy.f32();
  float* px = dx.f32();
  const int64_t n = y.numel();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < n; ++i) px[i] = pd[i] * py[i] * (1.f - py[i]);
}

void copy(Context&, const Tensor& src, Tensor& dst) {
  dst.copy_from(src);
}

void expand_heads_forward(Context& ctx, const Tensor& x, Tensor& y) {
  const int64_t T = y.dim(0), H = y.dim(1), D = y.dim(2);
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1);
  const int64_t ys0 = y.stride(0), ys1 = y.stride(1), ys2 = y.stride(2);
  const float* px = x.f32_strided();
  float* py = y.f32_strided();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < D; ++i) py[t * ys0 + h * ys1 + i * ys2] = px[t * xs0 + i * xs1];
}

void expand_heads_backward(Context& ctx, const Tensor& dy, Tensor& dx) {
  const int64_t T = dy.dim(0), H = dy.dim(1), D = dy.dim(2);
  const int64_t xs0 = dx.stride(0), xs1 = dx.stride(1);
  const int64_t ys0 = dy.stride(0), ys1 = dy.stride(1), ys2 = dy.stride(2);
  const float* py = dy.f32_strided();
  float* px = dx.f32_strided();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i) {
      float s = 0.f;
      for (int64_t h = 0; h < H; ++h) s += py[t * ys0 + h * ys1 + i * ys2];
      px[t * xs0 + i * xs1] = s;
    }
}

}  // namespace mt::ops::cpu
