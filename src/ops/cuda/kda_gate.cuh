// The KDA decay gate's device math, shared by the gate's own kernels (kda_gate.cu) and the
// chunked core's kernels that compute it on the fly (kda_chunk.cu, kda_fwd_tc.cu): one formula,
// so that the fused and the separate paths agree bit for bit on g.
//   g = -exp(A_log[h]) * softplus(raw + dt_bias),  softplus with beta 1 and threshold 20.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

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

// The parameter sums' last pass: a column of a [rows][stride] array of partial sums summed over
// its rows in a fixed order, by blocks of kSumCols x kSumGroups threads (threadIdx.x = x +
// kSumCols y): group y takes rows y, y + kSumGroups, ..., then the groups' sums are added in group
// order (bit-repeatable). Rows with live[k] == 0 are skipped where `live` is given. Every thread
// of the block must call it (a barrier); the sum is valid on the threads with y == 0.
constexpr int kSumCols = 32, kSumGroups = 8;

__device__ __forceinline__ float column_sum(const float* col, int64_t rows, int64_t stride,
                                            const int32_t* live, bool in_range) {
  __shared__ float sh[kSumGroups][kSumCols];
  const int x = threadIdx.x % kSumCols, y = threadIdx.x / kSumCols;
  float s = 0.f;
  if (in_range)
    for (int64_t k = y; k < rows; k += kSumGroups)
      if (!live || live[k] > 0) s += col[k * stride];
  sh[y][x] = s;
  __syncthreads();
  float t = 0.f;
  if (y == 0)
    for (int j = 0; j < kSumGroups; ++j) t += sh[j][x];
  return t;
}

}  // namespace mt::ops::cuda::kda_gate_math
