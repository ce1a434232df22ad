// The chunked KDA kernels (kda_chunk.cu), called by ops/cuda/kda.cu's entries for the chunked
// algorithm where kda_chunk_kernel_fits holds (the direct recurrence serves the rest).
#pragma once

#include "ops/kda.h"

namespace mt::ops::cuda {

// The fused decay gate (ops/kda.h, kda_gated_*): the kernels compute g from raw (q's dtype),
// A_log and dt_bias (f32) where they would read it; backward writes draw in place of dg and adds
// the parameter sums into da_log and ddt_bias (each skipped when undefined).
struct KdaChunkGate {
  const Tensor* raw = nullptr;
  const Tensor* a_log = nullptr;
  const Tensor* dt_bias = nullptr;
  Tensor* draw = nullptr;  // backward only, like the two below
  Tensor* da_log = nullptr;
  Tensor* ddt_bias = nullptr;
};

// `gate` null: g (and backward's dg) are the f32 tensors; otherwise they are undefined.
void kda_chunk_forward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                       const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                       const Tensor& h0, Tensor& o, Tensor& hT, Tensor& saved, Tensor& prepared,
                       const KdaChunkGate* gate = nullptr);
void kda_chunk_backward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        const Tensor& saved, Tensor& prepared, const Tensor& dout,
                        const Tensor& dhT, Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg,
                        Tensor& dbeta, Tensor& dh0, const KdaChunkGate* gate = nullptr);

}  // namespace mt::ops::cuda
