// Step 4 of the chunked KDA core (kda_chunk.cu describes the algorithm), backward's products on
// CUDA cores, per (chunk, head, job): dO S0^T, dR S0^T, Delta dS^T, S0 . dS and the pair matrices
// dO Delta^T, dR Delta^T, tiled through shared memory into the prepared block's slots
// (ops/kda_chunk_layout.h), where the gradient kernels read them. For bf16 where
// kda_bwd_tc.h's products_tc_fits holds, kda_bwd_tc.cu's tensor-core products run instead.
#include <cstddef>
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kda_chunk_common.cuh"
#include "ops/kda_chunk_layout.h"

namespace mt::ops::cuda {

namespace {

using namespace kda_chunk;

// out[i][x] += sum_y A[i][y] B[x][y] over one 32-wide y tile in shared memory (row stride 33):
// the thread's rows 4 ti .. 4 ti + 3 and columns tx + 16 j.
template <int NJ>
__device__ __forceinline__ void tile_nt(const float* As, const float* Bs, int ti, int tx,
                                        float (&acc)[4][NJ]) {
#pragma unroll 4
  for (int y = 0; y < 32; ++y) {
    float av[4], bv[NJ];
#pragma unroll
    for (int r = 0; r < 4; ++r) av[r] = As[(4 * ti + r) * 33 + y];
#pragma unroll
    for (int j = 0; j < NJ; ++j) bv[j] = Bs[(tx + 16 * j) * 33 + y];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int j = 0; j < NJ; ++j) acc[r][j] += av[r] * bv[j];
  }
}

// Rows [0, rows) (zero past `valid`) of a row-major source, columns y0 .. y0+31 (zero past V),
// into a [rows][33] tile. `row` maps a row to its element offset.
template <typename F>
__device__ __forceinline__ void stage(float* tile, int rows, int valid, int y0, int V, F row) {
  for (int e = threadIdx.x; e < rows * 32; e += kThreads) {
    const int r = e >> 5, y = e & 31;
    tile[r * 33 + y] = r < valid && y0 + y < V ? row(r, y0 + y) : 0.f;
  }
}

constexpr size_t kProductSmem = sizeof(float) * 33 * (kMaxC + 2 * kMaxKV);

// The chunk's matrix products over V (job = blockIdx.z):
//   0: M1 = dO S0^T -> dOS0, M2 = dR S0^T -> dRS0;  1: M3 = Delta dS^T -> Args::dds, S0 . dS
//   -> gL;  2: tq = scale dO Delta^T -> Aqk (j <= i), ta = -dR Delta^T -> Tm (j < i)
//   (ops/kda_chunk_layout.h).
template <typename T>
__global__ void __launch_bounds__(kThreads) products_kernel(Args a, const T* dout) {
  const int64_t c = blockIdx.x, h = blockIdx.y;
  const int job = blockIdx.z;
  const int L = a.clen[c];
  if (L == 0) return;
  const int64_t t0 = a.ct0[c];
  const int K = a.K, V = a.V, C = a.C, ti = threadIdx.x >> 4, tx = threadIdx.x & 15;
  extern __shared__ __align__(16) unsigned char smem[];
  float* A1 = reinterpret_cast<float*>(smem);  // [64][33]
  float* A2 = A1 + kMaxC * 33;                 // [128][33]
  float* Bt = A2 + kMaxKV * 33;                // [128][33]
  const KdaChunkLayout& lay = a.lay;
  float* blk = a.blk(c, h);
  // The chunk states fp32 or bf16 (Args::saved_h: the bf16 layout's, where dout or a buffer is
  // off the tensor-core products' alignment).
  const int64_t s0 = (c * a.H + h) * K * V;
  const float* dSn = a.dS + (c * a.H + h) * K * V;
  auto dO = [&](int i, int y) { return ld(dout, ((t0 + i) * a.H + h) * V + y); };
  const float* bb = a.bblk(c, h);
  auto Dl = [&](int i, int y) { return bb[lay.D() + i * V + y]; };
  auto dRl = [&](int i, int y) { return bb[lay.dR() + i * V + y]; };
  auto S0l = [&](int x, int y) {
    return a.saved_h ? __bfloat162float(a.saved_h[s0 + x * V + y]) : a.saved[s0 + x * V + y];
  };
  auto dSl = [&](int x, int y) { return dSn[x * V + y]; };
  if (job < 2) {
    float acc1[4][8] = {}, acc2[4][8] = {};
    float dot = 0.f;  // job 1: S0 . dS of row threadIdx.x
    for (int y0 = 0; y0 < V; y0 += 32) {
      __syncthreads();
      if (job == 0) {
        stage(A1, kMaxC, L, y0, V, dO);
        stage(A2, kMaxC, L, y0, V, dRl);
        stage(Bt, kMaxKV, K, y0, V, S0l);
      } else {
        stage(A1, kMaxC, L, y0, V, Dl);
        stage(Bt, kMaxKV, K, y0, V, dSl);
        stage(A2, kMaxKV, K, y0, V, S0l);
      }
      __syncthreads();
      tile_nt<8>(A1, Bt, ti, tx, acc1);
      if (job == 0) tile_nt<8>(A2, Bt, ti, tx, acc2);
      if (job == 1 && threadIdx.x < K)
        for (int y = 0; y < 32; ++y) dot += A2[threadIdx.x * 33 + y] * Bt[threadIdx.x * 33 + y];
    }
    // job 1 may write into the dS slot it read (the bf16 layout): every read of it lies before
    // the last tile's barrier.
    float* out1 = job == 0 ? blk + lay.dOS0() : a.dds(c, h);
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < 8; ++j) {
        const int i = 4 * ti + r, x = tx + 16 * j;
        if (i < C && x < K) {
          out1[i * K + x] = acc1[r][j];
          if (job == 0) blk[lay.dRS0() + i * K + x] = acc2[r][j];
        }
      }
    if (job == 1 && threadIdx.x < K) blk[lay.gL() + threadIdx.x] = dot;
  } else {
    float tq[4][4] = {}, ta[4][4] = {};
    for (int y0 = 0; y0 < V; y0 += 32) {
      __syncthreads();
      stage(A1, kMaxC, L, y0, V, dO);
      stage(A2, kMaxC, L, y0, V, dRl);
      stage(Bt, kMaxC, L, y0, V, Dl);
      __syncthreads();
      tile_nt<4>(A1, Bt, ti, tx, tq);
      tile_nt<4>(A2, Bt, ti, tx, ta);
    }
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < 4; ++j) {
        const int i = 4 * ti + r, jj = tx + 16 * j;
        if (i < C && jj < C) {
          blk[lay.Aqk() + i * C + jj] = jj <= i ? a.scale * tq[r][j] : 0.f;
          blk[lay.Tm() + i * C + jj] = jj < i ? -ta[r][j] : 0.f;
        }
      }
  }
}

}  // namespace

namespace kda_chunk {

template <typename T>
void products(Context& ctx, const Args& a, const T* dout) {
  const dim3 grid(static_cast<unsigned>(a.nchunks), static_cast<unsigned>(a.H), 3);  // jobs
  allow_smem(products_kernel<T>, kProductSmem);
  products_kernel<T><<<grid, kThreads, kProductSmem, stream(ctx)>>>(a, dout);
  MT_CUDA_LAUNCH_CHECK();
}

template void products<float>(Context&, const Args&, const float*);
template void products<__nv_bfloat16>(Context&, const Args&, const __nv_bfloat16*);

}  // namespace kda_chunk

}  // namespace mt::ops::cuda
