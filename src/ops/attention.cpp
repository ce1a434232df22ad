#include "ops/attention.h"

#include <algorithm>

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

void check_common(const AttentionParams& p, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& indices) {
  MT_CHECK(p.tokens >= 0 && p.heads > 0 && p.qk_dim > 0 && p.v_dim > 0 && p.kmax >= 0, ValueError,
           "attention: bad params tokens ", p.tokens, " heads ", p.heads, " qk_dim ", p.qk_dim,
           " v_dim ", p.v_dim, " kmax ", p.kmax);
  MT_CHECK(p.kvh() > 0 && p.heads % p.kvh() == 0, ValueError, "attention: heads ", p.heads,
           " not a multiple of kv_heads ", p.kvh());
  expect_shape(q, {p.tokens, p.heads, p.qk_dim}, "attention q");
  expect_shape(k, {p.tokens, p.kvh(), p.qk_dim}, "attention k");
  expect_shape(v, {p.tokens, p.kvh(), p.v_dim}, "attention v");
  expect_shape(indices, {p.tokens, p.kmax}, "attention indices");
  MT_CHECK(indices.dtype() == DType::I32, ShapeError, "attention indices must be i32, got ",
           dtype_name(indices.dtype()));
}

void check_causal(const AttentionParams& p, const Tensor& cu_seqlens, const Tensor& q,
                  const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse) {
  MT_CHECK(p.tokens >= 0 && p.heads > 0 && p.qk_dim > 0 && p.v_dim > 0, ValueError,
           "causal attention: bad params tokens ", p.tokens, " heads ", p.heads, " qk_dim ",
           p.qk_dim, " v_dim ", p.v_dim);
  MT_CHECK(p.kvh() > 0 && p.heads % p.kvh() == 0, ValueError, "causal attention: heads ", p.heads,
           " not a multiple of kv_heads ", p.kvh());
  MT_CHECK(cu_seqlens.dtype() == DType::I32 && cu_seqlens.ndim() == 1 && cu_seqlens.numel() >= 2,
           ShapeError,
           "causal attention: cu_seqlens must be i32 [num_seqs + 1] with a document, got ",
           dtype_name(cu_seqlens.dtype()), " ", cu_seqlens.shape());
  expect_shape(q, {p.tokens, p.heads, p.qk_dim}, "causal attention q");
  expect_shape(k, {p.tokens, p.kvh(), p.qk_dim}, "causal attention k");
  expect_shape(v, {p.tokens, p.kvh(), p.v_dim}, "causal attention v");
  expect_shape(o, {p.tokens, p.heads, p.v_dim}, "causal attention o");
  expect_shape(lse, {p.tokens, p.heads}, "causal attention lse");
}

}  // namespace

bool flash_attention_fits(int64_t qk_dim, int64_t v_dim, bool kv_per_head) {
  return kv_per_head && qk_dim <= 192 && v_dim <= 128;
}

bool sparse_attention_fits(int64_t heads, int64_t kv_heads, int64_t qk_dim, int64_t v_dim) {
  if (kv_heads <= 0 || heads % kv_heads != 0) return false;
  const int64_t group = heads / kv_heads;
  return group % 16 == 0 && group <= 64 && qk_dim <= 192 && v_dim <= 128;
}

void causal_attention_forward(Context& ctx, const AttentionParams& p, const Tensor& cu_seqlens,
                              const Tensor& q, const Tensor& k, const Tensor& v, Tensor& o,
                              Tensor& lse) {
  check_causal(p, cu_seqlens, q, k, v, o, lse);
  dispatch(MT_OP_BODIES(causal_attention_forward), {&cu_seqlens, &q, &k, &v, &o, &lse}, ctx, p,
           cu_seqlens, q, k, v, o, lse);
}

void causal_attention_backward(Context& ctx, const AttentionParams& p, const Tensor& cu_seqlens,
                               const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                               const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                               Tensor& dv) {
  check_causal(p, cu_seqlens, q, k, v, o, lse);
  expect_shape(dout, o.shape(), "causal attention dout");
  expect_shape(dq, q.shape(), "causal attention dq");
  expect_shape(dk, k.shape(), "causal attention dk");
  expect_shape(dv, v.shape(), "causal attention dv");
  dispatch(MT_OP_BODIES(causal_attention_backward),
           {&cu_seqlens, &q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv}, ctx, p, cu_seqlens, q, k, v,
           o, lse, dout, dq, dk, dv);
}

int64_t max_doc_len(const SeqInfo& seq) {
  int64_t m = 0;
  for (size_t d = 0; d + 1 < seq.offsets.size(); ++d)
    m = std::max(m, seq.offsets[d + 1] - seq.offsets[d]);
  return m;
}

void causal_indices(const SeqInfo& seq, Tensor& indices) {
  MT_CHECK(
      indices.ndim() == 2 && indices.dim(0) == seq.tokens && indices.dim(1) >= max_doc_len(seq),
      ShapeError, "causal_indices: indices ", indices.shape(), " for ", seq.tokens,
      " tokens, longest document ", max_doc_len(seq));
  dispatch(MT_OP_BODIES(causal_indices), {&indices}, seq, indices);
}

void full_indices(const SeqInfo& seq, Tensor& indices) {
  MT_CHECK(
      indices.ndim() == 2 && indices.dim(0) == seq.tokens && indices.dim(1) >= max_doc_len(seq),
      ShapeError, "full_indices: indices ", indices.shape(), " for ", seq.tokens,
      " tokens, longest document ", max_doc_len(seq));
  if (op_device("full_indices", {&indices}) == Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    no_cuda_kernel("full_indices");  // no CUDA kernel: the host builds the table
#else
    no_cuda_backend("full_indices");
#endif
  }
  cpu::full_indices(seq, indices);
}

void attention_forward(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& indices, Tensor& o, Tensor& lse) {
  check_common(p, q, k, v, indices);
  expect_shape(o, {p.tokens, p.heads, p.v_dim}, "attention o");
  expect_shape(lse, {p.tokens, p.heads}, "attention lse");
  dispatch(MT_OP_BODIES(attention_forward), {&q, &k, &v, &indices, &o, &lse}, ctx, p, q, k, v,
           indices, o, lse);
}

void attention_backward(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& indices, const Tensor& o, const Tensor& lse,
                        const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  check_common(p, q, k, v, indices);
  expect_shape(o, {p.tokens, p.heads, p.v_dim}, "attention o");
  expect_shape(lse, {p.tokens, p.heads}, "attention lse");
  expect_shape(dout, o.shape(), "attention dout");
  expect_shape(dq, q.shape(), "attention dq");
  expect_shape(dk, k.shape(), "attention dk");
  expect_shape(dv, v.shape(), "attention dv");
  dispatch(MT_OP_BODIES(attention_backward), {&q, &k, &v, &indices, &o, &lse, &dout, &dq, &dk, &dv},
           ctx, p, q, k, v, indices, o, lse, dout, dq, dk, dv);
}

void attention_prob_sum(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                        const Tensor& indices, const Tensor& lse, Tensor& out) {
  MT_CHECK(p.kvh() > 0 && p.heads % p.kvh() == 0, ValueError, "attention: heads ", p.heads,
           " not a multiple of kv_heads ", p.kvh());
  expect_shape(q, {p.tokens, p.heads, p.qk_dim}, "attention q");
  expect_shape(k, {p.tokens, p.kvh(), p.qk_dim}, "attention k");
  expect_shape(indices, {p.tokens, p.kmax}, "attention indices");
  expect_shape(lse, {p.tokens, p.heads}, "attention lse");
  expect_shape(out, {p.tokens, p.kmax}, "attention prob sum");
  dispatch(MT_OP_BODIES(attention_prob_sum), {&q, &k, &indices, &lse, &out}, ctx, p, q, k, indices,
           lse, out);
}

}  // namespace mt::ops
