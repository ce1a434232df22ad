// CUDA implementations of ops/overflow_route.h: same signatures as the public entries, which
// dispatch here when their tensors live on the GPU. Declared ahead of
// src/ops/cuda/overflow_route.cu: until it lands, the entries throw no_cuda_kernel in a CUDA build.
#pragma once

#include "ops/overflow_route.h"

namespace mt::ops::cuda {

OverflowStats overflow_route_forward(Context& ctx, const OverflowParams& p, const RouterParams& rp,
                                     const std::vector<int32_t>& expert_rank, const Tensor& scores,
                                     const Tensor& bias, const Tensor& cand, Tensor& ids,
                                     Tensor& weights);

}  // namespace mt::ops::cuda
