#include "ops/cached_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

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
        float dot = 0.f;
        for (int64_t e = 0; e < Dqk; ++e) dot += qr[e] * pk[(s * H + h) * Dqk + e];
        m = std::max(m, p.scale * dot);
      }
      if (m == -std::numeric_limits<float>::infinity()) continue;
      float sum = 0.f;
      for (int64_t j = 0; j < count; ++j) {
        const int64_t s = key(j);
        if (s < 0 || s >= cached) continue;
        float dot = 0.f;
        for (int64_t e = 0; e < Dqk; ++e) dot += qr[e] * pk[(s * H + h) * Dqk + e];
        const float w = std::exp(p.scale * dot - m);
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
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    std::vector<std::pair<float, int32_t>> cand;
    cand.reserve(static_cast<size_t>(pos[i]) + 1);
    for (int32_t s = 0; s <= pos[i]; ++s) {
      float acc = 0.f;
      for (int64_t h = 0; h < HI; ++h) {
        float dot = 0.f;
        for (int64_t e = 0; e < DI; ++e) dot += pq[(i * HI + h) * DI + e] * pk[s * DI + e];
        acc += pw[i * HI + h] * std::max(0.f, dot);
      }
      cand.emplace_back(acc * scale, s);
    }
    // Larger score first, ties to the lower position: the rule of ops::topk_select.
    const size_t keff = std::min(cand.size(), static_cast<size_t>(topk));
    std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(keff), cand.end(),
                      [](const auto& a, const auto& b) {
                        return a.first > b.first || (a.first == b.first && a.second < b.second);
                      });
    int32_t* row = po + i * topk;
    for (size_t j = 0; j < keff; ++j) row[j] = cand[j].second;
    std::sort(row, row + keff);
    for (int64_t j = static_cast<int64_t>(keff); j < topk; ++j) row[j] = -1;
  }
}

}  // namespace mt::ops::cpu
