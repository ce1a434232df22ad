// The chunked KDA kernels (kda_chunk.cu, the kernels of its steps in kda_chunk_*.cu), called by
// ops/cuda/kda.cu's entries for the chunked algorithm where kda_chunk_kernel_fits holds (the
// direct recurrence serves the rest).
#pragma once

#include "ops/kda.h"

namespace mt::ops::cuda {

void kda_chunk_forward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                       const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                       const Tensor& h0, Tensor& o, Tensor& hT, Tensor& saved, Tensor& prepared);
void kda_chunk_backward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        const Tensor& saved, Tensor& prepared, const Tensor& dout,
                        const Tensor& dhT, Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg,
                        Tensor& dbeta, Tensor& dh0);

}  // namespace mt::ops::cuda
