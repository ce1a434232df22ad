#include "ops/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace mt::ops::cpu {

namespace {

// Row t lists its document's keys from the first up to t (causal) or to the last, then -1s.
void document_indices(const SeqInfo& seq, bool causal, Tensor& indices) {
  const int64_t kmax = indices.dim(1);
  int32_t* idx = indices.i32();
  for (size_t d = 0; d + 1 < seq.offsets.size(); ++d) {
    const int64_t b = seq.offsets[d], e = seq.offsets[d + 1];
    for (int64_t t = b; t < e; ++t) {
      int32_t* row = idx + t * kmax;
      int64_t j = 0;
      for (int64_t s = b; s < (causal ? t + 1 : e); ++s) row[j++] = static_cast<int32_t>(s);
      for (; j < kmax; ++j) row[j] = -1;
    }
  }
}

}  // namespace

void causal_indices(const SeqInfo& seq, Tensor& indices) {
  document_indices(seq, true, indices);
}

void full_indices(const SeqInfo& seq, Tensor& indices) {
  document_indices(seq, false, indices);
}

KeyLists build_key_lists(const Tensor& indices, int64_t tokens, Arena& arena) {
  const int64_t kmax = indices.dim(1);
  const int32_t* idx = indices.i32();
  KeyLists kl;
  kl.offsets = arena.zeros({tokens + 1}, DType::I64);
  int64_t* off = kl.offsets.i64();
  for (int64_t e = 0; e < tokens * kmax; ++e)
    if (valid_slot(idx[e], tokens)) ++off[idx[e] + 1];
  for (int64_t s = 0; s < tokens; ++s) off[s + 1] += off[s];
  kl.entries = arena.alloc({off[tokens]}, DType::I64);
  int64_t* ent = kl.entries.i64();
  // Fill with a moving cursor per key; slots are visited in increasing order, so each list is
  // sorted, which keeps the backward's summation order independent of threading.
  Tensor cursor = arena.alloc({tokens}, DType::I64);
  int64_t* cur = cursor.i64();
  std::copy(off, off + tokens, cur);
  for (int64_t e = 0; e < tokens * kmax; ++e)
    if (valid_slot(idx[e], tokens)) ent[cur[idx[e]]++] = e;
  return kl;
}

namespace {

// The keys a query row attends to, walked in order: an index-table row (unused slots give -1) ...
struct TableRows {
  const int32_t* idx;
  int64_t kmax, tokens;
  int64_t count(int64_t) const { return kmax; }
  int64_t key(int64_t t, int64_t j) const {
    const int32_t s = idx[t * kmax + j];
    return valid_slot(s, tokens) ? s : -1;
  }
};
// ... or its document's keys up to itself.
struct CausalRows {
  const int32_t* start;  // [T]: first token of each token's document
  int64_t count(int64_t t) const { return t - start[t] + 1; }
  int64_t key(int64_t t, int64_t j) const { return start[t] + j; }
};
// The queries that attend to a key, in increasing order: the transposed table's list ...
struct TableCols {
  const int64_t* off;
  const int64_t* ent;
  int64_t kmax;
  int64_t count(int64_t s) const { return off[s + 1] - off[s]; }
  int64_t query(int64_t s, int64_t i) const { return ent[off[s] + i] / kmax; }
};
// ... or the key's document from the key on.
struct CausalCols {
  const int32_t* end;  // [T]: one past the last token of each token's document
  int64_t count(int64_t s) const { return end[s] - s; }
  int64_t query(int64_t s, int64_t i) const { return s + i; }
};

// `slots`: the longest row (scratch per thread).
template <typename Rows>
void forward_rows(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                  const Tensor& v, const Rows& rows, int64_t slots, Tensor& o, Tensor& lse) {
  const int64_t T = p.tokens, H = p.heads, Hk = p.kvh(), G = H / Hk, Dk = p.qk_dim, Dv = p.v_dim;
  const float* pq = q.f32();
  const float* pk = k.f32();
  const float* pv = v.f32();
  float* po = o.f32();
  float* pl = lse.f32();
  const int nth = ctx.threads();
  const int64_t width = std::max<int64_t>(slots, 1);
  ArenaScope scope(ctx.workspace());
  Tensor scratch = ctx.workspace().alloc({static_cast<int64_t>(nth), width});
  float* sc_all = scratch.f32();
  const float scale = p.scale;

#pragma omp parallel for num_threads(nth) schedule(dynamic, 16)
  for (int64_t th = 0; th < T * H; ++th) {
    const int64_t t = th / H, h = th % H, g = h / G, n = rows.count(t);
    float* sc = sc_all + static_cast<int64_t>(omp_get_thread_num()) * width;
    const float* qr = pq + th * Dk;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      const int64_t s = rows.key(t, j);
      if (s < 0) continue;
      sc[j] = scale * dotf(qr, pk + (s * Hk + g) * Dk, Dk);
      m = std::max(m, sc[j]);
    }
    float* orow = po + th * Dv;
    std::fill(orow, orow + Dv, 0.f);
    if (m == -std::numeric_limits<float>::infinity()) {
      pl[th] = m;
      continue;
    }
    float sum = 0.f;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t s = rows.key(t, j);
      if (s < 0) continue;
      const float e = std::exp(sc[j] - m);
      sum += e;
      const float* vr = pv + (s * Hk + g) * Dv;
      for (int64_t d = 0; d < Dv; ++d) orow[d] += e * vr[d];
    }
    const float inv = 1.f / sum;
    for (int64_t d = 0; d < Dv; ++d) orow[d] *= inv;
    pl[th] = m + std::log(sum);
  }
}

// Pass 1, one (query, head) per iteration: Delta and dq (P recomputed from lse). Returns Delta,
// allocated from the workspace.
template <typename Rows>
Tensor backward_queries(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Rows& rows, const Tensor& o, const Tensor& lse,
                        const Tensor& dout, Tensor& dq) {
  const int64_t T = p.tokens, H = p.heads, Hk = p.kvh(), G = H / Hk, Dk = p.qk_dim, Dv = p.v_dim;
  const float* pq = q.f32();
  const float* pk = k.f32();
  const float* pv = v.f32();
  const float* po = o.f32();
  const float* pl = lse.f32();
  const float* pdo = dout.f32();
  float* pdq = dq.f32();
  const float scale = p.scale;
  Tensor delta_t = ctx.workspace().alloc({T, H});
  float* delta = delta_t.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(dynamic, 16)
  for (int64_t th = 0; th < T * H; ++th) {
    const int64_t t = th / H, h = th % H, g = h / G, n = rows.count(t);
    const float* qr = pq + th * Dk;
    const float* dor = pdo + th * Dv;
    const float dl = dotf(po + th * Dv, dor, Dv);
    delta[th] = dl;
    float* dqr = pdq + th * Dk;
    std::fill(dqr, dqr + Dk, 0.f);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t s = rows.key(t, j);
      if (s < 0) continue;
      const float* kr = pk + (s * Hk + g) * Dk;
      const float pr = std::exp(scale * dotf(qr, kr, Dk) - pl[th]);
      const float ds = pr * (dotf(dor, pv + (s * Hk + g) * Dv, Dv) - dl) * scale;
      for (int64_t d = 0; d < Dk; ++d) dqr[d] += ds * kr[d];
    }
  }
  return delta_t;
}

// Pass 2, one key position per iteration: dk and dv gathered over the queries that attend to it,
// so no two threads write the same row and no atomics are needed.
template <typename Cols>
void backward_keys(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                   const Tensor& v, const Cols& cols, const Tensor& lse, const Tensor& dout,
                   const Tensor& delta_t, Tensor& dk, Tensor& dv) {
  const int64_t T = p.tokens, H = p.heads, Hk = p.kvh(), G = H / Hk, Dk = p.qk_dim, Dv = p.v_dim;
  const float* pq = q.f32();
  const float* pk = k.f32();
  const float* pv = v.f32();
  const float* pl = lse.f32();
  const float* pdo = dout.f32();
  const float* delta = delta_t.f32();
  float* pdk = dk.f32();
  float* pdv = dv.f32();
  const float scale = p.scale;
#pragma omp parallel for num_threads(ctx.threads()) schedule(dynamic, 4)
  for (int64_t s = 0; s < T; ++s) {
    float* dks = pdk + s * Hk * Dk;
    float* dvs = pdv + s * Hk * Dv;
    std::fill(dks, dks + Hk * Dk, 0.f);
    std::fill(dvs, dvs + Hk * Dv, 0.f);
    const int64_t n = cols.count(s);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = cols.query(s, i);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / G, th = t * H + h;
        const float* qr = pq + th * Dk;
        const float* dor = pdo + th * Dv;
        const float* kr = pk + (s * Hk + g) * Dk;
        const float pr = std::exp(scale * dotf(qr, kr, Dk) - pl[th]);
        const float ds = pr * (dotf(dor, pv + (s * Hk + g) * Dv, Dv) - delta[th]) * scale;
        float* dkr = dks + g * Dk;
        float* dvr = dvs + g * Dv;
        for (int64_t d = 0; d < Dk; ++d) dkr[d] += ds * qr[d];
        for (int64_t d = 0; d < Dv; ++d) dvr[d] += pr * dor[d];
      }
    }
  }
}

// Each token's document bounds from the host offsets, in the workspace: i32 [T] each.
struct DocBounds {
  Tensor start, end;
};
DocBounds doc_bounds(const Tensor& cu_seqlens, int64_t tokens, Arena& ws) {
  const int32_t* cu = cu_seqlens.i32();
  const int64_t docs = cu_seqlens.numel() - 1;
  MT_CHECK(cu[0] == 0 && cu[docs] == tokens, ShapeError, "causal attention: cu_seqlens spans ",
           cu[0], "..", cu[docs], ", the tensors hold ", tokens, " tokens");
  DocBounds b{ws.alloc({tokens}, DType::I32), ws.alloc({tokens}, DType::I32)};
  for (int64_t d = 0; d < docs; ++d) {
    MT_CHECK(cu[d + 1] > cu[d], ShapeError, "causal attention: document ", d, " of cu_seqlens is ",
             "empty or reversed (", cu[d], "..", cu[d + 1], ")");
    for (int64_t t = cu[d]; t < cu[d + 1]; ++t) {
      b.start.i32()[t] = cu[d];
      b.end.i32()[t] = cu[d + 1];
    }
  }
  return b;
}

int64_t longest_doc(const Tensor& cu_seqlens) {
  int64_t m = 0;
  for (int64_t d = 0; d + 1 < cu_seqlens.numel(); ++d)
    m = std::max<int64_t>(m, cu_seqlens.i32()[d + 1] - cu_seqlens.i32()[d]);
  return m;
}

}  // namespace

void attention_forward(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& indices, Tensor& o, Tensor& lse) {
  forward_rows(ctx, p, q, k, v, TableRows{indices.i32(), p.kmax, p.tokens}, p.kmax, o, lse);
}

void attention_backward(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& indices, const Tensor& o, const Tensor& lse,
                        const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  ArenaScope scope(ctx.workspace());
  const Tensor delta = backward_queries(ctx, p, q, k, v, TableRows{indices.i32(), p.kmax, p.tokens},
                                        o, lse, dout, dq);
  const KeyLists kl = build_key_lists(indices, p.tokens, ctx.workspace());
  backward_keys(ctx, p, q, k, v, TableCols{kl.offsets.i64(), kl.entries.i64(), p.kmax}, lse, dout,
                delta, dk, dv);
}

void causal_attention_forward(Context& ctx, const AttentionParams& p, const Tensor& cu_seqlens,
                              const Tensor& q, const Tensor& k, const Tensor& v, Tensor& o,
                              Tensor& lse) {
  ArenaScope scope(ctx.workspace());
  const DocBounds b = doc_bounds(cu_seqlens, p.tokens, ctx.workspace());
  forward_rows(ctx, p, q, k, v, CausalRows{b.start.i32()}, longest_doc(cu_seqlens), o, lse);
}

void causal_attention_backward(Context& ctx, const AttentionParams& p, const Tensor& cu_seqlens,
                               const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                               const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                               Tensor& dv) {
  ArenaScope scope(ctx.workspace());
  const DocBounds b = doc_bounds(cu_seqlens, p.tokens, ctx.workspace());
  const Tensor delta =
      backward_queries(ctx, p, q, k, v, CausalRows{b.start.i32()}, o, lse, dout, dq);
  backward_keys(ctx, p, q, k, v, CausalCols{b.end.i32()}, lse, dout, delta, dk, dv);
}

void attention_prob_sum(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                        const Tensor& indices, const Tensor& lse, Tensor& out) {
  const int64_t T = p.tokens, H = p.heads, Hk = p.kvh(), G = H / Hk, Dk = p.qk_dim, K = p.kmax;
  const float* pq = q.f32();
  const float* pk = k.f32();
  const float* pl = lse.f32();
  const int32_t* idx = indices.i32();
  float* po = out.f32();
  const float scale = p.scale;
#pragma omp parallel for num_threads(ctx.threads()) schedule(dynamic, 8)
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* row = idx + t * K;
    float* orow = po + t * K;
    for (int64_t j = 0; j < K; ++j) {
      float acc = 0.f;
      if (valid_slot(row[j], T))
        for (int64_t h = 0; h < H; ++h)
          acc += std::exp(scale * dotf(pq + (t * H + h) * Dk, pk + (row[j] * Hk + h / G) * Dk, Dk) -
                          pl[t * H + h]);
      orow[j] = acc;
    }
  }
}

}  // namespace mt::ops::cpu
