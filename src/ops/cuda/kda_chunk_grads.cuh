// What the chunked KDA core's two gradient kernels (step 5) share: grads_kernel
// (kda_chunk_grads.cu, with the launcher grads and dbeta_sum_kernel) and grads_v2_kernel
// (kda_chunk_grads_v2.cu): the blocks and the channel halves, ex2, load_n and the tensor-core
// load phase (grad_loads). As kda_chunk_common.cuh, in namespace kda_chunk (no -rdc: each .cu
// compiles its own copy).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kda_chunk_common.cuh"
#include "ops/kda_chunk_layout.h"

namespace mt::ops::cuda::kda_chunk {

// The gradient kernel's blocks: 8 warps. TC (bf16, chunk 64, K 128) splits the channels in
// halves, a block per (chunk, head, half): per-channel quantities (dq, dk, dGam, dg, dGam_L) do
// not mix channels, so only dbeta needs both halves (dbeta_sum_kernel). A half's block takes
// 107 KB of shared memory, so two blocks (16 warps) share an SM and one's barriers hide behind
// the other's work; the other shapes keep one block per (chunk, head).
constexpr int kGradThreads = kThreads;
constexpr int kGradSplit = 2;                              // TC: channel groups per (chunk, head)
constexpr int kHalf = kMaxKV / kGradSplit;                 // TC: channels per block
constexpr int kOwnersMax = kMaxC * kMaxKV / kGradThreads;  // (token, channel) pairs per thread

// 2^x, flushing results below 2^-126 to zero (no pair term that small counts): one instruction
// where __expf takes five (the scaling by log2 e and the subnormal fix-up). TC keeps Gam in units
// of log2 (Gam log2 e) so that every e^(difference) is one of these.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// N consecutive values (N = 2: one 8-byte or, for bf16, 4-byte load) as D.
template <int N, typename S, typename D>
__device__ __forceinline__ void load_n(const S* p, D (&o)[N]) {
  if constexpr (N == 2 && std::is_same_v<S, __nv_bfloat16>) {
    const __nv_bfloat162 v2 = *reinterpret_cast<const __nv_bfloat162*>(p);
    o[0] = __low2float(v2);
    o[1] = __high2float(v2);
  } else if constexpr (N == 2) {
    static_assert(std::is_same_v<S, float>);
    const float2 v2 = *reinterpret_cast<const float2*>(p);
    o[0] = v2.x;
    o[1] = v2.y;
  } else if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    o[0] = __bfloat162float(p[0]);
  } else {
    o[0] = static_cast<D>(p[0]);
  }
}

// The tensor-core gradient kernels' load phase (grads_kernel's TC form and grads_v2_kernel): every
// global read of a thread goes out before the first store, 16 bytes wide (one latency, not one per
// row): q and k (8 bf16 a load), g, Aqk, Tm, beta and, for the rows of the half's parity, KK
// (dbeta's sum_j Tm_ij KK_ij, j < i, while Tm is at hand). The C x C matrices have as many elements
// as [C][kHalf], so the same e serves both; rows past L read as zeros. The kernels store them each
// in their own shared layout.
struct GradLoads {
  uint4 q8[2], k8[2];
  float4 g4[4], aq4[4], tm4[4], kk4[4];
  float be[4];
};

template <typename T>
__device__ __forceinline__ GradLoads grad_loads(const Args& a, const T* q, const T* k,
                                                const float* blk, int64_t t0, int64_t h, int L,
                                                int z, int tid) {
  static_assert(kMaxC == kHalf, "one index for [C][C] and [C][kHalf]");
  constexpr int K = kMaxKV, KH = kHalf;
  const int x0 = z * KH;
  const KdaChunkLayout& lay = a.lay;
  const float4 zero4 = make_float4(0.f, 0.f, 0.f, 0.f);
  GradLoads r;
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const int e = 8 * (tid + kGradThreads * m), i = e / KH;
    r.q8[m] = r.k8[m] = make_uint4(0u, 0u, 0u, 0u);
    if (i < L) {
      const int64_t src = ((t0 + i) * a.H + h) * K + x0 + e % KH;
      r.q8[m] = *reinterpret_cast<const uint4*>(q + src);
      r.k8[m] = *reinterpret_cast<const uint4*>(k + src);
    }
  }
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int e = 4 * (tid + kGradThreads * m), i = e / KH;
    const bool in = i < L;
    r.g4[m] =
        in ? *reinterpret_cast<const float4*>(a.g + ((t0 + i) * a.H + h) * K + x0 + e % KH) : zero4;
    r.aq4[m] = *reinterpret_cast<const float4*>(blk + lay.Aqk() + e);
    r.tm4[m] = *reinterpret_cast<const float4*>(blk + lay.Tm() + e);
    r.kk4[m] = in && (i & 1) == z ? *reinterpret_cast<const float4*>(blk + lay.KK() + e) : zero4;
    r.be[m] = in ? a.beta[(t0 + i) * a.H + h] : 0.f;
  }
  return r;
}

// grads_v2_kernel's launch (kda_chunk_grads_v2.cu), which grads makes where kda_grads_v2() picks
// it (bf16, chunk 64, K 128, the tensor-core gradient kernel's alignment).
void grads_v2(Context& ctx, const Args& a, const Tensor& q, const Tensor& k, const Tensor& v,
              Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace mt::ops::cuda::kda_chunk
