#include "ops/embedding.h"

#include <algorithm>

namespace mt::ops::cpu {

void embedding_forward(Context& ctx, const EmbeddingParams& p, const Tensor& ids,
                       const Tensor& table, Tensor& y) {
  const int32_t* id = ids.i32();
  const float* tab = table.f32();
  float* py = y.f32();
  const int64_t dim = p.dim;
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t t = 0; t < p.tokens; ++t) {
    const float* src = tab + static_cast<int64_t>(id[t]) * dim;
    float* dst = py + t * dim;
    for (int64_t d = 0; d < dim; ++d) dst[d] = src[d];
  }
}

void embedding_backward(Context& ctx, const EmbeddingParams& p, const Tensor& ids, const Tensor& dy,
                        Tensor& dtable) {
  const int32_t* id = ids.i32();
  const float* pdy = dy.f32();
  float* dtab = dtable.f32();
  const int64_t dim = p.dim;
  // Repeated ids hit the same row, so threads split the embedding dimension, not the tokens.
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (dim + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t d0 = blk * kBlock, d1 = std::min(dim, d0 + kBlock);
    for (int64_t t = 0; t < p.tokens; ++t) {
      float* dst = dtab + static_cast<int64_t>(id[t]) * dim;
      const float* src = pdy + t * dim;
      for (int64_t d = d0; d < d1; ++d) dst[d] += src[d];
    }
  }
}

}  // namespace mt::ops::cpu
