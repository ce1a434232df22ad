#include "ops/pos_embed.h"

#include <algorithm>

namespace mt::ops::cpu {

void pos_embed_forward(Context& ctx, const PosEmbedParams& p, const Tensor& idx, const Tensor& wts,
                       const Tensor& table, const Tensor& x, Tensor& y) {
  const int64_t D = p.dim, K = p.taps();
  const int32_t* pi = idx.i32();
  const float* pw = wts.f32();
  const float* tab = table.f32();
  const float* px = x.f32();
  float* py = y.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t n = 0; n < p.patches; ++n) {
    float* row = py + n * D;
    if (row != px + n * D) std::copy(px + n * D, px + (n + 1) * D, row);
    for (int64_t k = 0; k < K; ++k) {
      const float w = pw[n * K + k];
      const float* t = tab + static_cast<int64_t>(pi[n * K + k]) * D;
      for (int64_t d = 0; d < D; ++d) row[d] += w * t[d];
    }
  }
}

void pos_embed_backward(Context& ctx, const PosEmbedParams& p, const Tensor& idx, const Tensor& wts,
                        const Tensor& dy, Tensor& dtable) {
  const int64_t D = p.dim, K = p.taps();
  const int32_t* pi = idx.i32();
  const float* pw = wts.f32();
  const float* pdy = dy.f32();
  float* dt = dtable.f32();
  // Many patches share a table row: threads split the columns, so every element has one writer
  // and the sum runs in patch order (deterministic).
  constexpr int64_t kBlock = 32;
  const int64_t blocks = (D + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t d0 = b * kBlock, d1 = std::min(D, d0 + kBlock);
    for (int64_t n = 0; n < p.patches; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const float w = pw[n * K + k];
        float* t = dt + static_cast<int64_t>(pi[n * K + k]) * D;
        for (int64_t d = d0; d < d1; ++d) t[d] += w * pdy[n * D + d];
      }
  }
}

}  // namespace mt::ops::cpu
