// The KDA decay gate's device math, shared by the gate's own kernels (kda_gate.cu) and the
// chunked core's kernels that compute it on the fly (kda_chunk.cu, kda_fwd_tc.cu): one formula,
// so that the fused and the separate paths agree bit for bit on g.
//   g = -exp(A_log[h]) * softplus(raw + dt_bias),  softplus with beta 1 and threshold 20.
#pragma once

#include <cuda_runtime.h>

namespace mt::ops::cuda::kda_gate_math {

__device__ __forceinline__ float softplus(float x) {
  return x > 20.f ? x : log1pf(expf(x));
}
// Derivative of the thresholded softplus (exactly 1 where it is the identity).
__device__ __forceinline__ float softplus_grad(float x) {
  return x > 20.f ? 1.f : 1.f / (1.f + expf(-x));
}
// g from u = raw + dt_bias and a = exp(A_log[h]).
__device__ __forceinline__ float gate(float a, float u) {
  return -a * softplus(u);
}
// dg/draw (= dg/d dt_bias); dg/dA_log is g itself.
__device__ __forceinline__ float gate_grad(float a, float u) {
  return -a * softplus_grad(u);
}

}  // namespace mt::ops::cuda::kda_gate_math
