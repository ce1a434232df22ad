// The chunked KDA's state passes on tensor cores, for bf16 tensors (kda_state_tc.h): what their
// kernels share. The algorithm and the prepared blocks are kda_chunk.cu's; only the state passes
// change.
//
// What is sequential is the recurrence alone; everything that does not depend on the carried
// state leaves the sequential kernels:
//   forward:  per (document, head, 16 or 32 columns), chunk after chunk: Delta = U - W S0 and
//             S = diag(gL) S0 + Kl^T Delta; S0 goes to `saved`; the chunk's output columns
//             o = Qh S0 + Aqk Delta are formed in the same step from the S0 and Delta tiles the
//             block holds anyway (independent of the recurrence, their MMAs interleave with the
//             state update's; no Delta round trip through HBM, no second pass re-reading S0).
//   backward: (1) per (chunk, head, 64 columns), in parallel: Delta = U - W S0 into D,
//             E = Aqk^T dO into dR's place and F = Qh^T dO into the chunk's dS slot;
//             (2) per (document, head, 16 or 32 columns), in reverse: dDelta = E + Kl dS,
//             dR = T^T dDelta, dS = diag(gL) dS + F - Kb^T dR; each chunk's outgoing dS replaces
//             F in its slot, dR replaces E.
// Every product is a warp-level tf32 MMA (mma.cuh) over tiles in shared memory: tf32's rounding
// (2^-11) stays below the bf16 rounding of every input and output (2^-9). W, Qh, Kl, U and Kb are
// fp32 or, with the prepared block's bf16 layout (ops/kda_chunk_layout.h), bf16 (E below; exact
// in tf32, and half the bytes to stage); T, Aqk, the states, Delta, dR and dO stay fp32. The state
// is carried in the MMA accumulators (fp32) of the warp that owns its rows, and copied to shared
// memory once per chunk as the B operand of W S0 / Kl dS. The sequential kernels stage the next
// chunk's W, Kl, T, Kb through cp.async as soon as the current chunk is done with each (one buffer
// each: two blocks of 4 warps then fit per SM, and 16-column blocks give 8 per head: the grid fills
// the GPU with one document of 32 heads).
//
// kda_state_tc_fwd.cu holds the forward pass (fwd_state_tc_kernel, fwd_state_v2_kernel, the
// overlapped forward) and kda_state_tc.h's forward entries, kda_state_tc_bwd.cu the backward's
// (bwd_pre_tc_kernel, bwd_state_tc_kernel, bwd_state_v2_kernel). Device code is compiled without
// -rdc, each .cu a whole program of its own, so the helpers their kernels share are defined here,
// in namespace kda_detail::state_tc. Each .cu keeps its kernels in an anonymous namespace of
// kda_detail, as the one file did (the kernel names the profilers report stay the same).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "core/cuda/check.h"
#include "ops/cuda/kda_chunk_args.cuh"
#include "ops/cuda/mma.cuh"

namespace mt::ops::cuda::kda_detail::state_tc {

using bf16 = __nv_bfloat16;

constexpr int kC = 64;   // chunk
constexpr int kK = 128;  // largest head_k, head_v
constexpr int kNB = 16;  // state columns per block of the sequential passes
constexpr int kNO = 64;  // columns per block of the parallel passes
constexpr int kThreads = 128;
// Shared row strides (floats) that make mma.cuh's fragment loads conflict-free and keep rows
// 16-byte aligned for cp.async: row-major A operands over C columns, transposed A operands whose
// rows run over C, and B operands of kNB or kNO columns (the prepared operands over K: OpLd).
constexpr int kLdRowC = kC + 4, kLdTrC = kC + 8;
constexpr int kLdNB = kNB + 8, kLdNO = kNO + 8;

// rows x cols elements (fp32 or bf16; cols a multiple of 16 bytes, rows of the source gld apart)
// into a shared tile of row stride sld, 16 bytes per cp.async (complete at the caller's
// cp_async_wait).
template <typename E>
__device__ __forceinline__ void stage(E* dst, int sld, const E* src, int64_t gld, int rows,
                                      int cols) {
  constexpr int kPer16 = 16 / sizeof(E);
  const int per = cols / kPer16;
  for (int e = threadIdx.x; e < rows * per; e += kThreads) {
    const int r = e / per, q = (e - r * per) * kPer16;
    mma::cp_async16(dst + r * sld + q, src + r * gld + q);
  }
}

// Shared row strides (elements) of the prepared operands W, Qh, Kl, Kb (fp32 or bf16 E):
// row-major A operands and transposed ones (mma.cuh's conflict-free conditions; rows 16-byte
// aligned for cp.async).
template <typename E>
struct OpLd {
  static constexpr int row = sizeof(E) == 4 ? kK + 4 : kK + 8;
  static constexpr int tr = kK + 8;
};

// A prepared operand of the block (its layout's slot at `at`) as E.
template <typename E>
__device__ __forceinline__ const E* slot(const float* blk, int64_t at) {
  return reinterpret_cast<const E*>(blk + at);
}

__device__ __forceinline__ float2 ld2(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}
__device__ __forceinline__ float2 ld2(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

// The accumulator tile acc[NT][4] of rows m0 .. m0+15: f(row, col, acc element pair) for its
// two rows, columns 8 nt + 2c (and + 1).
template <int NT, typename F>
__device__ __forceinline__ void for_pairs(float (&acc)[NT][4], int m0, int lane, F f) {
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    f(m0 + g, 8 * nt + 2 * c, acc[nt][0], acc[nt][1]);
    f(m0 + g + 8, 8 * nt + 2 * c, acc[nt][2], acc[nt][3]);
  }
}

// for_pairs over the warp's state m-tiles that lie below K (rows 16 (w + 4 mt) + ...).
template <int NT, typename F>
__device__ __forceinline__ void for_state_pairs(float (&s)[2][NT][4], int K, int lane, F f) {
  const int w = threadIdx.x >> 5;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
    if (16 * (w + 4 * mt) < K) for_pairs(s[mt], 16 * (w + 4 * mt), lane, f);
}

__device__ __forceinline__ float2* at2(float* p) {
  return reinterpret_cast<float2*>(p);
}
__device__ __forceinline__ const float2* at2(const float* p) {
  return reinterpret_cast<const float2*>(p);
}

// The state tile a warp of the sequential passes carries (rows 16 (w + 4 mt) + ..., kNB columns)
// to dst, or else from src (zeros where src is null), [K][V] states whose column block starts
// there.
template <int NT>
__device__ __forceinline__ void state_io(float (&s)[2][NT][4], const float* src, float* dst, int K,
                                         int V) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const int x0 = 16 * (w + 4 * mt);
    for_pairs(s[mt], x0, lane, [&](int x, int col, float& s0, float& s1) {
      if (dst) {
        if (x0 < K) *at2(dst + x * V + col) = make_float2(s0, s1);
        return;
      }
      const float2 v = src && x0 < K ? *at2(src + x * V + col) : make_float2(0.f, 0.f);
      s0 = v.x;
      s1 = v.y;
    });
  }
}

// Fragment helpers of the v2 state passes (fwd_state_v2_kernel in kda_state_tc_fwd.cu,
// bwd_state_v2_kernel in kda_state_tc_bwd.cu): bf16 A operands through ldmatrix, fp32 B operands
// stored transposed and already tf32 so that one 16-byte load gives both k8 steps of a 16-row
// block, compile-time cp.async loops and L2 prefetch.

// Row stride (floats) of a transposed B operand over nk values of k: 16 mod 32, so that a
// quarter warp's 16-byte loads (two rows) cover the 32 banks once.
constexpr int bt_ld(int nk) {
  return nk + 16;
}

// rows x COLS elements of E from global rows gld apart into shared rows sld apart, 16 bytes per
// cp.async, trip counts known at compile time.
template <int ROWS, int COLS, typename E>
__device__ __forceinline__ void stage_ct(E* dst, int sld, const E* src, int64_t gld) {
  constexpr int kPer = 16 / sizeof(E), kRow = COLS / kPer, kN = ROWS * kRow;
  static_assert(COLS % kPer == 0, "rows of whole 16-byte pieces");
#pragma unroll
  for (int j = 0; j < (kN + kThreads - 1) / kThreads; ++j) {
    const int e = j * kThreads + static_cast<int>(threadIdx.x);
    if (kN % kThreads == 0 || e < kN) {
      const int r = e / kRow, q = (e % kRow) * kPer;
      mma::cp_async16(dst + r * sld + q, src + r * gld + q);
    }
  }
}

__device__ __forceinline__ float tf32_value(float x) {
  return __uint_as_float(mma::to_tf32(x));
}

// An accumulator tile (k rows x0 .. x0+15, n columns 8 nt + 2c, + 1) into a transposed B operand:
// row n, 16-byte chunk (x0 / 4 + g / 2) XOR 2 ((n / 2) mod 4), at 2 (g mod 2) in it the pair
// (k = x0 + g, x0 + g + 8): so that a 16-row block's lane c finds k = 2c, 2c+8, 2c+1, 2c+9 in its
// chunk c. Rounded to tf32 here, once. The XOR keeps both these 8-byte stores and bt_load's
// 16-byte loads conflict-free.
template <int NT>
__device__ __forceinline__ void bt_store(float* dst, int ld, const float (&v)[NT][4], int x0,
                                         int lane) {
  const int g = lane >> 2, c = lane & 3;
  // Rows n = 8 nt + 2c (+ 1): (n / 2) mod 4 = c.
  const int off = 4 * (((x0 >> 2) + (g >> 1)) ^ (2 * c)) + 2 * (g & 1);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float* row = dst + (8 * nt + 2 * c) * ld + off;
    *at2(row) = make_float2(tf32_value(v[nt][0]), tf32_value(v[nt][2]));
    *at2(row + ld) = make_float2(tf32_value(v[nt][1]), tf32_value(v[nt][3]));
  }
}

// The B fragments of both k8 steps of 16-row block kb, n-tiles 0 .. NT-1: lane (g, c) reads row
// 8 nt + g, chunk (4 kb + c) XOR 2 ((g / 2) mod 4) (bt_store's swizzle: it depends on g only).
template <int NT>
__device__ __forceinline__ void bt_load(float4 (&b)[NT], const float* src, int ld, int kb,
                                        int lane) {
  const int g = lane >> 2, c = lane & 3;
  const float* p = src + g * ld + 4 * ((4 * kb + c) ^ (2 * ((g >> 1) & 3)));
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) b[nt] = *reinterpret_cast<const float4*>(p + 8 * nt * ld);
}

// acc0 (step 0) + acc1 (step 1) += A B over a 16-row block of k: A an ldmatrix fragment of bf16
// pairs (step 0 takes the low halves, k = 2c and 2c+8; step 1 the high ones, k = 2c+1 and 2c+9),
// B from bt_load. Two accumulators (summed by the caller) give twice the independent chains to the
// products whose warp has only NT output tiles.
__device__ __forceinline__ void mma_k16_split(float (&acc0)[4], float (&acc1)[4],
                                              const uint32_t (&a)[4], float4 b) {
  const uint32_t lo[4] = {a[0] << 16, a[1] << 16, a[2] << 16, a[3] << 16};
  const uint32_t hi[4] = {a[0] & 0xffff0000u, a[1] & 0xffff0000u, a[2] & 0xffff0000u,
                          a[3] & 0xffff0000u};
  const uint32_t b0[2] = {__float_as_uint(b.x), __float_as_uint(b.y)};
  const uint32_t b1[2] = {__float_as_uint(b.z), __float_as_uint(b.w)};
  mma::mma_tf32(acc0, lo, b0);
  mma::mma_tf32(acc1, hi, b1);
}

// The same into one accumulator (both steps in turn).
__device__ __forceinline__ void mma_k16(float (&acc)[4], const uint32_t (&a)[4], float4 b) {
  mma_k16_split(acc, acc, a, b);
}

// The 128-byte lines of [p, p + bytes) whose index is `part` mod `parts` into L2, so that the
// blocks sharing a head (one part each) pull a later chunk's operands from HBM once and ahead of
// their cp.async.
__device__ __forceinline__ void prefetch_l2(const float* p, int64_t floats, int part, int parts) {
  const char* b = reinterpret_cast<const char*>(p);
  const int64_t bytes = floats * static_cast<int64_t>(sizeof(float));
  for (int64_t j = static_cast<int64_t>(threadIdx.x) * parts + part; j * 128 < bytes;
       j += static_cast<int64_t>(kThreads) * parts)
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(b + j * 128));
}

// Host side, for the launchers of both passes: the sequential passes' grid (document, head,
// nb-column block).
inline dim3 state_grid(const Args& a, int nb = kNB) {
  return dim3(static_cast<unsigned>(a.N), static_cast<unsigned>(a.H),
              static_cast<unsigned>(a.V / nb));
}

// Two blocks per SM: where kNB-column blocks would need a second wave, 2 kNB columns each.
inline bool wide_state(const Args& a) {
  int dev = 0, sms = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  MT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return a.N * a.H * (a.V / kNB) > 2 * static_cast<int64_t>(sms) && a.V % (2 * kNB) == 0;
}

}  // namespace mt::ops::cuda::kda_detail::state_tc
