#include "ops/moe_dispatch.h"

#include <algorithm>

namespace mt::ops::cpu {

void moe_dispatch_plan(Context&, const Tensor& ids, int64_t experts, Tensor& perm, Tensor& inv,
                       Tensor& offsets) {
  const int64_t n = ids.numel();
  const int32_t* pid = ids.i32();
  int32_t* off = offsets.i32();
  int32_t* pp = perm.i32();
  int32_t* pi = inv.i32();
  std::fill(off, off + experts + 1, 0);
  for (int64_t s = 0; s < n; ++s) {
    ++off[pid[s] + 1];
  }
  for (int64_t e = 0; e < experts; ++e) off[e + 1] += off[e];
  // Counting sort: one pass in slot order keeps the slots of an expert in slot order (stable).
  // off[e] serves as expert e's cursor and ends at the start of expert e + 1; shift it back.
  for (int64_t s = 0; s < n; ++s) {
    const int32_t row = off[pid[s]]++;
    pp[row] = static_cast<int32_t>(s);
    pi[s] = row;
  }
  for (int64_t e = experts; e > 0; --e) off[e] = off[e - 1];
  off[0] = 0;
}

void moe_gather(Context& ctx, const Tensor& x, const Tensor& perm, int64_t top_k, Tensor& rows) {
  const int64_t n = rows.dim(0), w = rows.dim(1);
  const float* px = x.f32();
  const int32_t* pp = perm.i32();
  float* pr = rows.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t r = 0; r < n; ++r) std::copy_n(px + (pp[r] / top_k) * w, w, pr + r * w);
}

void moe_gather_backward(Context& ctx, const Tensor& drows, const Tensor& inv, int64_t top_k,
                         Tensor& dx, bool accumulate) {
  const int64_t T = dx.dim(0), w = dx.dim(1);
  const float* pd = drows.f32();
  const int32_t* pi = inv.i32();
  float* px = dx.f32();
  // Per token, through inv: every dx row has one writer, so no atomics are needed.
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    float* o = px + t * w;
    if (!accumulate) std::fill(o, o + w, 0.0f);
    for (int64_t j = 0; j < top_k; ++j) {
      const float* src = pd + static_cast<int64_t>(pi[t * top_k + j]) * w;
      for (int64_t c = 0; c < w; ++c) o[c] += src[c];
    }
  }
}

void moe_combine(Context& ctx, const Tensor& rows, const Tensor& weights, const Tensor& inv,
                 Tensor& y) {
  const int64_t T = y.dim(0), w = y.dim(1), K = weights.dim(1);
  const float* pr = rows.f32();
  const float* pw = weights.f32();
  const int32_t* pi = inv.i32();
  float* py = y.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    float* o = py + t * w;
    std::fill(o, o + w, 0.0f);
    for (int64_t j = 0; j < K; ++j) {
      const float a = pw[t * K + j];
      const float* src = pr + static_cast<int64_t>(pi[t * K + j]) * w;
      for (int64_t c = 0; c < w; ++c) o[c] += a * src[c];
    }
  }
}

void moe_combine_backward(Context& ctx, const Tensor& rows, const Tensor& weights,
                          const Tensor& inv, const Tensor& dy, Tensor& drows, Tensor& dweights) {
  const int64_t T = dy.dim(0), w = dy.dim(1), K = weights.dim(1);
  const float* pr = rows.f32();
  const float* pw = weights.f32();
  const int32_t* pi = inv.i32();
  const float* pdy = dy.f32();
  float* pdr = drows.f32();
  float* pdw = dweights.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = pdy + t * w;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t r = pi[t * K + j];
      const float a = pw[t * K + j];
      const float* src = pr + r * w;
      float* d = pdr + r * w;
      double dot = 0;
      for (int64_t c = 0; c < w; ++c) {
        dot += static_cast<double>(g[c]) * src[c];
        d[c] = a * g[c];
      }
      pdw[t * K + j] = static_cast<float>(dot);
    }
  }
}

}  // namespace mt::ops::cpu
