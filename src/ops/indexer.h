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
IndexerScoresForward indexer_scores_forward;
IndexerScoresBackward indexer_scores_backward;
TopkSelect topk_select;
IndexerKlForward indexer_kl_forward;
IndexerKlBackward indexer_kl_backward;
}  // namespace cuda

}  // namespace mt::ops
