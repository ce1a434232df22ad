// The DeepSeek Sparse Attention lightning indexer: scores, top-k selection and the KL loss that
// teaches the indexer to imitate the main attention.
//
//   I[t, s] = scale * sum_j w[t, j] * ReLU(q[t, j, :] . k[s, :]),  scale = head_dim^-0.5
//
// q [T, HI, DI], k [T, DI] (one key head shared by all indexer heads), w [T, HI] (already
// multiplied by HI^-0.5 by the caller). Scores are evaluated on an index table i32 [T, kmax]
// with the same conventions as ops::attention (slot outside [0, T) = unused).
#pragma once

#include "core/context.h"
#include "core/seq_info.h"
#include "core/tensor.h"

namespace mt::ops {

struct IndexerParams {
  int64_t tokens = 0, heads = 0, head_dim = 0;
  int64_t kmax = 0;  // slots per row of the index table
  float scale = 0;   // 0: head_dim^-0.5
  float eff_scale() const;
};

// scores [T, kmax] written; unused slots get 0.
using IndexerScoresForward = void(Context& ctx, const IndexerParams& p, const Tensor& q,
                                  const Tensor& k, const Tensor& w, const Tensor& indices,
                                  Tensor& scores);
IndexerScoresForward indexer_scores_forward;
// dq, dk, dw written (dk sums over every slot that references a key). dscores on unused slots
// is ignored.
using IndexerScoresBackward = void(Context& ctx, const IndexerParams& p, const Tensor& q,
                                   const Tensor& k, const Tensor& w, const Tensor& indices,
                                   const Tensor& dscores, Tensor& dq, Tensor& dk, Tensor& dw);
IndexerScoresBackward indexer_scores_backward;

// Per row, the min(topk, valid slots) candidates with the largest score, ties going to the lower
// position. out i32 [T, topk] lists them in increasing position order, then -1. scores and
// candidates are [T, kin]; candidates follow the index-table conventions. Written.
using TopkSelect = void(Context& ctx, const Tensor& scores, const Tensor& candidates, int64_t topk,
                        Tensor& out);
TopkSelect topk_select;

// The sparse stage's selection in one call: for every query t, the min(topk, t - start + 1)
// positions of its document up to t with the largest scores, in increasing order, then -1: exactly
// topk_select over the scores of causal_indices' table (ties to the lower position). p.kmax is not
// read. On the GPU, bf16 tensors within indexer_topk_fits and cu_seqlens on the device run a fused
// kernel that keeps no score table (ops/cuda/dsa_indexer_topk.cu); everything else runs that
// composite through a [T, longest document] candidate and score table in the workspace.
using IndexerCausalTopk = void(Context& ctx, const IndexerParams& p, const SeqInfo& seq,
                               const Tensor& q, const Tensor& k, const Tensor& w, int64_t topk,
                               Tensor& out);
IndexerCausalTopk indexer_causal_topk;

// The fused kernel's tile: 64 queries (16 per warp) against 64 keys, the heads' q rows and a
// 256-bin histogram per query in shared memory, head dims padded to 64 or 128. Where every head's
// q rows do not fit (DeepSeek-V3.2's 64 x 128), `resident_heads` of them (as many as fit) are
// staged at a time, per key tile. One rule for the launcher, the entry and the op table.
struct IndexerTopkTile {
  static constexpr int64_t rows = 64, keys = 64, pad = 8, bins = 256;
  static constexpr int64_t smem_limit = 232448;  // Hopper's opt-in shared memory per block
  static int64_t padded_dim(int64_t head_dim) { return head_dim <= 64 ? 64 : 128; }
  // heads where they all fit, else as many as fit; 0: not even one.
  static int64_t resident_heads(int64_t heads, int64_t head_dim);
  static int64_t smem_bytes(int64_t heads, int64_t head_dim);  // with resident_heads' q rows
};
bool indexer_topk_fits(int64_t heads, int64_t head_dim);

// KL(p_t || softmax(I_t)) summed over rows and divided by T, on the valid slots of `indices`.
// p_t = target_t / sum(target_t) (L1 normalisation; target >= 0, treated as a constant). Rows
// without valid slots or with a zero target contribute nothing. softmax [T, kmax] (written, 0 on
// unused slots) is kept for backward. The loss goes to loss f64 [1] (written).
using IndexerKlForward = void(Context& ctx, const Tensor& scores, const Tensor& target,
                              const Tensor& indices, Tensor& softmax, Tensor& loss);
IndexerKlForward indexer_kl_forward;
// dscores [T, kmax] = dloss * (softmax - p) / T on valid slots, 0 elsewhere. Written.
using IndexerKlBackward = void(Context& ctx, const Tensor& softmax, const Tensor& target,
                               const Tensor& indices, double dloss, Tensor& dscores);
IndexerKlBackward indexer_kl_backward;

// The sparse stage's KL loss from the indexer's inputs in one call: the scores on the table's
// slots (indexer_scores_forward), the loss (indexer_kl_forward into loss f64 [1], written) and,
// when `dscores` is defined, its gradient dloss (softmax - p) / T (indexer_kl_backward), with the
// same results. On the GPU, bf16 within cuda::indexer_scores_kl_takes runs one kernel per query
// that keeps the row's scores in shared memory, so that neither the score nor the softmax table
// ([T, kmax] f32 each) exists; elsewhere the composite through both, in the workspace.
void indexer_scores_kl(Context& ctx, const IndexerParams& p, const Tensor& q, const Tensor& k,
                       const Tensor& w, const Tensor& indices, const Tensor& target, double dloss,
                       Tensor& loss, Tensor& dscores);
// The fused KL kernel's rule (bf16, on the GPU): up to 64 heads of 64 or 128 dims, the heads' q
// rows, two 64-slot key tiles and the row's `slots` fp32 scores within one block's shared memory.
bool indexer_scores_kl_fits(int64_t heads, int64_t head_dim, int64_t slots);

// The backends' bodies, called by the entries above once they validated: ops/cpu/indexer.cpp, and
// ops/cuda/indexer.cu in CUDA builds.
namespace cpu {
IndexerScoresForward indexer_scores_forward;
IndexerScoresBackward indexer_scores_backward;
TopkSelect topk_select;
IndexerKlForward indexer_kl_forward;
IndexerKlBackward indexer_kl_backward;
}  // namespace cpu
namespace cuda {
// The fused kernel (no score table); cu_seqlens i32 [num_seqs + 1] on the device.
void indexer_causal_topk(Context& ctx, const IndexerParams& p, const Tensor& cu_seqlens,
                         const Tensor& q, const Tensor& k, const Tensor& w, int64_t topk,
                         Tensor& out);
// The fused KL (ops/cuda/indexer_tc.cu): bf16 within the tensor-core scores' shapes, with the
// row's kmax fp32 scores within the shared memory.
bool indexer_scores_kl_takes(const IndexerParams& p, const Tensor& q, const Tensor& k);
void indexer_scores_kl(Context& ctx, const IndexerParams& p, const Tensor& q, const Tensor& k,
                       const Tensor& w, const Tensor& indices, const Tensor& target, double dloss,
                       Tensor& loss, Tensor& dscores);
IndexerScoresForward indexer_scores_forward;
IndexerScoresBackward indexer_scores_backward;
TopkSelect topk_select;
IndexerKlForward indexer_kl_forward;
IndexerKlBackward indexer_kl_backward;
}  // namespace cuda

}  // namespace mt::ops
