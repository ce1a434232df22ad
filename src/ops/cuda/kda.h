// CUDA implementations of ops/kda.h: same signatures as the public entries, which dispatch here
// when their tensors live on the GPU. Declared ahead of src/ops/cuda/kda.cu: until it lands, the
// entries throw no_cuda_kernel in a CUDA build.
#pragma once

#include "ops/kda.h"

namespace mt::ops::cuda {

void kda_forward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                 const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                 const Tensor& h0, Tensor& o, Tensor& hT, Tensor& saved);
void kda_backward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                  const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                  const Tensor& saved, const Tensor& dout, const Tensor& dhT, Tensor& dq,
                  Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta, Tensor& dh0);

}  // namespace mt::ops::cuda
