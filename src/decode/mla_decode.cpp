// MlaLayer / DsaLayer decoding: the forwards of mla_layer.cpp and dsa_layer.cpp for n tokens that
// continue a document whose keys, values (and DSA indexer keys) are cached.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "decode/decode.h"
#include "model/dsa_layer.h"
#include "ops/indexer.h"

namespace mt {

namespace {

// Softmax attention of n queries over cached keys: o[i, h] = sum_j p_j v[idx[i, j], h]. The
// ops::attention kernel wants queries and keys of one packed batch, which a cache is not.
void cached_attention(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& idx, int64_t cached, float scale, Tensor& o) {
  const int64_t n = q.dim(0), H = q.dim(1), Dqk = q.dim(2), Dv = v.dim(2), slots = idx.dim(1);
  const float* pq = q.f32();
  const float* pk = k.f32();
  const float* pv = v.f32();
  const int32_t* pi = idx.i32();
  float* po = o.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static) collapse(2)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < H; ++h) {
      const float* qr = pq + (i * H + h) * Dqk;
      float* orow = po + (i * H + h) * Dv;
      for (int64_t e = 0; e < Dv; ++e) orow[e] = 0.f;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < slots; ++j) {
        const int32_t s = pi[i * slots + j];
        if (s < 0 || s >= cached) continue;
        float dot = 0.f;
        for (int64_t e = 0; e < Dqk; ++e) dot += qr[e] * pk[(s * H + h) * Dqk + e];
        m = std::max(m, scale * dot);
      }
      if (m == -std::numeric_limits<float>::infinity()) continue;
      float sum = 0.f;
      for (int64_t j = 0; j < slots; ++j) {
        const int32_t s = pi[i * slots + j];
        if (s < 0 || s >= cached) continue;
        float dot = 0.f;
        for (int64_t e = 0; e < Dqk; ++e) dot += qr[e] * pk[(s * H + h) * Dqk + e];
        const float p = std::exp(scale * dot - m);
        sum += p;
        for (int64_t e = 0; e < Dv; ++e) orow[e] += p * pv[(s * H + h) * Dv + e];
      }
      for (int64_t e = 0; e < Dv; ++e) orow[e] /= sum;
    }
}

// Row i: positions 0 .. positions[i] (all cached), the dense causal set.
Tensor causal_rows(Arena& ws, const Tensor& positions, int64_t slots) {
  const int64_t n = positions.dim(0);
  Tensor idx = ws.alloc({n, slots}, DType::I32);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < slots; ++j)
      idx.i32()[i * slots + j] = j <= positions.i32()[i] ? static_cast<int32_t>(j) : -1;
  return idx;
}

}  // namespace

Tensor MlaLayer::decode_select(Context& ctx, AttnDecodeState& st, const Tensor&, const Tensor&,
                               const Tensor& positions) {
  return causal_rows(ctx.workspace(), positions, st.len + positions.dim(0));
}

void MlaLayer::decode_step(Context& ctx, AttnDecodeState& st, const Tensor& x, Tensor& y) {
  const int64_t n = x.dim(0), d = cfg_.hidden, H = cfg_.heads, Dqk = qk_dim(), Dv = cfg_.v_head_dim,
                pos0 = st.len;
  expect_shape(x, {n, d}, "mla decode x");
  expect_shape(y, {n, d}, "mla decode y");
  MT_CHECK(pos0 + n <= st.capacity, ValueError, "decode: ", pos0 + n,
           " tokens exceed the KV cache capacity ", st.capacity);
  Arena& ws = ctx.workspace();
  ArenaScope scope(ws);
  Saved s;  // what a training forward would keep; decoding discards it
  Tensor positions = ws.alloc({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i) positions.i32()[i] = static_cast<int32_t>(pos0 + i);

  // The new keys and values go straight into the cache rows.
  Tensor q = ws.alloc({n, H, Dqk});
  project_q(ctx, x, positions, q, ws, s);
  Tensor k_new = st.k.rows(pos0, pos0 + n), v_new = st.v.rows(pos0, pos0 + n);
  project_kv(ctx, x, positions, k_new, v_new, ws, s);

  // Attention over the selected cached positions (the new ones included, causally).
  Tensor idx = decode_select(ctx, st, x, s.cqn, positions);
  Tensor o = ws.alloc({n, H, Dv});
  cached_attention(ctx, q, st.k, st.v, idx, pos0 + n, softmax_scale(), o);
  st.len = pos0 + n;

  project_out(ctx, x, o.view({n, H * Dv}), y, ws, s);
}

Tensor DsaLayer::decode_select(Context& ctx, AttnDecodeState& st, const Tensor& x,
                               const Tensor& cqn, const Tensor& positions) {
  const int64_t n = x.dim(0), HI = dcfg_.index_heads, DI = dcfg_.index_head_dim, pos0 = st.len,
                cached = pos0 + n;
  Arena& ws = ctx.workspace();
  expect_shape(st.index_k, {st.capacity, DI}, "dsa decode indexer key cache");

  // Indexer keys of the new tokens, into the cache; queries and head weights.
  Tensor qi = ws.alloc({n, HI * DI}), w = ws.alloc({n, HI});
  Tensor kn_new = st.index_k.rows(pos0, cached);
  Saved discarded;  // what a training forward would keep
  project_indexer(ctx, x, cqn, positions, qi, kn_new, w, ws, discarded);
  if (dcfg_.dense_warmup) return causal_rows(ws, positions, cached);
  const Tensor kn = st.index_k.rows(0, cached);

  // Scores of every cached causal position, then the top-k.
  Tensor scores = ws.alloc({n, cached});
  const float scale = ops::IndexerParams{.head_dim = DI}.eff_scale();
  const float* pq = qi.f32();
  const float* pk = kn.f32();
  const float* pw = w.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t s = 0; s < cached; ++s) {
      float acc = 0.f;
      if (s <= positions.i32()[i]) {
        for (int64_t h = 0; h < HI; ++h) {
          float dot = 0.f;
          for (int64_t e = 0; e < DI; ++e) dot += pq[(i * HI + h) * DI + e] * pk[s * DI + e];
          acc += pw[i * HI + h] * std::max(0.f, dot);
        }
        acc *= scale;
      }
      scores.f32()[i * cached + s] = acc;
    }
  // ops::topk_select takes candidates of a packed batch (positions below its row count), so the
  // same rule is applied here: larger score first, ties to the lower position, output ascending.
  const int64_t topk = dcfg_.index_topk;
  Tensor idx = ws.alloc({n, topk}, DType::I32);
  std::vector<std::pair<float, int32_t>> buf;
  for (int64_t i = 0; i < n; ++i) {
    buf.clear();
    for (int32_t s = 0; s <= positions.i32()[i]; ++s)
      buf.emplace_back(scores.f32()[i * cached + s], s);
    const size_t keff = std::min(buf.size(), static_cast<size_t>(topk));
    std::partial_sort(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(keff), buf.end(),
                      [](const auto& a, const auto& b) {
                        return a.first > b.first || (a.first == b.first && a.second < b.second);
                      });
    int32_t* row = idx.i32() + i * topk;
    for (size_t j = 0; j < keff; ++j) row[j] = buf[j].second;
    std::sort(row, row + keff);
    for (int64_t j = static_cast<int64_t>(keff); j < topk; ++j) row[j] = -1;
  }
  return idx;
}

}  // namespace mt
