#include "ops/sparse_mqa_attention.h"

#include "core/arena.h"
#include "ops/attention.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"

namespace mt::ops {

namespace {

void check_common(const SparseMqaParams& p, const Tensor& q, const Tensor& kv,
                  const Tensor& indices, const Tensor& lse) {
  MT_CHECK(p.tokens >= 0 && p.heads > 0 && p.qk_dim > 0 && p.v_dim > 0 && p.v_dim <= p.qk_dim &&
               p.kmax >= 0,
           ValueError, "sparse_mqa: bad params tokens ", p.tokens, " heads ", p.heads, " qk_dim ",
           p.qk_dim, " v_dim ", p.v_dim, " (at most qk_dim) kmax ", p.kmax);
  expect_shape(q, {p.tokens, p.heads, p.qk_dim}, "sparse_mqa q");
  expect_shape(kv, {p.tokens, p.qk_dim}, "sparse_mqa kv");
  expect_shape(indices, {p.tokens, p.kmax}, "sparse_mqa indices");
  MT_CHECK(indices.dtype() == DType::I32, ShapeError, "sparse_mqa indices must be i32, got ",
           dtype_name(indices.dtype()));
  expect_shape(lse, {p.tokens, p.heads}, "sparse_mqa lse");
  MT_CHECK(lse.dtype() == DType::F32, ShapeError, "sparse_mqa lse must be f32, got ",
           dtype_name(lse.dtype()));
}

void check_prob_sum(const SparseMqaParams& p, const Tensor& out) {
  expect_shape(out, {p.tokens, p.kmax}, "sparse_mqa prob sum");
  MT_CHECK(out.dtype() == DType::F32, ShapeError, "sparse_mqa prob sum must be f32, got ",
           dtype_name(out.dtype()));
}

AttentionParams per_head(const SparseMqaParams& p) {
  return {.tokens = p.tokens,
          .heads = p.heads,
          .kv_heads = 1,
          .qk_dim = p.qk_dim,
          .v_dim = p.v_dim,
          .kmax = p.kmax,
          .scale = p.scale};
}

}  // namespace

bool sparse_mqa_fits(int64_t heads, int64_t qk_dim, int64_t v_dim) {
  return heads > 0 && qk_dim == 576 && v_dim == 512;
}

const char* sparse_mqa_kernels_name(SparseMqaKernels k) {
  switch (k) {
    case SparseMqaKernels::Split:
      return "split";
    case SparseMqaKernels::Wgmma:
      return "wgmma";
    case SparseMqaKernels::Wgmma2:
      return "wgmma2";
    case SparseMqaKernels::Wgmma3:
      return "wgmma3";
    case SparseMqaKernels::Chained:
      break;
  }
  return "chained";
}

void sparse_mqa_forward(Context& ctx, const SparseMqaParams& p, const Tensor& q, const Tensor& kv,
                        const Tensor& indices, Tensor& o, Tensor& lse) {
  check_common(p, q, kv, indices, lse);
  expect_shape(o, {p.tokens, p.heads, p.v_dim}, "sparse_mqa o");
  dispatch(MT_OP_BODIES(sparse_mqa_forward), {&q, &kv, &indices, &o, &lse}, ctx, p, q, kv, indices,
           o, lse);
}

void sparse_mqa_backward(Context& ctx, const SparseMqaParams& p, const Tensor& q, const Tensor& kv,
                         const Tensor& indices, const Tensor& o, const Tensor& lse,
                         const Tensor& dout, Tensor& dq, Tensor& dkv, Tensor& prob_sum) {
  check_common(p, q, kv, indices, lse);
  expect_shape(o, {p.tokens, p.heads, p.v_dim}, "sparse_mqa o");
  expect_shape(dout, o.shape(), "sparse_mqa dout");
  expect_shape(dq, q.shape(), "sparse_mqa dq");
  expect_shape(dkv, kv.shape(), "sparse_mqa dkv");
  if (prob_sum.defined()) check_prob_sum(p, prob_sum);
  dispatch(MT_OP_BODIES(sparse_mqa_backward),
           {&q, &kv, &indices, &o, &lse, &dout, &dq, &dkv, &prob_sum}, ctx, p, q, kv, indices, o,
           lse, dout, dq, dkv, prob_sum);
}

void sparse_mqa_prob_sum(Context& ctx, const SparseMqaParams& p, const Tensor& q, const Tensor& kv,
                         const Tensor& indices, const Tensor& lse, Tensor& out) {
  check_common(p, q, kv, indices, lse);
  check_prob_sum(p, out);
  dispatch(MT_OP_BODIES(sparse_mqa_prob_sum), {&q, &kv, &indices, &lse, &out}, ctx, p, q, kv,
           indices, lse, out);
}

void sparse_mqa_composite_prob_sum(Context& ctx, const SparseMqaParams& p, const Tensor& q,
                                   const Tensor& kv, const Tensor& indices, const Tensor& lse,
                                   Tensor& out) {
  attention_prob_sum(ctx, per_head(p), q, kv.view({p.tokens, 1, p.qk_dim}), indices, lse, out);
}

void sparse_mqa_composite_forward(Context& ctx, const SparseMqaParams& p, const Tensor& q,
                                  const Tensor& kv, const Tensor& indices, Tensor& o, Tensor& lse) {
  const int64_t T = p.tokens;
  ArenaScope scope(ctx.workspace());
  Tensor v = ctx.workspace().alloc({T, 1, p.v_dim}, kv.dtype());
  Tensor v2 = v.view({T, p.v_dim});
  copy(ctx, kv.cols(0, p.v_dim), v2);
  attention_forward(ctx, per_head(p), q, kv.view({T, 1, p.qk_dim}), v, indices, o, lse);
}

void sparse_mqa_composite_backward(Context& ctx, const SparseMqaParams& p, const Tensor& q,
                                   const Tensor& kv, const Tensor& indices, const Tensor& o,
                                   const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dkv,
                                   Tensor& prob_sum) {
  const int64_t T = p.tokens, Dv = p.v_dim;
  if (prob_sum.defined()) sparse_mqa_composite_prob_sum(ctx, p, q, kv, indices, lse, prob_sum);
  ArenaScope scope(ctx.workspace());
  Arena& ws = ctx.workspace();
  Tensor v = ws.alloc({T, 1, Dv}, kv.dtype()), dv = ws.alloc({T, 1, Dv}, kv.dtype());
  Tensor v2 = v.view({T, Dv});
  copy(ctx, kv.cols(0, Dv), v2);
  Tensor dk = dkv.view({T, 1, p.qk_dim});
  attention_backward(ctx, per_head(p), q, kv.view({T, 1, p.qk_dim}), v, indices, o, lse, dout, dq,
                     dk, dv);
  // dkv[:, :Dv] += dv, through a contiguous copy (add_into takes contiguous tensors).
  Tensor head = ws.alloc({T, Dv}, kv.dtype());
  copy(ctx, dkv.cols(0, Dv), head);
  add_into(ctx, dv.view({T, Dv}), head);
  Tensor cols = dkv.cols(0, Dv);
  copy(ctx, head, cols);
}

}  // namespace mt::ops
