// The tensor-core path of dense causal attention (flash_attention.cu), called by
// ops/cuda/attention.cu's causal entries for bf16 tensors that flash_attention_fits accepts.
#pragma once

#include "ops/attention.h"

namespace mt::ops::cuda {

void flash_attention_forward(Context& ctx, const AttentionParams& p, const Tensor& cu_seqlens,
                             const Tensor& q, const Tensor& k, const Tensor& v, Tensor& o,
                             Tensor& lse);
void flash_attention_backward(Context& ctx, const AttentionParams& p, const Tensor& cu_seqlens,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                              const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                              Tensor& dv);

}  // namespace mt::ops::cuda
