// CUDA implementations of ops/attention.h: same signatures as the public entries, which dispatch
// here when their tensors live on the GPU. Declared ahead of src/ops/cuda/attention.cu: until it
// lands, the entries throw no_cuda_kernel in a CUDA build.
#pragma once

#include "ops/attention.h"

namespace mt::ops::cuda {

void causal_indices(const SeqInfo& seq, Tensor& indices);
void attention_forward(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& indices, Tensor& o, Tensor& lse);
void attention_backward(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& indices, const Tensor& o, const Tensor& lse,
                        const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);
void attention_prob_sum(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                        const Tensor& indices, const Tensor& lse, Tensor& out);

}  // namespace mt::ops::cuda
