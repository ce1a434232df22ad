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

namespace {

// expand_heads' two sides, strided views both: x [T, D] (the gradient dx alike) and y [T, H, D]
// (dy alike), y[t, h, i] = x[t, i].
struct ExpandIndex {
  int64_t T, H, D;
  int64_t xs0, xs1, ys0, ys1, ys2;
  ExpandIndex(const Tensor& x, const Tensor& y)
      : T(y.dim(0)),
        H(y.dim(1)),
        D(y.dim(2)),
        xs0(x.stride(0)),
        xs1(x.stride(1)),
        ys0(y.stride(0)),
        ys1(y.stride(1)),
        ys2(y.stride(2)) {}
  int64_t x(int64_t t, int64_t i) const { return t * xs0 + i * xs1; }
  int64_t y(int64_t t, int64_t h, int64_t i) const { return t * ys0 + h * ys1 + i * ys2; }
};

}  // namespace

void expand_heads_forward(Context& ctx, const Tensor& x, Tensor& y) {
  const ExpandIndex ix(x, y);
  const float* px = x.f32_strided();
  float* py = y.f32_strided();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t t = 0; t < ix.T; ++t)
    for (int64_t h = 0; h < ix.H; ++h)
      for (int64_t i = 0; i < ix.D; ++i) py[ix.y(t, h, i)] = px[ix.x(t, i)];
}

void expand_heads_backward(Context& ctx, const Tensor& dy, Tensor& dx) {
  const ExpandIndex ix(dx, dy);
  const float* py = dy.f32_strided();
  float* px = dx.f32_strided();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t t = 0; t < ix.T; ++t)
    for (int64_t i = 0; i < ix.D; ++i) {
      float s = 0.f;
      for (int64_t h = 0; h < ix.H; ++h) s += py[ix.y(t, h, i)];
      px[ix.x(t, i)] = s;
    }
}

}  // namespace mt::ops::cpu
