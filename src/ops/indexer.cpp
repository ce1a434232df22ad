#include "ops/indexer.h"

#include <algorithm>
#include <cmath>

#include "ops/attention.h"
#include "ops/dispatch.h"

namespace mt::ops {

namespace {

void check_scores(const IndexerParams& p, const Tensor& q, const Tensor& k, const Tensor& w,
                  const Tensor& indices) {
  MT_CHECK(p.tokens >= 0 && p.heads > 0 && p.head_dim > 0 && p.kmax >= 0, ValueError,
           "indexer: bad params tokens ", p.tokens, " heads ", p.heads, " head_dim ", p.head_dim,
           " kmax ", p.kmax);
  expect_shape(q, {p.tokens, p.heads, p.head_dim}, "indexer q");
  expect_shape(k, {p.tokens, p.head_dim}, "indexer k");
  expect_shape(w, {p.tokens, p.heads}, "indexer w");
  expect_shape(indices, {p.tokens, p.kmax}, "indexer indices");
  MT_CHECK(indices.dtype() == DType::I32, ShapeError, "indexer indices must be i32, got ",
           dtype_name(indices.dtype()));
}

void check_table(const Tensor& t, const Tensor& indices, const char* what) {
  MT_CHECK(indices.ndim() == 2 && indices.dtype() == DType::I32, ShapeError,
           "indexer: index table must be i32 [T, kmax], got ", indices.shape(), " ",
           dtype_name(indices.dtype()));
  expect_shape(t, indices.shape(), what);
}

}  // namespace

float IndexerParams::eff_scale() const {
  return scale != 0.f ? scale : 1.f / std::sqrt(static_cast<float>(head_dim));
}

void indexer_scores_forward(Context& ctx, const IndexerParams& p, const Tensor& q, const Tensor& k,
                            const Tensor& w, const Tensor& indices, Tensor& scores) {
  check_scores(p, q, k, w, indices);
  expect_shape(scores, {p.tokens, p.kmax}, "indexer scores");
  dispatch(MT_OP_BODIES(indexer_scores_forward), {&q, &k, &w, &indices, &scores}, ctx, p, q, k, w,
           indices, scores);
}

void indexer_scores_backward(Context& ctx, const IndexerParams& p, const Tensor& q, const Tensor& k,
                             const Tensor& w, const Tensor& indices, const Tensor& dscores,
                             Tensor& dq, Tensor& dk, Tensor& dw) {
  check_scores(p, q, k, w, indices);
  expect_shape(dscores, {p.tokens, p.kmax}, "indexer dscores");
  expect_shape(dq, q.shape(), "indexer dq");
  expect_shape(dk, k.shape(), "indexer dk");
  expect_shape(dw, w.shape(), "indexer dw");
  dispatch(MT_OP_BODIES(indexer_scores_backward), {&q, &k, &w, &indices, &dscores, &dq, &dk, &dw},
           ctx, p, q, k, w, indices, dscores, dq, dk, dw);
}

void topk_select(Context& ctx, const Tensor& scores, const Tensor& candidates, int64_t topk,
                 Tensor& out) {
  check_table(scores, candidates, "topk scores");
  MT_CHECK(topk > 0, ValueError, "topk must be positive, got ", topk);
  expect_shape(out, {candidates.dim(0), topk}, "topk output");
  MT_CHECK(out.dtype() == DType::I32, ShapeError, "topk output must be i32");
  dispatch(MT_OP_BODIES(topk_select), {&scores, &candidates, &out}, ctx, scores, candidates, topk,
           out);
}

namespace {

// bf16 q rows of `resident` heads and two key tiles; f32 weights of every head; i32 histograms;
// five i32 words of per-row state.
int64_t topk_smem(int64_t heads, int64_t resident, int64_t head_dim) {
  using Tile = IndexerTopkTile;
  const int64_t ld = Tile::padded_dim(head_dim) + Tile::pad;
  return 2 * (resident * Tile::rows * ld + 2 * Tile::keys * ld) + 4 * Tile::rows * heads +
         4 * Tile::rows * Tile::bins + 4 * 5 * Tile::rows;
}

}  // namespace

int64_t IndexerTopkTile::resident_heads(int64_t heads, int64_t head_dim) {
  if (heads <= 0 || head_dim > 128) return 0;
  const int64_t fixed = topk_smem(heads, 0, head_dim),
                per_head = topk_smem(heads, 1, head_dim) - fixed;
  if (fixed + per_head > smem_limit) return 0;
  return std::min(heads, (smem_limit - fixed) / per_head);
}

int64_t IndexerTopkTile::smem_bytes(int64_t heads, int64_t head_dim) {
  return topk_smem(heads, resident_heads(heads, head_dim), head_dim);
}

bool indexer_topk_fits(int64_t heads, int64_t head_dim) {
  return IndexerTopkTile::resident_heads(heads, head_dim) > 0;
}

void indexer_causal_topk(Context& ctx, const IndexerParams& p, const SeqInfo& seq, const Tensor& q,
                         const Tensor& k, const Tensor& w, int64_t topk, Tensor& out) {
  MT_CHECK(p.tokens == seq.tokens, ValueError, "indexer_causal_topk: params say ", p.tokens,
           " tokens, the batch has ", seq.tokens);
  MT_CHECK(topk > 0, ValueError, "indexer_causal_topk: topk must be positive, got ", topk);
  IndexerParams sp = p;
  sp.kmax = max_doc_len(seq);
  MT_CHECK(p.tokens >= 0 && p.heads > 0 && p.head_dim > 0, ValueError,
           "indexer_causal_topk: bad params tokens ", p.tokens, " heads ", p.heads, " head_dim ",
           p.head_dim);
  expect_shape(q, {p.tokens, p.heads, p.head_dim}, "indexer q");
  expect_shape(k, {p.tokens, p.head_dim}, "indexer k");
  expect_shape(w, {p.tokens, p.heads}, "indexer w");
  expect_shape(out, {p.tokens, topk}, "indexer top-k output");
  MT_CHECK(out.dtype() == DType::I32, ShapeError, "indexer top-k output must be i32, got ",
           dtype_name(out.dtype()));
  if (op_device("indexer_causal_topk", {&q, &k, &w, &out}) == Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    if (q.dtype() == DType::BF16 && indexer_topk_fits(p.heads, p.head_dim) &&
        seq.cu_seqlens.device() == Device::CUDA)
      return cuda::indexer_causal_topk(ctx, p, seq.cu_seqlens, q, k, w, topk, out);
#else
    no_cuda_backend("indexer_causal_topk");
#endif
  }
  // The composite: every causal candidate scored into a table, then selected.
  ArenaScope scope(ctx.workspace());
  Arena& ws = ctx.workspace();
  Tensor cand = ws.alloc({p.tokens, sp.kmax}, DType::I32);
  causal_indices(seq, cand);
  Tensor scores = ws.alloc({p.tokens, sp.kmax}, DType::F32);
  indexer_scores_forward(ctx, sp, q, k, w, cand, scores);
  topk_select(ctx, scores, cand, topk, out);
}

void indexer_kl_forward(Context& ctx, const Tensor& scores, const Tensor& target,
                        const Tensor& indices, Tensor& softmax, Tensor& loss) {
  check_table(scores, indices, "indexer kl scores");
  check_table(target, indices, "indexer kl target");
  check_table(softmax, indices, "indexer kl softmax");
  expect_f64_scalar(loss, "indexer kl loss");
  dispatch(MT_OP_BODIES(indexer_kl_forward), {&scores, &target, &indices, &softmax, &loss}, ctx,
           scores, target, indices, softmax, loss);
}

void indexer_kl_backward(Context& ctx, const Tensor& softmax, const Tensor& target,
                         const Tensor& indices, double dloss, Tensor& dscores) {
  check_table(softmax, indices, "indexer kl softmax");
  check_table(target, indices, "indexer kl target");
  check_table(dscores, indices, "indexer kl dscores");
  dispatch(MT_OP_BODIES(indexer_kl_backward), {&softmax, &target, &indices, &dscores}, ctx, softmax,
           target, indices, dloss, dscores);
}

bool indexer_scores_kl_fits(int64_t heads, int64_t head_dim, int64_t slots) {
  if (heads < 1 || heads > 64 || (head_dim != 64 && head_dim != 128)) return false;
  const int64_t ld = head_dim + 8, hp = (heads + 15) / 16 * 16;
  return 2 * (hp * ld + 2 * 64 * ld) + 4 * hp + 4 * slots <= IndexerTopkTile::smem_limit;
}

void indexer_scores_kl(Context& ctx, const IndexerParams& p, const Tensor& q, const Tensor& k,
                       const Tensor& w, const Tensor& indices, const Tensor& target, double dloss,
                       Tensor& loss, Tensor& dscores) {
  check_scores(p, q, k, w, indices);
  check_table(target, indices, "indexer kl target");
  if (dscores.defined()) check_table(dscores, indices, "indexer kl dscores");
  expect_f64_scalar(loss, "indexer kl loss");
  if (op_device("indexer_scores_kl", {&q, &k, &w, &indices, &target, &loss, &dscores}) ==
      Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    if (cuda::indexer_scores_kl_takes(p, q, k))
      return cuda::indexer_scores_kl(ctx, p, q, k, w, indices, target, dloss, loss, dscores);
#else
    no_cuda_backend("indexer_scores_kl");
#endif
  }
  ArenaScope scope(ctx.workspace());
  Arena& ws = ctx.workspace();
  Tensor scores = ws.alloc({p.tokens, p.kmax}, DType::F32),
         softmax = ws.alloc({p.tokens, p.kmax}, DType::F32);
  indexer_scores_forward(ctx, p, q, k, w, indices, scores);
  indexer_kl_forward(ctx, scores, target, indices, softmax, loss);
  if (dscores.defined()) indexer_kl_backward(ctx, softmax, target, indices, dloss, dscores);
}

}  // namespace mt::ops
