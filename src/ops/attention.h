// Softmax attention where each query attends to an explicit list of key positions (FlashMLA's
// sparse-prefill contract). Dense causal attention is the special case "all earlier positions of
// the same document" (causal_indices), so dense MLA and DeepSeek sparse attention share one op:
// with identical index lists the two are bit-identical.
//
// Layout: q [T, H, Dqk], k [T, Hkv, Dqk], v [T, Hkv, Dv], H a multiple of Hkv (Hkv = H: per-head
// keys as MLA after kv_b; Hkv = 1: MQA over a shared latent). indices i32 [T, kmax] hold absolute
// token positions inside the packed batch; a slot outside [0, T) (e.g. -1) is unused. Duplicate
// positions in one row count twice. A row without valid slots outputs o = 0 and lse = -inf.
#pragma once

#include "core/arena.h"
#include "core/context.h"
#include "core/seq_info.h"
#include "core/tensor.h"

namespace mt::ops {

struct AttentionParams {
  int64_t tokens = 0, heads = 0;
  int64_t kv_heads = 0;  // 0: same as heads
  int64_t qk_dim = 0, v_dim = 0;
  int64_t kmax = 0;  // slots per query row of `indices`
  float scale = 0;   // softmax scale, applied to q.k
  int64_t kvh() const { return kv_heads ? kv_heads : heads; }
};

// Longest document of the batch: the kmax dense causal attention needs.
int64_t max_doc_len(const SeqInfo& seq);

// indices [T, kmax] (kmax >= max_doc_len): row t lists its document's positions start..t in
// increasing order, then -1.
using CausalIndices = void(const SeqInfo& seq, Tensor& indices);
CausalIndices causal_indices;

// Bidirectional attention inside each document (the vision tower: every patch sees its whole
// image, never another image). indices [T, kmax] (kmax >= max_doc_len): row t lists all of its
// document's positions in increasing order, then -1.
using FullIndices = void(const SeqInfo& seq, Tensor& indices);
FullIndices full_indices;

// o [T, H, Dv] and lse [T, H] (natural-log log-sum-exp of the scaled scores) are written.
using AttentionForward = void(Context& ctx, const AttentionParams& p, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& indices, Tensor& o,
                              Tensor& lse);
AttentionForward attention_forward;

// dq, dk, dv written (dk/dv sum over every query slot that references a key; keys no query
// references get 0). Needs the forward's o and lse.
using AttentionBackward = void(Context& ctx, const AttentionParams& p, const Tensor& q,
                               const Tensor& k, const Tensor& v, const Tensor& indices,
                               const Tensor& o, const Tensor& lse, const Tensor& dout, Tensor& dq,
                               Tensor& dk, Tensor& dv);
AttentionBackward attention_backward;

// out [T, kmax] = sum over query heads of the attention probabilities of each slot (0 for
// unused slots): the DSA indexer's KL target before L1 normalisation. Written.
using AttentionProbSum = void(Context& ctx, const AttentionParams& p, const Tensor& q,
                              const Tensor& k, const Tensor& indices, const Tensor& lse,
                              Tensor& out);
AttentionProbSum attention_prob_sum;

// Dense causal attention inside each document, without index lists: the same results as
// attention_forward/backward over causal_indices' lists (tests/ops checks both against one
// reference), in O(T) memory. cu_seqlens i32 [num_seqs + 1] on the tensors' device; p.kmax is not
// read. Written, as above.
using CausalAttentionForward = void(Context& ctx, const AttentionParams& p,
                                    const Tensor& cu_seqlens, const Tensor& q, const Tensor& k,
                                    const Tensor& v, Tensor& o, Tensor& lse);
CausalAttentionForward causal_attention_forward;
using CausalAttentionBackward = void(Context& ctx, const AttentionParams& p,
                                     const Tensor& cu_seqlens, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& o, const Tensor& lse,
                                     const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);
CausalAttentionBackward causal_attention_backward;

// Whether the CUDA tensor-core kernel (flash_attention.cu) takes these shapes in bf16: one key
// head per query head and head dims within its widest instantiation. Read by the CUDA entries and
// by the op table (plan/), so both choose alike; other shapes and fp32 run the direct kernels.
bool flash_attention_fits(int64_t qk_dim, int64_t v_dim, bool kv_per_head);
// Whether the CUDA tensor-core kernel over index lists (dsa_sparse_attention.cu) takes these
// shapes in bf16: query heads sharing each key head in groups of 16, 32, 48 or 64 (the heads of a
// query share its index list and, then, its keys: they are the MMA's rows), head dims within
// 192 (q.k) and 128 (values). The per-head layout (kv_heads = heads) runs the direct kernels.
bool sparse_attention_fits(int64_t heads, int64_t kv_heads, int64_t qk_dim, int64_t v_dim);

// The backends' bodies, called by the entries above once they validated: ops/cpu/attention.cpp,
// and ops/cuda/attention.cu in CUDA builds (which has no full_indices: the entry builds it on the
// CPU path).
namespace cpu {
CausalIndices causal_indices;
FullIndices full_indices;
AttentionForward attention_forward;
AttentionBackward attention_backward;
AttentionProbSum attention_prob_sum;
CausalAttentionForward causal_attention_forward;
CausalAttentionBackward causal_attention_backward;
}  // namespace cpu
namespace cuda {
CausalIndices causal_indices;
AttentionForward attention_forward;
AttentionBackward attention_backward;
AttentionProbSum attention_prob_sum;
CausalAttentionForward causal_attention_forward;
CausalAttentionBackward causal_attention_backward;
}  // namespace cuda

}  // namespace mt::ops
