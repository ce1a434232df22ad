// Column sums of a per-element quantity over many rows, the shape of every parameter gradient of a
// norm or bias: partial sums per chunk of rows into workspace, then one fixed-order pass adds them
// into the gradient. Deterministic (no atomics), coalesced along the columns.
#pragma once

#include <algorithm>

#include "core/arena.h"
#include "ops/cuda/common.cuh"

namespace mt::ops::cuda {

constexpr int64_t kColsumRowsPerChunk = 64;
constexpr int64_t kColsumMaxChunks = 65535;  // a grid's y extent

template <typename F>
__global__ void colsum_partial_kernel(int64_t rows, int64_t cols, int64_t per_chunk, float* partial,
                                      F f) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  if (c >= cols) return;
  const int64_t r0 = chunk * per_chunk;
  const int64_t r1 = r0 + per_chunk < rows ? r0 + per_chunk : rows;
  float s = 0.f;
  for (int64_t r = r0; r < r1; ++r) s += f(r, c);
  partial[chunk * cols + c] = s;
}

__global__ inline void colsum_finish_kernel(int64_t chunks, int64_t cols, const float* partial,
                                            float* out) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float s = 0.f;
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * cols + c];
  out[c] += s;  // parameter gradients accumulate
}

// out[c] += sum over r < rows of f(r, c); out is f32 [cols] on the device.
template <typename F>
void colsum_accumulate(Context& ctx, int64_t rows, int64_t cols, float* out, F f) {
  if (rows == 0 || cols == 0) return;
  // Longer chunks past 65535 of them (per-head norms at 131072 tokens have 4M rows).
  const int64_t per_chunk =
      std::max(kColsumRowsPerChunk, (rows + kColsumMaxChunks - 1) / kColsumMaxChunks);
  const int64_t chunks = (rows + per_chunk - 1) / per_chunk;
  ArenaScope scope(ctx.workspace());
  Tensor partial = ctx.workspace().alloc({chunks, cols});
  const int threads = 256;
  const dim3 grid(blocks_for(cols, threads), static_cast<unsigned>(chunks));
  colsum_partial_kernel<<<grid, threads, 0, stream(ctx)>>>(rows, cols, per_chunk,
                                                           ptr<float>(partial), f);
  MT_CUDA_LAUNCH_CHECK();
  colsum_finish_kernel<<<blocks_for(cols, threads), threads, 0, stream(ctx)>>>(
      chunks, cols, ptr<float>(partial), out);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::ops::cuda
