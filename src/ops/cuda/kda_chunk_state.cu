// Steps 2 and 3 of the chunked KDA core (kda_chunk.cu describes the algorithm) on CUDA cores: the
// forward state pass (each chunk's S0 into `saved`, o, the final state) and the reverse pass (dS
// carried back; Delta, dR and each chunk's outgoing dS left for the products; dh0), one block of
// 16 warps per (document, head, 32 state columns). For bf16 tensors whose shapes fit
// (kda_state_tc.h) the tensor-core passes of kda_state_tc_fwd.cu and kda_state_tc_bwd.cu run
// instead.
#include <cstdint>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kda_chunk_common.cuh"
#include "ops/kda_chunk_layout.h"

namespace mt::ops::cuda {

namespace {

using namespace kda_chunk;

// Copies n floats into shared memory, 16 bytes at a time where both ends allow it.
__device__ __forceinline__ void stage_vec(float* dst, const float* src, int n) {
  int done = 0;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    for (int e = threadIdx.x; e < n / 4; e += blockDim.x)
      reinterpret_cast<float4*>(dst)[e] = reinterpret_cast<const float4*>(src)[e];
    done = n / 4 * 4;
  }
  for (int e = done + threadIdx.x; e < n; e += blockDim.x) dst[e] = src[e];
}

// The state passes: lane = state column; warp w owns the contiguous chunk rows kRowsC w + r and
// state rows kRowsK w + r, so that a thread's operands sit side by side in shared memory and
// arrive four at a time (one 16-byte broadcast load instead of four: these passes are bound by
// instruction issue). Every sum keeps its element order, so the results do not depend on the
// vector width. Each loop keeps one accumulator per row so that the FMA chains run side by side.
// 16 warps: one block per SM fits (its staged chunk takes most of the shared memory), and a
// chunk's steps are sequential, so more warps mean fewer rows per thread on the critical path.
constexpr int kCols = 32;  // state columns per block of the state passes: one per lane
constexpr int kStateThreads = 2 * kThreads;
constexpr int kStateWarps = kStateThreads / 32;
constexpr int kRowsC = kMaxC / kStateWarps;   // chunk rows per warp
constexpr int kRowsK = kMaxKV / kStateWarps;  // state rows per warp

// p[0..3], one 16-byte load where Vec says p is 16-byte aligned. A compile-time choice: a
// run-time one let the compiler issue both forms and select (the passes ran 1.7x slower).
template <bool Vec>
__device__ __forceinline__ float4 ld4(const float* p) {
  if constexpr (Vec)
    return *reinterpret_cast<const float4*>(p);
  else
    return make_float4(p[0], p[1], p[2], p[3]);
}

// acc[r] (op)= sum_x M[(r0 + r) ld + x] s[x kCols] over x < n in order, for the rows r0 + r < rows
// (fma(-m, s, acc) for Sub, as `acc -= m * s` compiles).
template <bool Sub, bool Vec, int R>
__device__ __forceinline__ void rows_dot(const float* M, int ld, int r0, int rows, const float* s,
                                         int n, float (&acc)[R]) {
  const int n4 = n & ~3;
  for (int x = 0; x < n4; x += 4) {
    const float s0 = s[x * kCols], s1 = s[(x + 1) * kCols], s2 = s[(x + 2) * kCols],
                s3 = s[(x + 3) * kCols];
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r0 + r < rows) {
        const float4 m = ld4<Vec>(M + (r0 + r) * ld + x);
        if (Sub) {
          acc[r] -= m.x * s0;
          acc[r] -= m.y * s1;
          acc[r] -= m.z * s2;
          acc[r] -= m.w * s3;
        } else {
          acc[r] += m.x * s0;
          acc[r] += m.y * s1;
          acc[r] += m.z * s2;
          acc[r] += m.w * s3;
        }
      }
  }
  for (int x = n4; x < n; ++x) {
    const float sx = s[x * kCols];
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r0 + r < rows) {
        if (Sub)
          acc[r] -= M[(r0 + r) * ld + x] * sx;
        else
          acc[r] += M[(r0 + r) * ld + x] * sx;
      }
  }
}

// acc[r] += sum_m M[m ld + r0 + r] s[m kCols] over m < n in order (a column block of M), for the
// columns r0 + r < cols.
template <bool Vec, int R>
__device__ __forceinline__ void cols_dot(const float* M, int ld, int r0, int cols, const float* s,
                                         int n, float (&acc)[R]) {
  for (int m = 0; m < n; ++m) {
    const float sm = s[m * kCols];
#pragma unroll
    for (int q = 0; q < R; q += 4) {
      const float* row = M + m * ld + r0 + q;
      if (r0 + q + 3 < cols) {
        const float4 v = ld4<Vec>(row);
        acc[q] += v.x * sm;
        acc[q + 1] += v.y * sm;
        acc[q + 2] += v.z * sm;
        acc[q + 3] += v.w * sm;
      } else {
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (r0 + q + u < cols) acc[q + u] += row[u] * sm;
      }
    }
  }
}

size_t fwd_state_smem(int C, int K) {
  return sizeof(float) * (3 * C * K + C * C + C * kCols + K + K * kCols + C * kCols);
}

// Forward state pass.
// Vec: K and C are multiples of four (16-byte shared loads; the blocks below then start aligned).
template <typename T, bool Vec>
__global__ void __launch_bounds__(kStateThreads) fwd_state_kernel(Args a, T* o) {
  const int64_t n = blockIdx.x, h = blockIdx.y;
  const int K = a.K, V = a.V, C = a.C, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t col = static_cast<int64_t>(blockIdx.z) * kCols + lane;
  const bool cv = col < V;
  const int i0 = kRowsC * w, x0 = kRowsK * w;  // this warp's chunk rows and state rows
  extern __shared__ __align__(16) unsigned char smem[];
  float* Wt = reinterpret_cast<float*>(smem);  // [C][K] staged per chunk
  float* Qt = Wt + C * K;
  float* Kt = Qt + C * K;
  float* At = Kt + C * K;  // [C][C]
  float* Ut = At + C * C;  // [C][kCols]
  float* gLt = Ut + C * kCols;
  float* S = gLt + K;        // [K][kCols]
  float* D = S + K * kCols;  // [C][kCols]
  const KdaChunkLayout& lay = a.lay;
  for (int x = w; x < K; x += kStateWarps)
    S[x * kCols + lane] = a.h0 && cv ? a.h0[((n * a.H + h) * K + x) * V + col] : 0.f;
  for (int64_t c = a.dchunk0[n]; c < a.dchunk0[n + 1]; ++c) {
    const int L = a.clen[c];
    const int64_t t0 = a.ct0[c];
    const float* blk = a.blk(c, h);
    __syncthreads();                          // the previous chunk is done with the staged blocks
    stage_vec(Wt, blk + lay.W(), 3 * C * K);  // W, Qh, Kl are contiguous
    stage_vec(At, blk + lay.Aqk(), C * C);
    for (int e = threadIdx.x; e < C * kCols; e += kStateThreads) {
      const int i = e / kCols, j = e % kCols;
      const int64_t cc = static_cast<int64_t>(blockIdx.z) * kCols + j;
      Ut[e] = cc < V ? blk[lay.U() + i * V + cc] : 0.f;
    }
    for (int x = threadIdx.x; x < K; x += kStateThreads) gLt[x] = blk[lay.gL() + x];
    if (cv)
      for (int x = w; x < K; x += kStateWarps)
        a.saved[((c * a.H + h) * K + x) * V + col] = S[x * kCols + lane];
    __syncthreads();
    // Delta = U - W S0, then o = Qh S0 + Aqk Delta (Aqk is zero above the diagonal).
    float d[kRowsC], acc[kRowsC];
#pragma unroll
    for (int r = 0; r < kRowsC; ++r) {
      d[r] = i0 + r < C ? Ut[(i0 + r) * kCols + lane] : 0.f;
      acc[r] = 0.f;
    }
    rows_dot<true, Vec>(Wt, K, i0, C, S + lane, K, d);
    rows_dot<false, Vec>(Qt, K, i0, C, S + lane, K, acc);
#pragma unroll
    for (int r = 0; r < kRowsC; ++r)
      if (i0 + r < C) D[(i0 + r) * kCols + lane] = i0 + r < L ? d[r] : 0.f;
    __syncthreads();
    rows_dot<false, Vec>(At, C, i0, C, D + lane, L, acc);
#pragma unroll
    for (int r = 0; r < kRowsC; ++r) {
      const int i = i0 + r;
      if (cv && i < L) st(o, ((t0 + i) * a.H + h) * V + col, acc[r]);
    }
    // S = diag(gL) S0 + Kl^T Delta (each lane updates its own column).
    float sn[kRowsK];
#pragma unroll
    for (int r = 0; r < kRowsK; ++r) {
      const int x = x0 + r;
      sn[r] = x < K ? gLt[x] * S[x * kCols + lane] : 0.f;
    }
    cols_dot<Vec>(Kt, K, x0, K, D + lane, L, sn);
#pragma unroll
    for (int r = 0; r < kRowsK; ++r)
      if (x0 + r < K) S[(x0 + r) * kCols + lane] = sn[r];
  }
  __syncthreads();
  if (a.hT && cv)
    for (int x = w; x < K; x += kStateWarps)
      a.hT[((n * a.H + h) * K + x) * V + col] = S[x * kCols + lane];
}

size_t bwd_state_smem(int C, int K) {
  return sizeof(float) * (2 * C * K + 2 * C * C + C * kCols + K + 2 * K * kCols + 4 * C * kCols);
}

// Reverse state pass: carries dS (the gradient of the state leaving the chunk), leaves Delta, dR
// and each chunk's outgoing dS for the parallel passes.
template <typename T, bool Vec>
__global__ void __launch_bounds__(kStateThreads) bwd_state_kernel(Args a, const T* dout) {
  const int64_t n = blockIdx.x, h = blockIdx.y;
  const int K = a.K, V = a.V, C = a.C, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t col = static_cast<int64_t>(blockIdx.z) * kCols + lane;
  const bool cv = col < V;
  const int i0 = kRowsC * w, x0 = kRowsK * w;
  extern __shared__ __align__(16) unsigned char smem[];
  float* B1 = reinterpret_cast<float*>(smem);  // [C][K]: W, later Qh
  float* B2 = B1 + C * K;                      // [C][K]: Kl, later Kb
  float* At = B2 + C * K;                      // [C][C] Aqk
  float* Tt = At + C * C;                      // [C][C] T
  float* Ut = Tt + C * C;                      // [C][kCols]
  float* gLt = Ut + C * kCols;
  float* dS = gLt + K;         // [K][kCols]
  float* S0 = dS + K * kCols;  // [K][kCols]
  float* dO = S0 + K * kCols;  // [C][kCols]
  float* D = dO + C * kCols;
  float* dD = D + C * kCols;
  float* dR = dD + C * kCols;
  const KdaChunkLayout& lay = a.lay;
  for (int x = w; x < K; x += kStateWarps)
    dS[x * kCols + lane] = a.dhT && cv ? a.dhT[((n * a.H + h) * K + x) * V + col] : 0.f;
  for (int64_t c = a.dchunk0[n + 1] - 1; c >= a.dchunk0[n]; --c) {
    const int L = a.clen[c];
    const int64_t t0 = a.ct0[c];
    float* blk = a.blk(c, h);
    float* bb = a.bblk(c, h);
    __syncthreads();  // the previous chunk's dS update is complete
    stage_vec(B1, blk + lay.W(), C * K);
    stage_vec(B2, blk + lay.Kl(), C * K);
    stage_vec(At, blk + lay.Aqk(), 2 * C * C);  // Aqk, T contiguous
    for (int e = threadIdx.x; e < C * kCols; e += kStateThreads) {
      const int i = e / kCols, j = e % kCols;
      const int64_t cc = static_cast<int64_t>(blockIdx.z) * kCols + j;
      Ut[e] = cc < V ? blk[lay.U() + i * V + cc] : 0.f;
      dO[e] = cc < V && i < L ? ld(dout, ((t0 + i) * a.H + h) * V + cc) : 0.f;
    }
    for (int x = threadIdx.x; x < K; x += kStateThreads) gLt[x] = blk[lay.gL() + x];
    for (int x = w; x < K; x += kStateWarps) {
      const int64_t at = ((c * a.H + h) * K + x) * V + col;
      S0[x * kCols + lane] = cv ? a.saved[at] : 0.f;
      if (cv) a.dS[at] = dS[x * kCols + lane];
    }
    __syncthreads();
    // Delta = U - W S0 and dDelta = Kl dS + Aqk^T dO.
    float d[kRowsC], dd[kRowsC];
#pragma unroll
    for (int r = 0; r < kRowsC; ++r) {
      d[r] = i0 + r < C ? Ut[(i0 + r) * kCols + lane] : 0.f;
      dd[r] = 0.f;
    }
    rows_dot<true, Vec>(B1, K, i0, C, S0 + lane, K, d);
    rows_dot<false, Vec>(B2, K, i0, C, dS + lane, K, dd);
    cols_dot<Vec>(At, C, i0, C, dO + lane, L, dd);
#pragma unroll
    for (int r = 0; r < kRowsC; ++r) {
      const int i = i0 + r;
      if (i >= C) continue;
      D[i * kCols + lane] = i < L ? d[r] : 0.f;
      dD[i * kCols + lane] = i < L ? dd[r] : 0.f;
      if (cv && i < L) bb[lay.D() + i * V + col] = d[r];
    }
    __syncthreads();
    // dR = T^T dDelta (T is zero above the diagonal); W and Kl give way to Qh and Kb.
    stage_vec(B1, blk + lay.Qh(), C * K);
    stage_vec(B2, blk + lay.Kb(), C * K);
    float rr[kRowsC] = {};
    cols_dot<Vec>(Tt, C, i0, C, dD + lane, L, rr);
#pragma unroll
    for (int r = 0; r < kRowsC; ++r) {
      const int i = i0 + r;
      if (i >= C) continue;
      dR[i * kCols + lane] = i < L ? rr[r] : 0.f;
      if (cv && i < L) bb[lay.dR() + i * V + col] = rr[r];
    }
    __syncthreads();
    // dS0 = diag(gL) dS + Qh^T dO - Kb^T dR.
    float sn[kRowsK];
#pragma unroll
    for (int r = 0; r < kRowsK; ++r) {
      const int x = x0 + r;
      sn[r] = x < K ? gLt[x] * dS[x * kCols + lane] : 0.f;
    }
    for (int i = 0; i < L; ++i) {
      const float go = dO[i * kCols + lane], gr = dR[i * kCols + lane];
      const float* q = B1 + i * K + x0;
      const float* kb = B2 + i * K + x0;
#pragma unroll
      for (int r = 0; r < kRowsK; r += 4) {
        if (x0 + r + 3 < K) {
          const float4 qv = ld4<Vec>(q + r), kv = ld4<Vec>(kb + r);
          sn[r] += qv.x * go - kv.x * gr;
          sn[r + 1] += qv.y * go - kv.y * gr;
          sn[r + 2] += qv.z * go - kv.z * gr;
          sn[r + 3] += qv.w * go - kv.w * gr;
        } else {
#pragma unroll
          for (int u = 0; u < 4; ++u)
            if (x0 + r + u < K) sn[r + u] += q[r + u] * go - kb[r + u] * gr;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsK; ++r)
      if (x0 + r < K) dS[(x0 + r) * kCols + lane] = sn[r];
  }
  __syncthreads();
  if (a.dh0 && cv)
    for (int x = w; x < K; x += kStateWarps)
      a.dh0[((n * a.H + h) * K + x) * V + col] = dS[x * kCols + lane];
}

dim3 state_grid(const Args& a) {
  return dim3(static_cast<unsigned>(a.N), static_cast<unsigned>(a.H),
              static_cast<unsigned>((a.V + kCols - 1) / kCols));
}

// One state pass (forward or reverse) over every (document, head, 32 columns). Its 16-byte
// shared loads need rows of a multiple of four floats: the vector instantiation where they are.
template <typename Out>
void launch_state(Context& ctx, const Args& a, size_t smem, void (*vec_kernel)(Args, Out*),
                  void (*plain_kernel)(Args, Out*), std::type_identity_t<Out>* arg) {
  auto* kernel = a.K % 4 == 0 && a.C % 4 == 0 ? vec_kernel : plain_kernel;
  allow_smem(kernel, smem);
  kernel<<<state_grid(a), kStateThreads, smem, stream(ctx)>>>(a, arg);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace

namespace kda_chunk {

template <typename T>
void forward_state(Context& ctx, const Args& a, T* o) {
  launch_state(ctx, a, fwd_state_smem(a.C, a.K), fwd_state_kernel<T, true>,
               fwd_state_kernel<T, false>, o);
}

template <typename T>
void backward_state(Context& ctx, const Args& a, const T* dout) {
  launch_state(ctx, a, bwd_state_smem(a.C, a.K), bwd_state_kernel<T, true>,
               bwd_state_kernel<T, false>, dout);
}

template void forward_state<float>(Context&, const Args&, float*);
template void forward_state<__nv_bfloat16>(Context&, const Args&, __nv_bfloat16*);
template void backward_state<float>(Context&, const Args&, const float*);
template void backward_state<__nv_bfloat16>(Context&, const Args&, const __nv_bfloat16*);

}  // namespace kda_chunk

}  // namespace mt::ops::cuda
