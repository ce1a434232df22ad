// CUDA implementations of ops/pos_embed.h: same signatures as the public entries, which dispatch
// here when their tensors live on the GPU. Defined in src/ops/cuda/pos_embed.cu (not landed yet).
#pragma once

#include "ops/pos_embed.h"

namespace mt::ops::cuda {

void pos_embed_forward(Context& ctx, const PosEmbedParams& p, const Tensor& idx, const Tensor& wts,
                       const Tensor& table, const Tensor& x, Tensor& y);
void pos_embed_backward(Context& ctx, const PosEmbedParams& p, const Tensor& idx, const Tensor& wts,
                        const Tensor& dy, Tensor& dtable);

}  // namespace mt::ops::cuda
