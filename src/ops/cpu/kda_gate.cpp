#include "ops/kda_gate.h"

#include <algorithm>
#include <cmath>

#include "core/arena.h"
#include "ops/activation.h"

namespace mt::ops::cpu {

namespace {

inline float softplus(float x) {
  return x > 20.f ? x : std::log1p(std::exp(x));
}
// Derivative of the thresholded softplus (exactly 1 where it is the identity).
inline float softplus_grad(float x) {
  return x > 20.f ? 1.f : sigmoidf(x);
}

// Channels per parallel work item: wide enough for contiguous row segments, narrow enough to
// spread hidden sizes of a few hundred over the threads.
constexpr int64_t kChannelBlock = 64;

}  // namespace

void kda_gate_forward(Context& ctx, const KdaGateParams& p, const Tensor& raw, const Tensor& a_log,
                      const Tensor& dt_bias, Tensor& g) {
  const int64_t n = p.heads * p.head_dim, kd = p.head_dim;
  const float* x = raw.f32();
  const float* al = a_log.f32();
  const float* db = dt_bias.f32();
  float* y = g.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t c = 0; c < n; ++c)
      y[t * n + c] = -std::exp(al[c / kd]) * softplus(x[t * n + c] + db[c]);
}

void kda_gate_backward(Context& ctx, const KdaGateParams& p, const Tensor& raw, const Tensor& a_log,
                       const Tensor& dt_bias, const Tensor& dg, Tensor& draw, Tensor& da_log,
                       Tensor& ddt_bias) {
  const bool want_a = da_log.defined(), want_dt = ddt_bias.defined();
  const int64_t n = p.heads * p.head_dim, kd = p.head_dim;
  const float* x = raw.f32();
  const float* al = a_log.f32();
  const float* db = dt_bias.f32();
  const float* pdg = dg.f32();
  float* pdx = draw.f32();

  // Each thread owns whole channel blocks, so the column sums (ddt_bias, and per channel the
  // dA_log terms) need no cross-thread reduction and are deterministic.
  ArenaScope scope(ctx.workspace());
  Tensor part = ctx.workspace().alloc({2, n});
  float* sum_dx = part.f32();
  float* sum_a = sum_dx + n;
  const int64_t blocks = (n + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kChannelBlock, c1 = std::min(n, c0 + kChannelBlock);
    for (int64_t c = c0; c < c1; ++c) sum_dx[c] = sum_a[c] = 0.f;
    for (int64_t t = 0; t < p.tokens; ++t) {
      for (int64_t c = c0; c < c1; ++c) {
        const float a = std::exp(al[c / kd]);
        const float u = x[t * n + c] + db[c];
        const float d = pdg[t * n + c];
        const float dx = -a * softplus_grad(u) * d;
        pdx[t * n + c] = dx;
        sum_dx[c] += dx;
        // dg/dA_log = g itself.
        sum_a[c] += -a * softplus(u) * d;
      }
    }
  }
  if (want_dt) {
    float* pdt = ddt_bias.f32();
    for (int64_t c = 0; c < n; ++c) pdt[c] += sum_dx[c];
  }
  if (want_a) {
    float* pda = da_log.f32();
    for (int64_t h = 0; h < p.heads; ++h) {
      float s = 0.f;
      for (int64_t c = h * kd; c < (h + 1) * kd; ++c) s += sum_a[c];
      pda[h] += s;
    }
  }
}

}  // namespace mt::ops::cpu
