// CUDA implementations of ops/moe_dispatch.h: same signatures as the public entries, which dispatch
// here when their tensors live on the GPU. Declared ahead of src/ops/cuda/moe_dispatch.cu: until it
// lands, the entries throw no_cuda_kernel in a CUDA build.
#pragma once

#include "ops/moe_dispatch.h"

namespace mt::ops::cuda {

void moe_dispatch_plan(Context& ctx, const Tensor& ids, int64_t experts, Tensor& perm, Tensor& inv,
                       Tensor& offsets);
void moe_gather(Context& ctx, const Tensor& x, const Tensor& perm, int64_t top_k, Tensor& rows);
void moe_gather_backward(Context& ctx, const Tensor& drows, const Tensor& inv, int64_t top_k,
                         Tensor& dx, bool accumulate = false);
void moe_combine(Context& ctx, const Tensor& rows, const Tensor& weights, const Tensor& inv,
                 Tensor& y);
void moe_combine_backward(Context& ctx, const Tensor& rows, const Tensor& weights,
                          const Tensor& inv, const Tensor& dy, Tensor& drows, Tensor& dweights);

}  // namespace mt::ops::cuda
