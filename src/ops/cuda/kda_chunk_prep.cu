// Step 1 of the chunked KDA core (kda_chunk.cu describes the algorithm) on CUDA cores: the prep
// kernel, one block per (chunk, head), builds everything that does not depend on the state
// entering the chunk (Aqk, KK, T, W, U, Qh, Kl, Kb, gL) into the prepared block
// (ops/kda_chunk_layout.h); for bf16 at chunk 64 and K 128 the pairs across 16-row blocks on
// tensor cores (prep_block_pairs). Its launcher, prep, sends bf16 on the tensor-core path to
// kda_fwd_tc.cu's prep instead.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kda_chunk_common.cuh"
#include "ops/cuda/kda_fwd_tc.h"
#include "ops/cuda/mma.cuh"
#include "ops/kda_chunk_layout.h"
#include "ops/kda_prep_path.h"

namespace mt::ops::cuda {

namespace {

using namespace kda_chunk;

// Gam (Wide) and the chunk's q, k rows (fp32, zero past L) into shared memory. g is read in
// coalesced rows first, then summed down each channel.
template <typename T, typename W>
__device__ void load_chunk(const Args& a, int64_t t0, int L, int64_t h, const T* q, const T* k,
                           W* gam, float* qs, float* ks, float* b) {
  const int C = a.C, K = a.K;
  for (int i = threadIdx.x; i < C; i += blockDim.x) b[i] = i < L ? a.beta[(t0 + i) * a.H + h] : 0.f;
  for (int e = threadIdx.x; e < C * K; e += blockDim.x) {
    const int i = e / K, x = e % K;
    const int64_t src = ((t0 + i) * a.H + h) * K + x;
    qs[e] = i < L ? ld(q, src) : 0.f;
    ks[e] = i < L ? ld(k, src) : 0.f;
    gam[e] = i < L ? static_cast<W>(a.g[src]) : W(0);
  }
  __syncthreads();
  for (int x = threadIdx.x; x < K; x += blockDim.x) {
    W acc = 0;
    for (int i = 0; i < C; ++i) {
      acc += gam[i * K + x];
      gam[i * K + x] = acc;
    }
  }
}

// (i, j) with j <= i of the p-th pair in row-major lower-triangle order.
__device__ __forceinline__ void pair_of(int p, int& i, int& j) {
  i = static_cast<int>((sqrtf(8.f * p + 1.f) - 1.f) * 0.5f);
  while ((i + 1) * (i + 2) / 2 <= p) ++i;
  while (i * (i + 1) / 2 > p) --i;
  j = p - i * (i + 1) / 2;
}

// out[i][x] = sum_{j <= i, j < L} Tm[i][j] src[j][x] for i < C, x < n (register-blocked: rows
// 4 ti .. 4 ti + 3, columns tx + 16 c), written to dst (row stride n).
__device__ __forceinline__ void lower_times(const float* tm, int C, int L, const float* src, int n,
                                            float* dst) {
  const int ti = threadIdx.x >> 4, tx = threadIdx.x & 15;
  float acc[4][8] = {};
  for (int j = 0; j < L; ++j) {
    float tv[4], sv[8];
#pragma unroll
    for (int r = 0; r < 4; ++r) tv[r] = 4 * ti + r < C ? tm[(4 * ti + r) * C + j] : 0.f;
#pragma unroll
    for (int c = 0; c < 8; ++c) sv[c] = tx + 16 * c < n ? src[j * n + tx + 16 * c] : 0.f;
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[r][c] += tv[r] * sv[c];
  }
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < 8; ++c)
      if (4 * ti + r < C && tx + 16 * c < n) dst[(4 * ti + r) * n + tx + 16 * c] = acc[r][c];
}

// TC: lower_times on tensor cores (tf32 MMAs, fp32 accumulation) for C = 64 and n a multiple of
// 16, eight warps: warp w owns rows 16 (w mod 4) .. +15 and half of the columns. T is lower
// triangular, so a row tile stops at its last row's column.
__device__ __forceinline__ void lower_times_tc(const float* tm, const float* src, int n,
                                               float* dst) {
  constexpr int C = kMaxC;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int m0 = 16 * (w & 3), half = n / 2, n0 = (w >> 2) * half, nts = half / 8;
  float acc[8][4] = {};
  for (int k0 = 0; k0 < m0 + 16; k0 += 8) {
    uint32_t a[4];
    mma::load_a_tf32<false>(a, tm, C, m0, k0, lane);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
      if (nt < nts) {
        uint32_t b[2];
        mma::load_b_tf32(b, src, n, k0, n0 + 8 * nt, lane);
        mma::mma_tf32(acc[nt], a, b);
      }
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
    if (nt < nts)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        dst[(m0 + g + 8 * (e >> 1)) * n + n0 + 8 * nt + 2 * c + (e & 1)] = acc[nt][e];
}

// Shared memory of the prep: [Gam (Wide), later T] [q, later beta v] [k, later Kb] [KK] [beta].
// Aqk goes straight to global memory and the row products come before T, so that the dead Gam
// and q make room for T and beta v: 112 KB at C 64, K = V = 128 in bf16, two blocks per SM.
template <typename T>
__host__ __device__ size_t prep_gam_bytes(int C, int K) {
  return std::max(sizeof(Wide<T>) * C * K, sizeof(float) * C * C);
}

template <typename T>
size_t prep_smem(int C, int K, int V) {
  return prep_gam_bytes<T>(C, K) + sizeof(float) * (std::max(C * K, C * V) + C * K + C * C + C);
}

constexpr int kPairGroup = 4;   // pairs a warp sums at once (independent shuffle chains)
constexpr int kBlockRows = 16;  // TC: the chunk's 16-row blocks
constexpr int kBlockPairs = kBlockRows * (kBlockRows + 1) / 2;

// TC's shared layout of the scaled q/k tiles: element (i, x) of a row of kMaxKV floats sits at
// column x ^ 4 (i mod 8), which makes the MMA fragment loads of eight consecutive rows hit 32
// different banks.
__device__ __forceinline__ int swz(int i, int x) {
  return i * kMaxKV + (x ^ ((i & 7) << 2));
}

// TC: the pairs (i, j) whose rows lie in different 16-row blocks, p > r, on tensor cores. With
// G = Gam and the block references R_p = G at row 16 p (G only falls along a chunk: g <= 0),
//   sum_x q_i k_j e^(G_i - G_j) = sum_x [q_i e^(G_i - R_p)] [k_j e^(R_(r+1) - G_j)] e^(R_p -
//   R_(r+1)),
// every factor at most one, so nothing overflows however strong the decay (inside a block the
// factors would not be bounded: those pairs stay on the direct loop). The three tiles replace q,
// k and Gam in shared memory (swizzled, swz); the references go to q's rows 0-2, which no tile
// needs. K = 128, 256 threads: each thread owns one channel of 32 rows.
__device__ __forceinline__ void prep_block_pairs(const Args& a, float* blk, float* gam, float* qs,
                                                 float* ks, float* kk) {
  constexpr int K = kMaxKV, rows = kMaxC * K / kThreads, step = kThreads / K;
  const int tid = threadIdx.x, x = tid % K, lane = tid & 31, w = tid >> 5;
  const KdaChunkLayout& lay = a.lay;
  const float r1 = gam[16 * K + x], r2 = gam[32 * K + x], r3 = gam[48 * K + x];
  const auto ref = [&](int bi) { return bi == 1 ? r1 : bi == 2 ? r2 : r3; };  // bi in 1..3
  float t1[rows], t2[rows];
#pragma unroll
  for (int t = 0; t < rows; ++t) {
    const int i = tid / K + t * step, bi = i >> 4;
    t1[t] = bi ? qs[i * K + x] * __expf(gam[i * K + x] - ref(bi)) : 0.f;
  }
  __syncthreads();  // every thread has read its q
#pragma unroll
  for (int t = 0; t < rows; ++t) {
    const int i = tid / K + t * step;
    if (i >= kBlockRows) qs[swz(i, x)] = t1[t];
  }
  if (tid < K) {
    qs[x] = r1;
    qs[K + x] = r2;
    qs[2 * K + x] = r3;
  }
#pragma unroll
  for (int t = 0; t < rows; ++t) {
    const int i = tid / K + t * step, bi = i >> 4;
    const float kv = ks[i * K + x], gv = gam[i * K + x];
    t1[t] = bi ? kv * __expf(gv - ref(bi)) : 0.f;
    t2[t] = bi < 3 ? kv * __expf(ref(bi + 1) - gv) : 0.f;
  }
  __syncthreads();  // every thread has read its k and Gam
#pragma unroll
  for (int t = 0; t < rows; ++t) {
    const int i = tid / K + t * step;
    if (i >= kBlockRows) ks[swz(i, x)] = t1[t];
    if (i < 48) gam[swz(i, x)] = t2[t];
  }
  __syncthreads();
  // Warp w < 6: block pair (p, r) = (1,0), (2,0), (2,1), (3,0), (3,1), (3,2).
  if (w < 6) {
    const int p = w < 1 ? 1 : w < 3 ? 2 : 3, r = w - p * (p - 1) / 2;
    const float* Rp = qs + (p - 1) * K;  // R_p
    const float* Rr = qs + r * K;        // R_(r+1)
    const int g = lane >> 2, c = lane & 3, i0 = 16 * p + g, j0 = 16 * r + g;
    float aq[2][4] = {}, ak[2][4] = {};
    for (int k0 = 0; k0 < K; k0 += 8) {
      const int x0 = k0 + c, x1 = x0 + 4;
      const float d0 = __expf(Rp[x0] - Rr[x0]), d1 = __expf(Rp[x1] - Rr[x1]);
      const uint32_t fq[4] = {mma::to_tf32(qs[swz(i0, x0)]), mma::to_tf32(qs[swz(i0 + 8, x0)]),
                              mma::to_tf32(qs[swz(i0, x1)]), mma::to_tf32(qs[swz(i0 + 8, x1)])};
      const uint32_t fk[4] = {mma::to_tf32(ks[swz(i0, x0)]), mma::to_tf32(ks[swz(i0 + 8, x0)]),
                              mma::to_tf32(ks[swz(i0, x1)]), mma::to_tf32(ks[swz(i0 + 8, x1)])};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int j = j0 + 8 * nt;
        const uint32_t fb[2] = {mma::to_tf32(gam[swz(j, x0)] * d0),
                                mma::to_tf32(gam[swz(j, x1)] * d1)};
        mma::mma_tf32(aq[nt], fq, fb);
        mma::mma_tf32(ak[nt], fk, fb);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = i0 + (e >> 1) * 8, j = 16 * r + 8 * nt + 2 * c + (e & 1);
        blk[lay.Aqk() + i * kMaxC + j] = a.scale * aq[nt][e];
        kk[i * kMaxC + j] = ak[nt][e];
      }
  }
  __syncthreads();
}

// TC (bf16, chunk 64, K 128): the pairs across 16-row blocks on tensor cores
// (prep_block_pairs); the direct loop then sums only the pairs inside each block.
template <typename T, bool TC>
__global__ void __launch_bounds__(kThreads)
    prep_kernel(Args a, const T* q, const T* k, const T* v) {
  const int64_t c = blockIdx.x, h = blockIdx.y;
  const int L = a.clen[c];
  if (L == 0) return;
  const int64_t t0 = a.ct0[c];
  const int C = a.C, K = a.K, V = a.V, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  extern __shared__ __align__(16) unsigned char smem[];
  Wide<T>* gam = reinterpret_cast<Wide<T>*>(smem);
  float* tm = reinterpret_cast<float*>(smem);
  float* qs = reinterpret_cast<float*>(smem + prep_gam_bytes<T>(C, K));
  float* vs = qs;  // beta v
  float* ks = qs + std::max(C * K, C * V);
  float* kk = ks + C * K;
  float* b = kk + C * C;
  const KdaChunkLayout& lay = a.lay;
  float* blk = a.blk(c, h);
  // Aqk is written where a pair lands; the rest of its block is zero.
  for (int e = tid; e < C * C; e += kThreads) {
    const int i = e / C, j = e % C;
    kk[e] = 0.f;
    if (j > i || i >= L) blk[lay.Aqk() + e] = 0.f;
  }
  load_chunk(a, t0, L, h, q, k, gam, qs, ks, b);
  __syncthreads();
  // Pairs: a warp per group of (i, j), lanes over channels (TC: those inside each 16-row block).
  const int pairs = TC ? (kMaxC / kBlockRows) * kBlockPairs : L * (L + 1) / 2;
  for (int p0 = w * kPairGroup; p0 < pairs; p0 += kWarps * kPairGroup) {
    int pi[kPairGroup], pj[kPairGroup];
    float sqk[kPairGroup] = {}, skk[kPairGroup] = {};
#pragma unroll
    for (int u = 0; u < kPairGroup; ++u) {
      const int pu = p0 + u < pairs ? p0 + u : pairs - 1;
      if (TC) {
        pair_of(pu % kBlockPairs, pi[u], pj[u]);
        pi[u] += pu / kBlockPairs * kBlockRows;
        pj[u] += pu / kBlockPairs * kBlockRows;
      } else {
        pair_of(pu, pi[u], pj[u]);
      }
      for (int x = lane; x < K; x += 32) {
        const float e = __expf(static_cast<float>(gam[pi[u] * K + x] - gam[pj[u] * K + x]));
        const float kj = ks[pj[u] * K + x] * e;
        sqk[u] += qs[pi[u] * K + x] * kj;
        skk[u] += ks[pi[u] * K + x] * kj;
      }
    }
#pragma unroll
    for (int u = 0; u < kPairGroup; ++u) {
      sqk[u] = warp_sum(sqk[u]);
      skk[u] = warp_sum(skk[u]);
    }
    if (lane == 0)
#pragma unroll
      for (int u = 0; u < kPairGroup; ++u)
        if (p0 + u < pairs && pi[u] < L) {
          blk[lay.Aqk() + pi[u] * C + pj[u]] = a.scale * sqk[u];
          if (pj[u] < pi[u]) kk[pi[u] * C + pj[u]] = skk[u];
        }
  }
  __syncthreads();
  // The state-free row products; Kb replaces k in ks (TC: after the block pairs, from blk).
  for (int e = tid; e < C * K; e += kThreads) {
    const int i = e / K, x = e % K;
    float qh = 0.f, kl = 0.f, kb = 0.f;
    if (i < L) {
      const Wide<T> gi = gam[e];
      const float eg = __expf(static_cast<float>(gi));
      qh = a.scale * qs[e] * eg;
      kb = b[i] * ks[e] * eg;
      kl = ks[e] * __expf(static_cast<float>(gam[(L - 1) * K + x] - gi));
    }
    blk[lay.Qh() + e] = qh;
    blk[lay.Kl() + e] = kl;
    blk[lay.Kb() + e] = kb;
    if (!TC) ks[e] = kb;
  }
  for (int x = tid; x < K; x += kThreads)
    blk[lay.gL() + x] = __expf(static_cast<float>(gam[(L - 1) * K + x]));
  __syncthreads();
  if constexpr (TC) {
    prep_block_pairs(a, blk, gam, qs, ks, kk);
    for (int e = tid; e < C * K; e += kThreads) ks[e] = blk[lay.Kb() + e];
  }
  // Gam and q are dead: T and beta v take their places.
  for (int e = tid; e < C * V; e += kThreads) {
    const int i = e / V;
    vs[e] = i < L ? b[i] * ld(v, ((t0 + i) * a.H + h) * V + e % V) : 0.f;
  }
  // T = (I + diag(beta) KK)^-1 by forward substitution: four lanes per column split each row's
  // sum; the column's lanes share a warp, so a warp barrier orders the rows.
  {
    const int col = tid >> 2, part = tid & 3;
    for (int i = 0; i < C; ++i) {
      float acc = 0.f;
      if (col < C && i > col && i < L)
        for (int j = col + part; j < i; j += 4) acc += kk[i * C + j] * tm[j * C + col];
      acc += __shfl_xor_sync(0xffffffffu, acc, 1);
      acc += __shfl_xor_sync(0xffffffffu, acc, 2);
      if (col < C && part == 0)
        tm[i * C + col] = i == col ? 1.f : (i > col && i < L ? -b[i] * acc : 0.f);
      __syncwarp();
    }
  }
  __syncthreads();
  // TC: all C rows (T's rows past L are zero but for their unit diagonal, whose Kb and beta v
  // rows are zero: the same W and U as lower_times' sum over j < L).
  if constexpr (TC) {
    lower_times_tc(tm, ks, K, blk + lay.W());
    if (V % 16 == 0)
      lower_times_tc(tm, vs, V, blk + lay.U());
    else
      lower_times(tm, C, L, vs, V, blk + lay.U());
  } else {
    lower_times(tm, C, L, ks, K, blk + lay.W());
    lower_times(tm, C, L, vs, V, blk + lay.U());
  }
  for (int e = tid; e < C * C; e += kThreads) {
    blk[lay.Tm() + e] = tm[e];
    blk[lay.KK() + e] = kk[e];
  }
}

}  // namespace

namespace kda_chunk {

template <typename T>
void prep(Context& ctx, const Args& a, const Tensor& q, const Tensor& k, const Tensor& v) {
  const size_t sm = prep_smem<T>(a.C, a.K, a.V);
  // The block pairs on tensor cores: bf16 (float Gam), chunk 64, K 128 (one channel per thread).
  auto* kernel = prep_kernel<T, false>;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    // The tensor-core prep takes every call on its path (kda_fwd_tc.h; unaligned tensors through
    // narrower loads), and only it writes the bf16 layout.
    // (A caller's prepared tensor off 16-byte alignment keeps the fp32 layout's CUDA-core prep.)
    const KdaParams pp{.head_k = a.K, .head_v = a.V, .chunk = a.C, .kernels = a.kernels};
    if (kda_bf16_prep_path(pp) == KdaPrepPath::TensorCoreBf16 &&
        (a.lay.half || reinterpret_cast<uintptr_t>(a.ws) % 16 == 0))
      return kda_detail::prep_tc(ctx, a, ptr<T>(q), ptr<T>(k), ptr<T>(v));
    MT_CHECK(!a.lay.half, ValueError, "kda: bf16 prepared layout off the tensor-core path");
    if (a.C == kMaxC && a.K == kMaxKV) kernel = prep_kernel<T, true>;
  }
  allow_smem(kernel, sm);
  kernel<<<dim3(static_cast<unsigned>(a.nchunks), static_cast<unsigned>(a.H)), kThreads, sm,
           stream(ctx)>>>(a, ptr<T>(q), ptr<T>(k), ptr<T>(v));
  MT_CUDA_LAUNCH_CHECK();
}

template void prep<float>(Context&, const Args&, const Tensor&, const Tensor&, const Tensor&);
template void prep<__nv_bfloat16>(Context&, const Args&, const Tensor&, const Tensor&,
                                  const Tensor&);

}  // namespace kda_chunk

}  // namespace mt::ops::cuda
