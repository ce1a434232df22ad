// The CPU path of ops/indexer.h: fp32 loops. Called by the entries after they validated, so it does
// not re-check.
#pragma once

#include "ops/indexer.h"

namespace mt::ops::cpu {

void indexer_scores_forward(Context& ctx, const IndexerParams& p, const Tensor& q, const Tensor& k,
                            const Tensor& w, const Tensor& indices, Tensor& scores);
void indexer_scores_backward(Context& ctx, const IndexerParams& p, const Tensor& q, const Tensor& k,
                             const Tensor& w, const Tensor& indices, const Tensor& dscores,
                             Tensor& dq, Tensor& dk, Tensor& dw);
void topk_select(Context& ctx, const Tensor& scores, const Tensor& candidates, int64_t topk,
                 Tensor& out);
void indexer_kl_forward(Context& ctx, const Tensor& scores, const Tensor& target,
                        const Tensor& indices, Tensor& softmax, Tensor& loss);
void indexer_kl_backward(Context& ctx, const Tensor& softmax, const Tensor& target,
                         const Tensor& indices, double dloss, Tensor& dscores);

}  // namespace mt::ops::cpu
