// The tensor-core path of attention over index lists (dsa_sparse_attention.cu), called by
// ops/cuda/attention.cu's entries for bf16 tensors that sparse_attention_fits accepts; the
// backward only outside deterministic mode (its key gradients add with float atomics).
#pragma once

#include "ops/attention.h"

namespace mt::ops::cuda {

void sparse_attention_forward(Context& ctx, const AttentionParams& p, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& indices, Tensor& o,
                              Tensor& lse);
void sparse_attention_backward(Context& ctx, const AttentionParams& p, const Tensor& q,
                               const Tensor& k, const Tensor& v, const Tensor& indices,
                               const Tensor& o, const Tensor& lse, const Tensor& dout, Tensor& dq,
                               Tensor& dk, Tensor& dv);

}  // namespace mt::ops::cuda
