// The chunked KDA backward's products (kda_chunk.cu, step 4) on tensor cores, for bf16 tensors at
// chunk 64 and head dims 64 or 128 (kda_bwd_tc.h). Per (chunk, head, job), sums over V:
//   job 0: dO S0^T -> dOS0, dR S0^T -> dRS0;  job 1: Delta dS^T -> Args::dds, S0 . dS -> gL;
//   job 2: scale dO Delta^T -> Aqk (j <= i), -dR Delta^T -> Tm (j < i), zero elsewhere,
// exactly the slots and meaning of products_kernel (ops/kda_chunk_layout.h), so the gradient
// pass is unchanged. None of
// these products carries a decay factor (the decays enter in the gradient pass), so they are
// plain matrix products. tf32 m16n8k8 MMAs with fp32 accumulation rather than bf16: S0, dS, Delta
// and dR are fp32 state-sized quantities whose magnitudes grow along a document; tf32 rounds them
// to 2^-11, below the 2^-9 of the bf16 inputs and outputs, where bf16 operands would double the
// error budget of the outputs (dO is bf16 already, exact in tf32).
// V runs in tiles of 32 columns through shared memory (rows of 36 floats: 4 mod 32 banks, so the
// A fragments of row-major tiles and the B fragments of the n-major ones, B(k, n) = M[n][k], are
// conflict-free): 46 KB at K = 128, several blocks per SM. Warp w owns rows 16 (w mod 4) .. +15
// and half of the output columns; job 2 skips the n-tiles wholly above the diagonal.
#include <algorithm>
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/index_lists.cuh"
#include "ops/cuda/kda_bwd_tc.h"
#include "ops/cuda/mma.cuh"
#include "ops/kda_chunk_layout.h"
#include "ops/kda_prep_path.h"

namespace mt::ops::cuda::kda_detail {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kC = 64;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kY = 32;       // V columns per shared tile
constexpr int kLd = kY + 4;  // tile row stride in floats
constexpr int kVec = 4;      // floats per vector load

template <int K>
constexpr int tile_rows() {
  return std::max(kC, K);
}

template <int K>
constexpr size_t products_smem() {
  return sizeof(float) * kLd * (kC + 2 * tile_rows<K>());
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Rows [0, Rows) of a source, 32 columns as fp32, zero from row `valid` on, into tile[r kLd + y]:
// load(r, x) reads row r's columns x .. x+3. All loads are issued before any store.
template <int Rows, typename Load>
__device__ __forceinline__ void stage(float* tile, int valid, Load load) {
  constexpr int kPerRow = kY / kVec, kIters = Rows * kPerRow / kThreads;
  static_assert(Rows * kPerRow % kThreads == 0, "whole rounds of vector loads");
  float4 v[kIters];
#pragma unroll
  for (int u = 0; u < kIters; ++u) {
    const int e = threadIdx.x + u * kThreads, r = e / kPerRow, x = (e % kPerRow) * kVec;
    v[u] = r < valid ? load(r, x) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int u = 0; u < kIters; ++u) {
    const int e = threadIdx.x + u * kThreads, r = e / kPerRow, x = (e % kPerRow) * kVec;
    *reinterpret_cast<float4*>(tile + r * kLd + x) = v[u];
  }
}

// An fp32 row-major source (row stride ld, first column at src), as stage reads it.
template <int Rows>
__device__ __forceinline__ void stage_f32(float* tile, int valid, const float* src, int ld) {
  stage<Rows>(tile, valid, [&](int r, int x) {
    return *reinterpret_cast<const float4*>(src + static_cast<int64_t>(r) * ld + x);
  });
}

// The chunk's dO rows (bf16, row stride ld elements, first column at src).
__device__ __forceinline__ void stage_dout(float* tile, int valid, const bf16* src, int64_t ld) {
  stage<kC>(tile, valid, [&](int r, int x) {
    const uint2 u = *reinterpret_cast<const uint2*>(src + r * ld + x);
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  });
}

// The tf32 B fragment (k0 .. k0+7, n0 .. n0+7) of B(k, n) = M[n][k], M an n-major tile.
__device__ __forceinline__ void load_b_nk(uint32_t b[2], const float* m, int n0, int k0, int lane) {
  const int g = lane >> 2, c = lane & 3;
  b[0] = mma::to_tf32(m[(n0 + g) * kLd + k0 + c]);
  b[1] = mma::to_tf32(m[(n0 + g) * kLd + k0 + c + 4]);
}

__device__ __forceinline__ void store2(float* p, float lo, float hi) {
  *reinterpret_cast<float2*>(p) = make_float2(lo, hi);
}

template <int K, int V>
__global__ void __launch_bounds__(kThreads, 2) products_tc_kernel(Args a, const bf16* dout) {
  static_assert(V % kY == 0 && K % 16 == 0 && K <= 128, "whole tiles, eight n-tiles at most");
  static_assert(kWarps == 8 && kC == 64, "four row blocks by two column halves");
  constexpr int R = tile_rows<K>();
  const int64_t c = blockIdx.x, h = blockIdx.y;
  const int job = blockIdx.z;
  const int L = a.clen[c];
  if (L == 0) return;
  const int64_t t0 = a.ct0[c];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q4 = lane & 3;
  const int m0 = 16 * (w & 3);
  extern __shared__ __align__(16) unsigned char smem[];
  float* A1 = reinterpret_cast<float*>(smem);  // [64][kLd]: dO or Delta
  float* A2 = A1 + kC * kLd;                   // [R][kLd]: dR or S0
  float* Bt = A2 + R * kLd;                    // [R][kLd]: S0, dS or Delta (n-major)
  const KdaChunkLayout& lay = a.lay;
  float* blk = a.blk(c, h);
  const float* bb = a.bblk(c, h);
  const float* S0 = a.saved + (c * a.H + h) * K * V;
  const float* dSn = a.dS + (c * a.H + h) * K * V;
  const bf16* dO = dout + (t0 * a.H + h) * V;
  const int64_t ldo = a.H * V;
  if (job < 2) {
    constexpr int NT = K / 16;  // n-tiles of the warp's half of K
    const int n0 = (w >> 2) * (K / 2);
    float acc1[NT][4] = {}, acc2[NT][4] = {};
    float dot[K / kWarps] = {};  // job 1: rows w + 8 u of S0 . dS, the lane's column of the tile
    for (int y0 = 0; y0 < V; y0 += kY) {
      __syncthreads();  // the previous tile is consumed
      if (job == 0) {
        stage_dout(A1, L, dO + y0, ldo);
        stage_f32<kC>(A2, L, bb + lay.dR() + y0, V);
        stage_f32<K>(Bt, K, S0 + y0, V);
      } else {
        stage_f32<kC>(A1, L, bb + lay.D() + y0, V);
        stage_f32<K>(A2, K, S0 + y0, V);
        stage_f32<K>(Bt, K, dSn + y0, V);
      }
      __syncthreads();
#pragma unroll
      for (int k0 = 0; k0 < kY; k0 += 8) {
        uint32_t a1[4], a2[4] = {};
        mma::load_a_tf32<false>(a1, A1, kLd, m0, k0, lane);
        if (job == 0) mma::load_a_tf32<false>(a2, A2, kLd, m0, k0, lane);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          uint32_t b[2];
          load_b_nk(b, Bt, n0 + 8 * nt, k0, lane);
          mma::mma_tf32(acc1[nt], a1, b);
          if (job == 0) mma::mma_tf32(acc2[nt], a2, b);
        }
      }
      if (job == 1) {
#pragma unroll
        for (int u = 0; u < K / kWarps; ++u) {
          const int x = w + kWarps * u;
          dot[u] += A2[x * kLd + lane] * Bt[x * kLd + lane];
        }
      }
    }
    // Job 1 may write into the dS slot it read (the bf16 layout, Args::dds): every read of it
    // lies before the last tile's barrier, and no other block reads it.
    float* out1 = job == 0 ? blk + lay.dOS0() : a.dds(c, h);
    float* out2 = blk + lay.dRS0();
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int at = (m0 + g + 8 * hf) * K + n0 + 8 * nt + 2 * q4;
        store2(out1 + at, acc1[nt][2 * hf], acc1[nt][2 * hf + 1]);
        if (job == 0) store2(out2 + at, acc2[nt][2 * hf], acc2[nt][2 * hf + 1]);
      }
    if (job == 1) {
#pragma unroll
      for (int u = 0; u < K / kWarps; ++u) {
        const float s = warp_sum(dot[u]);
        if (lane == 0) blk[lay.gL() + w + kWarps * u] = s;
      }
    }
  } else {
    const int n0 = 32 * (w >> 2);  // the warp's half of the chunk's 64 columns
    float tq[4][4] = {}, ta[4][4] = {};
    for (int y0 = 0; y0 < V; y0 += kY) {
      __syncthreads();
      stage_dout(A1, L, dO + y0, ldo);
      stage_f32<kC>(A2, L, bb + lay.dR() + y0, V);
      stage_f32<kC>(Bt, L, bb + lay.D() + y0, V);
      __syncthreads();
#pragma unroll
      for (int k0 = 0; k0 < kY; k0 += 8) {
        uint32_t a1[4], a2[4];
        mma::load_a_tf32<false>(a1, A1, kLd, m0, k0, lane);
        mma::load_a_tf32<false>(a2, A2, kLd, m0, k0, lane);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
          if (n0 + 8 * nt <= m0 + 15) {  // some j <= i in the tile
            uint32_t b[2];
            load_b_nk(b, Bt, n0 + 8 * nt, k0, lane);
            mma::mma_tf32(tq[nt], a1, b);
            mma::mma_tf32(ta[nt], a2, b);
          }
      }
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = m0 + g + 8 * hf, j = n0 + 8 * nt + 2 * q4;
        const float* q = tq[nt] + 2 * hf;
        const float* r = ta[nt] + 2 * hf;
        store2(blk + lay.Aqk() + i * kC + j, j <= i ? a.scale * q[0] : 0.f,
               j + 1 <= i ? a.scale * q[1] : 0.f);
        store2(blk + lay.Tm() + i * kC + j, j < i ? -r[0] : 0.f, j + 1 < i ? -r[1] : 0.f);
      }
  }
}

template <int K, int V>
void launch(Context& ctx, const Args& a, const bf16* dout) {
  const size_t sm = smem_for(products_tc_kernel<K, V>, products_smem<K>(), "kda_backward");
  products_tc_kernel<K, V><<<dim3(static_cast<unsigned>(a.nchunks), static_cast<unsigned>(a.H), 3),
                             kThreads, sm, stream(ctx)>>>(a, dout);
  MT_CUDA_LAUNCH_CHECK();
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

}  // namespace

bool products_tc_fits(const Args& a, const void* dout) {
  const KdaParams p{.head_k = a.K, .head_v = a.V, .chunk = a.C};
  return kda_bf16_prep_path(p) == KdaPrepPath::TensorCoreBf16 && aligned16(dout) &&
         aligned16(a.saved) && aligned16(a.ws) && aligned16(a.back) && aligned16(a.dS);
}

void products_tc(Context& ctx, const Args& a, const bf16* dout) {
  if (a.K == 64 && a.V == 64) return launch<64, 64>(ctx, a, dout);
  if (a.K == 64 && a.V == 128) return launch<64, 128>(ctx, a, dout);
  if (a.K == 128 && a.V == 64) return launch<128, 64>(ctx, a, dout);
  MT_CHECK(a.K == 128 && a.V == 128, ValueError, "kda tensor-core products: head_k ", a.K,
           " head_v ", a.V, " (products_tc_fits admits 64 and 128)");
  launch<128, 128>(ctx, a, dout);
}

}  // namespace mt::ops::cuda::kda_detail
