// The lightning indexer's scores over an index table and their gradients on tensor cores (bf16,
// up to 64 heads, head dims 64 and 128): ops/cuda/indexer_tc.cu. ops/cuda/indexer.cu's entries
// call them where indexer_scores_tc_takes says so and run the direct kernels otherwise.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/indexer.h"

namespace mt::ops::cuda {

// The one rule for the tensor-core path: bf16, heads <= 64, head dim 64 or 128, q and k rows
// 16-byte aligned (cp.async).
bool indexer_scores_tc_takes(const IndexerParams& p, const Tensor& q, const Tensor& k);

void indexer_scores_forward_tc(Context& ctx, const IndexerParams& p, const Tensor& q,
                               const Tensor& k, const Tensor& w, const Tensor& indices,
                               Tensor& scores);
void indexer_scores_backward_tc(Context& ctx, const IndexerParams& p, const Tensor& q,
                                const Tensor& k, const Tensor& w, const Tensor& indices,
                                const Tensor& dscores, Tensor& dq, Tensor& dk, Tensor& dw);

}  // namespace mt::ops::cuda
