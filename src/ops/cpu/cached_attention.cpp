#include "ops/cached_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "core/arena.h"
#include "ops/cpu/attention.h"
#include "ops/indexer.h"

namespace mt::ops::cpu {

void cached_attention_forward(Context& ctx, const CachedAttentionParams& p, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& positions,
                              const Tensor& indices, Tensor& o) {
  const int64_t n = p.tokens, H = p.heads, Dqk = p.qk_dim, Dv = p.v_dim, cached = p.cached;
  const bool listed = indices.defined();
  const int64_t slots = listed ? p.kmax : 0;
  const float* pq = q.f32();
  const float* pk = k.f32();
  const float* pv = v.f32();
  const int32_t* pos = positions.i32();
  const int32_t* pi = listed ? indices.i32() : nullptr;
  float* po = o.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static) collapse(2)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < H; ++h) {
      // Slot j of row i: a listed position, or j itself over the causal range.
      const int64_t count = listed ? slots : static_cast<int64_t>(pos[i]) + 1;
      auto key = [&](int64_t j) -> int64_t { return listed ? pi[i * slots + j] : j; };
      const float* qr = pq + (i * H + h) * Dqk;
      float* orow = po + (i * H + h) * Dv;
      for (int64_t e = 0; e < Dv; ++e) orow[e] = 0.f;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < count; ++j) {
        const int64_t s = key(j);
        if (s < 0 || s >= cached) continue;
        m = std::max(m, p.scale * dotf(qr, pk + (s * H + h) * Dqk, Dqk));
      }
      if (m == -std::numeric_limits<float>::infinity()) continue;
      float sum = 0.f;
      for (int64_t j = 0; j < count; ++j) {
        const int64_t s = key(j);
        if (s < 0 || s >= cached) continue;
        const float w = std::exp(p.scale * dotf(qr, pk + (s * H + h) * Dqk, Dqk) - m);
        sum += w;
        for (int64_t e = 0; e < Dv; ++e) orow[e] += w * pv[(s * H + h) * Dv + e];
      }
      for (int64_t e = 0; e < Dv; ++e) orow[e] /= sum;
    }
}

void cached_indexer_topk(Context& ctx, const CachedIndexerParams& p, const Tensor& q,
                         const Tensor& k, const Tensor& w, const Tensor& positions, Tensor& out) {
  const int64_t n = p.tokens, HI = p.heads, DI = p.head_dim, topk = p.topk;
  const float scale = IndexerParams{.head_dim = DI, .scale = p.scale}.eff_scale();
  const float* pq = q.f32();
  const float* pk = k.f32();
  const float* pw = w.f32();
  const int32_t* pos = positions.i32();
  int32_t* po = out.i32();
  const int nt = ctx.threads();
  // Per-thread candidate lists from the workspace, as ops::topk_select keeps them.
  ArenaScope scope(ctx.workspace());
  Tensor lists = ctx.workspace().alloc({nt, p.cached}, DType::I64);  // one ScoredPos per 8 bytes
#pragma omp parallel num_threads(nt)
  {
    ScoredPos* cand = reinterpret_cast<ScoredPos*>(lists.i64()) + omp_get_thread_num() * p.cached;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const int32_t count = pos[i] + 1;  // the entry checked pos[i] < cached
      for (int32_t s = 0; s < count; ++s) {
        float acc = 0.f;
        for (int64_t h = 0; h < HI; ++h)
          acc += pw[i * HI + h] * std::max(0.f, dotf(pq + (i * HI + h) * DI, pk + s * DI, DI));
        cand[s] = ScoredPos{acc * scale, s};
      }
      select_topk_row(std::span<ScoredPos>(cand, static_cast<size_t>(count)), topk, po + i * topk);
    }
  }
}

}  // namespace mt::ops::cpu
