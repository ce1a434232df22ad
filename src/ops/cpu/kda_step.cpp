#include <cmath>
#include <vector>

#include "ops/kda_step.h"

namespace mt::ops::cpu {

void kda_recurrent_step(Context& ctx, const KdaStepParams& p, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& g, const Tensor& beta, Tensor& state,
                        Tensor& o) {
  const int64_t n = p.tokens, H = p.heads, K = p.head_k, V = p.head_v;
  const float scale = p.qk_scale();
  const float* pq = q.f32();
  const float* pk = k.f32();
  const float* pv = v.f32();
  const float* pg = g.f32();
  const float* pb = beta.f32();
  float* ps = state.f32();
  float* po = o.f32();
  // Heads are independent; within a head the tokens are sequential.
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t h = 0; h < H; ++h) {
    float* S = ps + h * K * V;
    std::vector<float> u(static_cast<size_t>(V));
    for (int64_t t = 0; t < n; ++t) {
      const int64_t r = t * H + h;
      const float* kr = pk + r * K;
      for (int64_t i = 0; i < K; ++i) {
        const float d = std::exp(pg[r * K + i]);
        for (int64_t j = 0; j < V; ++j) S[i * V + j] *= d;
      }
      for (int64_t j = 0; j < V; ++j) u[j] = pv[r * V + j];
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) u[j] -= S[i * V + j] * kr[i];
      for (int64_t i = 0; i < K; ++i) {
        const float bk = pb[r] * kr[i];
        for (int64_t j = 0; j < V; ++j) S[i * V + j] += bk * u[j];
      }
      float* orow = po + r * V;
      for (int64_t j = 0; j < V; ++j) orow[j] = 0.f;
      for (int64_t i = 0; i < K; ++i) {
        const float sq = scale * pq[r * K + i];
        for (int64_t j = 0; j < V; ++j) orow[j] += S[i * V + j] * sq;
      }
    }
  }
}

}  // namespace mt::ops::cpu
