// CUDA implementations of ops/embedding.h: same signatures as the public entries, which dispatch
// here when their tensors live on the GPU. Defined in src/ops/cuda/embedding.cu.
#pragma once

#include "ops/embedding.h"

namespace mt::ops::cuda {

void embedding_forward(Context& ctx, const EmbeddingParams& p, const Tensor& ids,
                       const Tensor& table, Tensor& y);
void embedding_backward(Context& ctx, const EmbeddingParams& p, const Tensor& ids, const Tensor& dy,
                        Tensor& dtable);

}  // namespace mt::ops::cuda
