#include "ops/cached_attention.h"

#include <cmath>

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

// A cache [capacity, dims...] whose first `cached` rows are read: any capacity that holds them.
void expect_cache(const Tensor& t, int64_t cached, const Shape& row, const char* what) {
  bool ok = t.ndim() == row.ndim() + 1 && t.dim(0) >= cached && t.is_contiguous();
  for (int i = 0; ok && i < row.ndim(); ++i) ok = t.dim(i + 1) == row[i];
  MT_CHECK(ok, ShapeError, what, " has shape ", t.shape(), " (contiguous: ", t.is_contiguous(),
           "), expected [>= ", cached, ", ", row, "], contiguous");
}

void expect_float_pair(const char* op, const Tensor& a, const Tensor& b, const char* what) {
  MT_CHECK(a.dtype() == b.dtype() && (a.dtype() == DType::F32 || a.dtype() == DType::BF16),
           ShapeError, op, ": ", what, " is ", dtype_name(b.dtype()), ", the queries ",
           dtype_name(a.dtype()), " (one of f32 / bf16 for all)");
}

// Reads the positions, so it runs on the host path only.
void check_positions(const char* op, const Tensor& positions, int64_t cached) {
  for (int64_t i = 0; i < positions.numel(); ++i) {
    const int32_t p = positions.i32()[i];
    MT_CHECK(p >= 0 && p < cached, ValueError, op, ": position ", p, " of row ", i,
             " is outside the ", cached, " cached positions");
  }
}

}  // namespace

bool cached_attention_fits(int64_t qk_dim, int64_t v_dim) {
  const int64_t floats = qk_dim + kCachedAttentionWarps * v_dim + 2 * kCachedAttentionWarps;
  return qk_dim > 0 && v_dim > 0 && floats * static_cast<int64_t>(sizeof(float)) <= 48 * 1024;
}

bool cached_indexer_fits(int64_t heads, int64_t head_dim) {
  const int64_t floats = heads * head_dim + heads;
  return heads > 0 && head_dim > 0 && floats * static_cast<int64_t>(sizeof(float)) <= 48 * 1024;
}

void cached_attention_forward(Context& ctx, const CachedAttentionParams& p, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& positions,
                              const Tensor& indices, Tensor& o) {
  const char* op = "cached_attention";
  MT_CHECK(p.tokens > 0 && p.heads > 0 && p.qk_dim > 0 && p.v_dim > 0 && p.cached > 0, ValueError,
           op, ": bad sizes tokens=", p.tokens, " heads=", p.heads, " qk_dim=", p.qk_dim,
           " v_dim=", p.v_dim, " cached=", p.cached);
  expect_shape(q, {p.tokens, p.heads, p.qk_dim}, "cached_attention q");
  expect_cache(k, p.cached, {p.heads, p.qk_dim}, "cached_attention k cache");
  expect_cache(v, p.cached, {p.heads, p.v_dim}, "cached_attention v cache");
  expect_shape(positions, {p.tokens}, "cached_attention positions");
  MT_CHECK(positions.dtype() == DType::I32, ShapeError, op, ": positions must be i32, got ",
           dtype_name(positions.dtype()));
  if (indices.defined()) {
    MT_CHECK(p.kmax > 0, ValueError, op, ": kmax must be positive with an index table");
    expect_shape(indices, {p.tokens, p.kmax}, "cached_attention indices");
    MT_CHECK(indices.dtype() == DType::I32, ShapeError, op, ": indices must be i32, got ",
             dtype_name(indices.dtype()));
  }
  expect_shape(o, {p.tokens, p.heads, p.v_dim}, "cached_attention o");
  expect_float_pair(op, q, k, "k");
  expect_float_pair(op, q, v, "v");
  expect_float_pair(op, q, o, "o");
  if (auto* cuda =
          cuda_body(MT_OP_BODIES(cached_attention_forward), {&q, &k, &v, &positions, &indices, &o}))
    return cuda(ctx, p, q, k, v, positions, indices, o);
  check_positions(op, positions, p.cached);
  cpu::cached_attention_forward(ctx, p, q, k, v, positions, indices, o);
}

void cached_indexer_topk(Context& ctx, const CachedIndexerParams& p, const Tensor& q,
                         const Tensor& k, const Tensor& w, const Tensor& positions, Tensor& out) {
  const char* op = "cached_indexer_topk";
  MT_CHECK(p.tokens > 0 && p.heads > 0 && p.head_dim > 0 && p.cached > 0 && p.topk > 0, ValueError,
           op, ": bad sizes tokens=", p.tokens, " heads=", p.heads, " head_dim=", p.head_dim,
           " cached=", p.cached, " topk=", p.topk);
  expect_shape(q, {p.tokens, p.heads, p.head_dim}, "cached_indexer_topk q");
  expect_cache(k, p.cached, {p.head_dim}, "cached_indexer_topk k cache");
  expect_shape(w, {p.tokens, p.heads}, "cached_indexer_topk w");
  expect_shape(positions, {p.tokens}, "cached_indexer_topk positions");
  expect_shape(out, {p.tokens, p.topk}, "cached_indexer_topk out");
  MT_CHECK(positions.dtype() == DType::I32 && out.dtype() == DType::I32, ShapeError, op,
           ": positions and out must be i32, got ", dtype_name(positions.dtype()), " and ",
           dtype_name(out.dtype()));
  expect_float_pair(op, q, k, "k");
  expect_float_pair(op, q, w, "w");
  if (auto* cuda = cuda_body(MT_OP_BODIES(cached_indexer_topk), {&q, &k, &w, &positions, &out}))
    return cuda(ctx, p, q, k, w, positions, out);
  check_positions(op, positions, p.cached);
  cpu::cached_indexer_topk(ctx, p, q, k, w, positions, out);
}

}  // namespace mt::ops
