// CUDA implementations of ops/indexer.h: same signatures as the public entries, which dispatch here
// when their tensors live on the GPU. Declared ahead of src/ops/cuda/indexer.cu: until it lands,
// the entries throw no_cuda_kernel in a CUDA build.
#pragma once

#include "ops/indexer.h"

namespace mt::ops::cuda {

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

}  // namespace mt::ops::cuda
