// The KDA core in its chunked (WY) form on the GPU: the algorithm of ops/cpu/kda.cpp's chunked
// path, split so that only what is truly sequential runs chunk after chunk.
//
// Within a chunk of L <= C tokens, Gam = inclusive cumsum of g (double, as on the CPU: exponents
// are differences of cumsums that reach the thousands under strong decay), S0 the state entering:
//   Aqk = scale q k^T e^(Gam_i - Gam_j) (j <= i), KK = k k^T e^(Gam_i - Gam_j) (j < i),
//   T = (I + diag(beta) KK)^-1, W = T (beta k e^Gam), U = T (beta v),
//   Delta = U - W S0,  o = (scale q e^Gam) S0 + Aqk Delta,
//   S_next = diag(e^Gam_L) S0 + (k e^(Gam_L - Gam))^T Delta.
// Forward: (1) prep, one block per (chunk, head), builds everything that does not depend on S0
// (pairwise terms with one exponential per pair and channel, never a factorised e^Gam e^-Gam that
// could overflow; for bf16 at chunk 64 and K 128 the pairs across 16-row blocks are tf32 MMAs of
// factors bounded by one, prep_block_pairs) into the workspace (ops/kda_chunk_layout.h); (2) state,
// one block per (document, head, 32 state columns), walks the document's chunks: the columns of S
// evolve independently, one per lane, so the state pass needs no cross-block reduction. Backward:
// prep again; (3) the reverse state pass carries dS (again per column) and leaves Delta, dR = T^T
// dDelta and each chunk's outgoing dS in the workspace; (4) products, per (chunk, head, job): dO
// S0^T, dR S0^T, Delta dS^T, S0 . dS and the pair matrices dO Delta^T, dR Delta^T, tiled through
// shared memory (for bf16 where the tensor-core prep runs, tf32 MMAs in kda_bwd_tc.cu); (5)
// gradients, per (chunk, head): one thread per (token, channel) sums its pair terms in a fixed
// order (no atomics: bit-repeatable; for bf16 at chunk 64 and K 128 the pairs across 16-row blocks
// are tf32 MMAs, grads_block_pairs, and a block takes half of the channels, dbeta_sum_kernel adding
// the halves' dbeta shares; grads_v2_kernel, the default there, takes the pairs inside the blocks
// onto tensor cores too) and the reverse cumsum turns dGam into dg. fp32 arithmetic (q,
// k, v, o and their gradients in the tensors' dtype), exponent differences and dGam sums in Wide<T>
// (double for fp32 tensors, float for bf16). For bf16 tensors whose shapes fit (kda_state_tc.h) the
// state passes (2, 3) run on tensor cores instead (kda_state_tc.cu); fp32 tensors keep the
// CUDA-core passes below. The prep and gradient kernels run 2 blocks of 8 warps per SM (the
// gradient kernel's fp32 form, with double Gam, 1), the CUDA-core state passes
// one block of 16 warps per (document, head, 32 columns): all are latency-bound (bench/RESULTS.md).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kda_bwd_tc.h"
#include "ops/cuda/kda_chunk.h"
#include "ops/cuda/kda_chunk_args.cuh"
#include "ops/cuda/kda_fwd_tc.h"
#include "ops/cuda/kda_state_tc.h"
#include "ops/cuda/mma.cuh"
#include "ops/kda_chunk_layout.h"
#include "ops/kda_prep_path.h"

namespace mt::ops::cuda {

namespace {

using kda_detail::Args;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kCols = 32;    // state columns per block of the state passes: one per lane
constexpr int kMaxC = 64;    // chunk (kda_chunk_kernel_fits)
constexpr int kMaxKV = 128;  // head_k, head_v

// The exponent differences and the dGam sums: double for fp32 tensors (their 1e-5 check, with
// cumsums that reach the thousands under strong decay), float for bf16, whose rounding of every
// input and output (2^-9) dwarfs the float error of a difference of cumsums (|Gam| 2^-24) and
// which then runs without conversions and with half the shared memory for Gam.
template <typename T>
using Wide = std::conditional_t<std::is_same_v<T, float>, double, float>;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The chunks of each document, in saved-row order (as kda_saved_rows counts them), the documents
// by chunk count, longest first (dorder; ties by index), the order in which the state passes take
// them (kda_state_tc.cu), and their chunks in that order (corder: the overlapped forward's prep).
// Thread 0 walks the documents (few), then every thread fills its share of each document's chunks
// and ranks its documents.
__global__ void chunk_table_kernel(const int32_t* cu, int64_t N, int64_t T, int C, int64_t nchunks,
                                   int32_t* ct0, int32_t* clen, int32_t* dchunk0, int32_t* dorder,
                                   int32_t* corder) {
  const auto valid = [&](int64_t n) {  // validated on the host; never read out of range
    const int64_t a = cu[n], b = cu[n + 1];
    return !(a < 0 || b < a || b > T);
  };
  if (threadIdx.x == 0) {
    int64_t c = 0;
    for (int64_t n = 0; n < N; ++n) {
      dchunk0[n] = static_cast<int32_t>(c);
      if (valid(n)) c = std::min<int64_t>(nchunks, c + (cu[n + 1] - cu[n] + C - 1) / C);
    }
    dchunk0[N] = static_cast<int32_t>(c);
  }
  __syncthreads();
  for (int64_t n = 0; n < N; ++n) {
    if (!valid(n)) continue;
    const int64_t b = cu[n + 1], c0 = dchunk0[n], nc = dchunk0[n + 1] - c0;
    for (int64_t j = threadIdx.x; j < nc; j += blockDim.x) {
      const int64_t t = cu[n] + j * C;
      ct0[c0 + j] = static_cast<int32_t>(t);
      clen[c0 + j] = static_cast<int32_t>(b - t < C ? b - t : C);
    }
  }
  for (int64_t c = dchunk0[N] + threadIdx.x; c < nchunks; c += blockDim.x) ct0[c] = clen[c] = 0;
  // Each document's rank and the chunks of the documents ranked before it, by one quadratic count:
  // at most kRankedDocs documents (a packed batch has tens); past that, the documents' own order.
  // dorder[rank] is the document; corder lists its chunks from there, then the unused rows.
  constexpr int64_t kRankedDocs = 4096;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    const int32_t len = dchunk0[n + 1] - dchunk0[n];
    int64_t rank = n, at = dchunk0[n];
    if (N <= kRankedDocs) {
      rank = at = 0;
      for (int64_t m = 0; m < N; ++m) {
        const int32_t lm = dchunk0[m + 1] - dchunk0[m];
        if (lm > len || (lm == len && m < n)) {
          ++rank;
          at += lm;
        }
      }
    }
    dorder[rank] = static_cast<int32_t>(n);
    for (int32_t j = 0; j < len; ++j) corder[at + j] = dchunk0[n] + j;
  }
  for (int64_t c = dchunk0[N] + threadIdx.x; c < nchunks; c += blockDim.x)
    corder[c] = static_cast<int32_t>(c);
}

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

// The gradient kernel's blocks: 8 warps. TC (bf16, chunk 64, K 128) splits the channels in
// halves, a block per (chunk, head, half): per-channel quantities (dq, dk, dGam, dg, dGam_L) do
// not mix channels, so only dbeta needs both halves (dbeta_sum_kernel). A half's block takes
// 107 KB of shared memory, so two blocks (16 warps) share an SM and one's barriers hide behind
// the other's work; the other shapes keep one block per (chunk, head).
constexpr int kGradThreads = kThreads;
constexpr int kGradSplit = 2;                              // TC: channel groups per (chunk, head)
constexpr int kHalf = kMaxKV / kGradSplit;                 // TC: channels per block
constexpr int kOwnersMax = kMaxC * kMaxKV / kGradThreads;  // (token, channel) pairs per thread

// Shared memory of the gradient kernel over KB channels: [Gam, later dGam (Wide)] [dGam_L (Wide)]
// [scan partials (Wide)] [tq] [tb] [beta] [Tm.KK row halves] (TC: [the three block-pair tiles])
// [q, later (with k) the dbeta shares in fp32] [k]. q and k keep the tensors' dtype: bf16 rows
// are exact in bf16 and take half the room of fp32.
template <typename T>
size_t grads_smem(int C, int KB) {
  return sizeof(Wide<T>) * (C * KB + KB + kGradThreads) + sizeof(float) * (2 * C * C + 3 * C) +
         sizeof(T) * 2 * C * KB;
}

// TC: three fp32 tiles of the 48 rows of three 16-row blocks, with rows of 72 floats (8 mod 32:
// conflict-free B fragments).
constexpr int kTileLd = kHalf + 8;
constexpr size_t kGradTileFloats = 48 * kTileLd;
constexpr size_t kGradTileBytes = 3 * sizeof(float) * kGradTileFloats;

// 2^x, flushing results below 2^-126 to zero (no pair term that small counts): one instruction
// where __expf takes five (the scaling by log2 e and the subnormal fix-up). TC keeps Gam in units
// of log2 (Gam log2 e) so that every e^(difference) is one of these.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// In-place inclusive cumsum of the rows of a [C][n] shared array (Reverse: from the last row
// up), over all kGradThreads threads instead of one per column: thread t takes segment t / n of
// column t % n, sums it, then starts from the totals of the segments before it (summed in
// segment order: bit-repeatable) and rewrites its rows, times `scale`. part holds kGradThreads
// values; n <= kGradThreads. Ends with a barrier; expects one before (a's rows complete).
template <bool Reverse, typename W>
__device__ void scan_rows(W* arr, int C, int n, W* part, W scale = 1) {
  const int nseg = kGradThreads / n, rows = (C + nseg - 1) / nseg;
  const int x = threadIdx.x % n, s = threadIdx.x / n;
  const bool mine = s < nseg;
  const int lo = mine ? min(C, s * rows) : 0, hi = mine ? min(C, lo + rows) : 0;
  W acc = 0;
  for (int i = lo; i < hi; ++i) acc += arr[i * n + x];
  if (mine) part[threadIdx.x] = acc;  // = part[s * n + x]
  __syncthreads();
  if (mine) {
    acc = 0;
    if constexpr (Reverse) {
      for (int s2 = nseg - 1; s2 > s; --s2) acc += part[s2 * n + x];
      for (int i = hi - 1; i >= lo; --i) {
        acc += arr[i * n + x];
        arr[i * n + x] = acc * scale;
      }
    } else {
      for (int s2 = 0; s2 < s; ++s2) acc += part[s2 * n + x];
      for (int i = lo; i < hi; ++i) {
        acc += arr[i * n + x];
        arr[i * n + x] = acc * scale;
      }
    }
  }
  __syncthreads();
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

// TC: the pair sums of grads_kernel whose two rows lie in different 16-row blocks, on tensor
// cores, with the bounded factors of prep_block_pairs (R_b = Gam at row 16 b; Gam only falls):
//   sQ_i = sum_(j in r < p) tq_ij e^(G_i - G_j) k_j
//        = e^(G_i - R_p) sum_r e^(R_p - R_(r+1)) sum_j tq_ij [k_j e^(R_(r+1) - G_j)]   (i in p),
//   sC_i = sum_(i2 in p > r) e^(G_i2 - G_i) (tq_i2i q_i2 + tb_i2i k_i2)
//        = e^(R_(r+1) - G_i) sum_p e^(R_p - R_(r+1)) sum_i2 (tq_i2i [q_i2 e^(G_i2 - R_p)]
//          + tb_i2i [k_i2 e^(G_i2 - R_p)])                                           (i in r),
// sK as sQ with tb. Every factor is at most one. In: kd = the bracketed k of blocks 0-2, qu and
// ku = the bracketed q and k of blocks 1-3 (rows 16 (p - 1) ..), over the block's kHalf
// channels. Out, in the same tiles: qu = sQ's and ku = sK's sums over r for blocks 1-3, kd =
// sC's sum over p for blocks 0-2, all before the outer factor (the owners apply it). gam in log2
// units (Gam log2 e). A warp per (block, 16 columns) item, three items per warp: 12 items of sQ/sK
// (sharing kd), 12 of sC.
__device__ __forceinline__ void grads_block_pairs(const float* gam, const float* tq,
                                                  const float* tb, float* kd, float* qu,
                                                  float* ku) {
  constexpr int C = kMaxC, K = kHalf, LD = kTileLd, NW = kGradThreads / 32, NCG = K / 16;
  static_assert(6 * NCG == 3 * NW, "three items per warp");
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, c = lane & 3;
  const auto ref = [&](int b, int x) { return gam[16 * b * K + x]; };  // R_b
  float out[3][2][2][4] = {};  // [item][sQ or sC, sK][n-tile][fragment]
#pragma unroll
  for (int u = 0; u < 3; ++u) {
    const int item = w + NW * u, cg = item % NCG, n0 = 16 * cg;
    if (item < 3 * NCG) {
      const int p = 1 + item / NCG;
      for (int r = 0; r < p; ++r) {
        float cq[2][4] = {}, ck[2][4] = {};
#pragma unroll
        for (int k0 = 16 * r; k0 < 16 * r + 16; k0 += 8) {
          uint32_t aq[4], ak[4];
          mma::load_a_tf32<false>(aq, tq, C, 16 * p, k0, lane);
          mma::load_a_tf32<false>(ak, tb, C, 16 * p, k0, lane);
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            uint32_t b[2];
            mma::load_b_tf32(b, kd, LD, k0, n0 + 8 * nt, lane);
            mma::mma_tf32(cq[nt], aq, b);
            mma::mma_tf32(ck[nt], ak, b);
          }
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int x = n0 + 8 * nt + 2 * c + (e & 1);
            const float d = ex2(ref(p, x) - ref(r + 1, x));
            out[u][0][nt][e] += d * cq[nt][e];
            out[u][1][nt][e] += d * ck[nt][e];
          }
      }
    } else {
      const int r = (item - 3 * NCG) / NCG;
      for (int p = r + 1; p < 4; ++p) {
        float cc[2][4] = {};
        // A(m, k) = tq[(16 p + k) C + 16 r + m]: block (p, r) transposed; B rows 16 (p - 1) on.
        const float* tqp = tq + 16 * p * C;
        const float* tbp = tb + 16 * p * C;
        const float* qup = qu + 16 * (p - 1) * LD;
        const float* kup = ku + 16 * (p - 1) * LD;
#pragma unroll
        for (int k0 = 0; k0 < 16; k0 += 8) {
          uint32_t aq[4], ak[4];
          mma::load_a_tf32<true>(aq, tqp, C, 16 * r, k0, lane);
          mma::load_a_tf32<true>(ak, tbp, C, 16 * r, k0, lane);
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            uint32_t bq[2], bk[2];
            mma::load_b_tf32(bq, qup, LD, k0, n0 + 8 * nt, lane);
            mma::load_b_tf32(bk, kup, LD, k0, n0 + 8 * nt, lane);
            mma::mma_tf32(cc[nt], aq, bq);
            mma::mma_tf32(cc[nt], ak, bk);
          }
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int x = n0 + 8 * nt + 2 * c + (e & 1);
            out[u][0][nt][e] += ex2(ref(p, x) - ref(r + 1, x)) * cc[nt][e];
          }
      }
    }
  }
  __syncthreads();  // every warp is done reading kd, qu, ku
  const int g = lane >> 2;
#pragma unroll
  for (int u = 0; u < 3; ++u) {
    const int item = w + NW * u, cg = item % NCG;
    const bool rows_of_i = item < 3 * NCG;  // sQ/sK of block p: rows 16 (p - 1) of qu, ku
    const int row0 = rows_of_i ? 16 * (item / NCG) : 16 * ((item - 3 * NCG) / NCG);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int at = (row0 + g + 8 * (e >> 1)) * LD + 16 * cg + 8 * nt + 2 * c + (e & 1);
        if (rows_of_i) {
          qu[at] = out[u][0][nt][e];
          ku[at] = out[u][1][nt][e];
        } else {
          kd[at] = out[u][0][nt][e];
        }
      }
  }
  __syncthreads();
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

// One thread per (token i, channel x) of the block's channels: its dq, dk, dGam, and its share of
// dbeta. The pair terms of row i and of column i are summed first (sQ, sK, sC) and scaled by the
// owner's q and k once: dQ gets sQ, dGam q sQ, and so on, instead of three products per pair.
// TC (bf16, chunk 64, K 128): a block per half of the channels (blockIdx.z; kGradSplit), the
// pairs across 16-row blocks on tensor cores (grads_block_pairs), the direct loops only over
// the pairs inside the owner's block; the halves' dbeta shares go to the U rows of the prepared
// block (dead in backward) and dbeta_sum_kernel adds them. Otherwise one block per (chunk, head)
// writes dbeta itself.
template <typename T, bool TC>
__global__ void __launch_bounds__(kGradThreads, TC ? 2 : 1)
    grads_kernel(Args a, const T* q, const T* k, const T* v, T* dq, T* dk, T* dv) {
  using W = Wide<T>;
  const int64_t c = blockIdx.x, h = blockIdx.y;
  const int L = a.clen[c];
  if (L == 0) return;
  const int64_t t0 = a.ct0[c];
  const int C = TC ? kMaxC : a.C, K = TC ? kMaxKV : a.K, V = a.V, tid = threadIdx.x;
  const int z = TC ? static_cast<int>(blockIdx.z) : 0, KB = TC ? kHalf : K, x0 = z * KB;
  extern __shared__ __align__(16) unsigned char smem[];
  W* gam = reinterpret_cast<W*>(smem);                        // [C][KB], later dGam
  W* dGamL = gam + C * KB;                                    // [KB]
  W* part = dGamL + KB;                                       // [kGradThreads]
  float* tq = reinterpret_cast<float*>(part + kGradThreads);  // [C][C]
  float* tb = tq + C * C;  // [C][C] -dR Delta^T, row i scaled by beta_i
  float* b = tb + C * C;
  float* tkk = b + C;       // TC: [C] the rows of Tm . KK (of the half's parity)
  float* kd = tkk + 2 * C;  // TC: the block-pair tiles (grads_block_pairs)
  float* qu = kd + kGradTileFloats;
  float* ku = qu + kGradTileFloats;
  T* qs = reinterpret_cast<T*>(TC ? ku + kGradTileFloats : kd);  // [C][KB]
  T* ks = qs + C * KB;                                           // [C][KB]
  const KdaChunkLayout& lay = a.lay;
  float* blk = a.blk(c, h);
  const float* dds = a.dds(c, h);  // backward's products (ops/kda_chunk_layout.h)
  // e^(difference of Gam): TC keeps Gam in log2 units (scan below), so one ex2 each.
  const auto expg = [](W d) {
    if constexpr (TC)
      return ex2(d);
    else
      return __expf(static_cast<float>(d));
  };
  for (int i = tid; i < C; i += kGradThreads) b[i] = i < L ? a.beta[(t0 + i) * a.H + h] : 0.f;
  if constexpr (TC) {
    const auto [q8, k8, g4, aq4, tm4, kk4, be] = grad_loads(a, q, k, blk, t0, h, L, z, tid);
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int e = 8 * (tid + kGradThreads * m);
      *reinterpret_cast<uint4*>(qs + e) = q8[m];
      *reinterpret_cast<uint4*>(ks + e) = k8[m];
    }
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int e = 4 * (tid + kGradThreads * m), i = e / kMaxC, j = e % kMaxC;
      *reinterpret_cast<float4*>(gam + e) = g4[m];
      *reinterpret_cast<float4*>(tq + e) = aq4[m];
      const float4 t = tm4[m];
      *reinterpret_cast<float4*>(tb + e) =
          make_float4(t.x * be[m], t.y * be[m], t.z * be[m], t.w * be[m]);
      // Row i's Tm . KK: 16 lanes hold its 64 columns (xor 8 .. 1 stays in them), fixed order.
      const float4 kk = kk4[m];
      float pr = (j < i ? t.x * kk.x : 0.f) + (j + 1 < i ? t.y * kk.y : 0.f) +
                 (j + 2 < i ? t.z * kk.z : 0.f) + (j + 3 < i ? t.w * kk.w : 0.f);
      for (int o = 8; o > 0; o >>= 1) pr += __shfl_xor_sync(0xffffffffu, pr, o);
      if ((tid & 15) == 0 && (i & 1) == z) tkk[i] = pr;
    }
    __syncthreads();
  } else {
    for (int e = tid; e < C * KB; e += kGradThreads) {
      const int i = e / KB, x = e % KB;
      const int64_t src = ((t0 + i) * a.H + h) * K + x0 + x;
      if (i < L) {
        qs[e] = q[src];
        ks[e] = k[src];
      } else {
        st(qs, e, 0.f);
        st(ks, e, 0.f);
      }
      gam[e] = i < L ? static_cast<W>(a.g[src]) : W(0);
    }
    for (int e = tid; e < C * C; e += kGradThreads) {
      tq[e] = blk[lay.Aqk() + e];
      tb[e] = blk[lay.Tm() + e];
    }
    __syncthreads();
    for (int e = tid; e < C * C; e += kGradThreads) tb[e] *= b[e / C];
  }
  scan_rows<false>(gam, C, KB, part, TC ? W(1.4426950408889634) : W(1));  // Gam (TC: log2 e Gam)
  // dGam_L[x] = sum_i (Delta dS^T)[i][x] kl[i][x] + e^Gam_L (S0 . dS)[x]: the block's threads
  // split a channel's rows (rows s, s + nseg, ..., coalesced global loads), summed per channel in
  // segment order below (bit-repeatable).
  {
    const int nseg = kGradThreads / KB, x = tid % KB, s = tid / KB;
    W acc = 0;
    if (s < nseg) {
      const W gl = gam[(L - 1) * KB + x];
      if constexpr (TC) {
        constexpr int NS = kGradThreads / kHalf, R = kMaxC / NS;  // TC: all reads at once
        float kl[R];
#pragma unroll
        for (int m = 0; m < R; ++m) {
          const int i = s + NS * m;
          kl[m] = i < L ? dds[i * K + x0 + x] : 0.f;
        }
#pragma unroll
        for (int m = 0; m < R; ++m) {
          const int i = s + NS * m;
          acc += kl[m] * ld(ks, i * KB + x) * expg(gl - gam[i * KB + x]);
        }
      } else {
        for (int i = s; i < L; i += nseg)
          acc += dds[i * K + x0 + x] * ld(ks, i * KB + x) * expg(gl - gam[i * KB + x]);
      }
      part[tid] = acc;
    }
  }
  if constexpr (TC) {
    static_assert(std::is_same_v<W, float>);
    constexpr int KH = kHalf, LD = kTileLd;
    for (int e = tid; e < 48 * KH; e += kGradThreads) {
      const int i = e / KH, x = e % KH, bi = i >> 4;  // kd: row i (blocks 0-2); qu, ku: i + 16
      const float gd = gam[i * KH + x], gu = gam[(i + 16) * KH + x];
      const float rr = gam[16 * (bi + 1) * KH + x];
      kd[i * LD + x] = ld(ks, i * KH + x) * expg(rr - gd);
      const float eu = expg(gu - rr);
      qu[i * LD + x] = ld(qs, (i + 16) * KH + x) * eu;
      ku[i * LD + x] = ld(ks, (i + 16) * KH + x) * eu;
    }
  }
  __syncthreads();
  if (tid < KB) {
    const int nseg = kGradThreads / KB;
    W s = 0;
    for (int s2 = 0; s2 < nseg; ++s2) s += part[s2 * KB + tid];
    dGamL[tid] = expg(gam[(L - 1) * KB + tid]) * blk[lay.gL() + x0 + tid] + s;
  }
  if constexpr (TC)
    grads_block_pairs(gam, tq, tb, kd, qu, ku);  // (its barriers publish dGam_L too)
  else
    __syncthreads();
  // The owners: TC gives each thread two adjacent channels of a row (8-byte shared loads, and
  // the broadcast tq/tb loads serve both), elsewhere one. The three global reads go out one
  // owner ahead (they were the loop's latency).
  constexpr int NCH = TC ? 2 : 1;
  const int per_row = KB / NCH, owners = (C * per_row + kGradThreads - 1) / kGradThreads;
  const auto lw = [](const auto* p, auto& o) { load_n<NCH>(p, o); };
  const auto lt = [](const T* p, float(&o)[NCH]) { load_n<NCH>(p, o); };
  const auto fetch = [&](int r, float(&f)[3][NCH]) {
    const int o = tid + r * kGradThreads, i = o / per_row, x = NCH * (o % per_row);
    if (r < owners && o < C * per_row && i < L) {
      const int64_t at = i * K + x0 + x;
      lw(blk + lay.dOS0() + at, f[0]);
      lw(blk + lay.dRS0() + at, f[1]);
      lw(dds + at, f[2]);
    }
  };
  W dgam[kOwnersMax];
  float dbx[kOwnersMax];
  float nxt[3][NCH] = {};
  fetch(0, nxt);
#pragma unroll 1
  for (int r = 0; r < owners; ++r) {
    const int o = tid + r * kGradThreads, i = o / per_row, x = NCH * (o % per_row);
    float dqg[NCH], dkb[NCH], dkgl[NCH];
#pragma unroll
    for (int u = 0; u < NCH; ++u) {
      dqg[u] = nxt[0][u] * a.scale;
      dkb[u] = -nxt[1][u];
      dkgl[u] = nxt[2][u];
      dgam[NCH * r + u] = 0;
      dbx[NCH * r + u] = 0.f;
    }
    fetch(r + 1, nxt);
    if (i >= L || o >= C * per_row) continue;
    W gi[NCH], gl[NCH];
    float qi[NCH], ki[NCH], eg[NCH], elg[NCH];
    lw(gam + i * KB + x, gi);
    lw(gam + (L - 1) * KB + x, gl);
    lt(qs + i * KB + x, qi);
    lt(ks + i * KB + x, ki);
    const float bi = b[i];
#pragma unroll
    for (int u = 0; u < NCH; ++u) {
      eg[u] = expg(gi[u]);
      elg[u] = expg(gl[u] - gi[u]);
    }
    // As row i of the pairs (j <= i): sQ = sum tq_ij e_ij k_j, sK = sum tb_ij e_ij k_j.
    // TC: j and i2 within i's 16-row block here, the other blocks' sums from the tiles.
    const int ib = i >> 4, blk0 = TC ? 16 * ib : 0, blk_end = TC ? min(L, 16 * ib + 16) : L;
    W sQ[NCH] = {}, sK[NCH] = {}, sC[NCH] = {};
    for (int j = blk0; j <= i; ++j) {
      W gj[NCH];
      float kj[NCH];
      lw(gam + j * KB + x, gj);
      lt(ks + j * KB + x, kj);
      const float aq = tq[i * C + j], ak = tb[i * C + j];
#pragma unroll
      for (int u = 0; u < NCH; ++u) {
        const float ek = expg(gi[u] - gj[u]) * kj[u];
        sQ[u] += aq * ek;
        sK[u] += ak * ek;
      }
    }
    // As column i (rows i2 >= i): sC = sum e_i2i (tq_i2i q_i2 + tb_i2i k_i2).
    for (int i2 = i; i2 < blk_end; ++i2) {
      W gj[NCH];
      float qj[NCH], kj[NCH];
      lw(gam + i2 * KB + x, gj);
      lt(qs + i2 * KB + x, qj);
      lt(ks + i2 * KB + x, kj);
      const float aq = tq[i2 * C + i], ak = tb[i2 * C + i];
#pragma unroll
      for (int u = 0; u < NCH; ++u) sC[u] += expg(gj[u] - gi[u]) * (aq * qj[u] + ak * kj[u]);
    }
    if constexpr (TC) {
      if (ib > 0) {
        float tu[NCH], tk[NCH], gr[NCH];
        lw(qu + (i - 16) * kTileLd + x, tu);
        lw(ku + (i - 16) * kTileLd + x, tk);
        lw(gam + 16 * ib * KB + x, gr);
#pragma unroll
        for (int u = 0; u < NCH; ++u) {
          const float f = expg(gi[u] - gr[u]);
          sQ[u] += f * tu[u];
          sK[u] += f * tk[u];
        }
      }
      if (ib < 3) {
        float td[NCH], gr[NCH];
        lw(kd + i * kTileLd + x, td);
        lw(gam + 16 * (ib + 1) * KB + x, gr);
#pragma unroll
        for (int u = 0; u < NCH; ++u) sC[u] += expg(gr[u] - gi[u]) * td[u];
      }
    }
    float dQ[NCH], dK[NCH];
#pragma unroll
    for (int u = 0; u < NCH; ++u) {
      dQ[u] = dqg[u] * eg[u] + static_cast<float>(sQ[u]);
      dK[u] = bi * eg[u] * dkb[u] + dkgl[u] * elg[u] + static_cast<float>(sK[u] + sC[u]);
      W dG = static_cast<W>(dqg[u]) * qi[u] * eg[u] + static_cast<W>(dkb[u]) * bi * ki[u] * eg[u] -
             static_cast<W>(dkgl[u]) * ki[u] * elg[u] + qi[u] * sQ[u] + ki[u] * (sK[u] - sC[u]);
      dbx[NCH * r + u] = dkb[u] * ki[u] * eg[u];
      if (i == L - 1) dG += dGamL[x + u];
      dgam[NCH * r + u] = dG;
    }
    const int64_t at = ((t0 + i) * a.H + h) * K + x0 + x;
    if constexpr (NCH == 2) {
      *reinterpret_cast<__nv_bfloat162*>(dq + at) = __floats2bfloat162_rn(dQ[0], dQ[1]);
      *reinterpret_cast<__nv_bfloat162*>(dk + at) = __floats2bfloat162_rn(dK[0], dK[1]);
    } else {
      st(dq, at, dQ[0]);
      st(dk, at, dK[0]);
    }
  }
  // TC: dbeta's reads of dR and v for the rows of the half's parity, i = 2 (w + 8 m) + z, go out
  // now, to arrive during the reverse cumsum.
  constexpr int kDbRows = kMaxC / 2 / (kGradThreads / 32);
  float dr[kDbRows][4], vv[kDbRows][4];
  if constexpr (TC) {
    const int lane = tid & 31, w = tid >> 5;
#pragma unroll
    for (int m = 0; m < kDbRows; ++m) {
      const int i = 2 * (w + kGradThreads / 32 * m) + z;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int y = lane + 32 * n;
        const bool ok = i < L && y < V;
        dr[m][n] = ok ? a.bblk(c, h)[lay.dR() + i * V + y] : 0.f;
        vv[m][n] = ok ? ld(v, ((t0 + i) * a.H + h) * V + y) : 0.f;
      }
    }
  }
  __syncthreads();  // every thread is done reading gam, qs and ks
  // The dbeta shares in fp32 over q and k (together at least C KB floats: sizeof(T) >= 2).
  float* dbs = reinterpret_cast<float*>(qs);
#pragma unroll 1
  for (int r = 0; r < owners; ++r) {
    const int o = tid + r * kGradThreads;
    if (o < C * per_row)
#pragma unroll
      for (int u = 0; u < NCH; ++u) {
        gam[NCH * o + u] = dgam[NCH * r + u];
        dbs[NCH * o + u] = dbx[NCH * r + u];
      }
  }
  __syncthreads();
  // dg = reverse cumsum of dGam over the chunk, per channel (rows past L hold zero).
  scan_rows<true>(gam, C, KB, part);
  for (int e = tid; e < L * KB; e += kGradThreads) {
    const int i = e / KB, x = e % KB;
    a.dg[((t0 + i) * a.H + h) * K + x0 + x] = static_cast<float>(gam[e]);
  }
  // dbeta_i = v_i . dR_i + sum_x (its channel shares) + sum_j ta_ij KK_ij; dv = beta dR.
  if constexpr (TC) {
    // The half z: v . dR, dv and Tm . KK of the rows of its parity (i1), every row's share of
    // its channels (i1 and the other parity's i2), into the U rows of the prepared block.
    const int lane = tid & 31, w = tid >> 5;
#pragma unroll
    for (int m = 0; m < kDbRows; ++m) {
      const int i1 = 2 * (w + kGradThreads / 32 * m) + z, i2 = i1 + 1 - 2 * z;
      if (i1 < L) {
        float s = 0.f;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          const int y = lane + 32 * n;
          if (y < V) {
            s += vv[m][n] * dr[m][n];
            st(dv, ((t0 + i1) * a.H + h) * V + y, b[i1] * dr[m][n]);
          }
        }
        if (lane == 0) s += tkk[i1];
        for (int x = lane; x < KB; x += 32) s += dbs[i1 * KB + x];
        s = warp_sum(s);
        if (lane == 0) blk[lay.dbeta_parts() + z * C + i1] = s;
      }
      if (i2 < L) {
        float s = 0.f;
        for (int x = lane; x < KB; x += 32) s += dbs[i2 * KB + x];
        s = warp_sum(s);
        if (lane == 0) blk[lay.dbeta_parts() + z * C + i2] = s;
      }
    }
  } else {
    for (int i = tid >> 5; i < L; i += kGradThreads / 32) {
      const int lane = tid & 31;
      float s = 0.f;
      for (int y = lane; y < V; y += 32) {
        const int64_t at = ((t0 + i) * a.H + h) * V + y;
        const float r = a.bblk(c, h)[lay.dR() + i * V + y];
        s += ld(v, at) * r;
        st(dv, at, b[i] * r);
      }
      for (int j = lane; j < i; j += 32) s += blk[lay.Tm() + i * C + j] * blk[lay.KK() + i * C + j];
      for (int x = lane; x < KB; x += 32) s += dbs[i * KB + x];
      s = warp_sum(s);
      if (lane == 0) a.dbeta[(t0 + i) * a.H + h] = s;
    }
  }
}

// grads_v2_kernel (bf16, chunk 64, K 128; kda_set_grads_v2): every pair sum of grads_kernel on
// tensor cores, the pairs inside a 16-row block (masked j <= i) too, and the owners in the warp
// that holds their sums. With R_b = Gam at row 16 b (R_4 = Gam at row 63) the diagonal block b
// joins grads_block_pairs' sums as r = p = b with the inner factor e^(R_b - R_(b+1)) >= 1; where
// that factor's exponent exceeds kGradDiagMax on some channel of a 16-channel group (strong
// decay: the scaled operands could leave the normal range), that (block, group) keeps the direct
// loop over its pairs. A warp takes two (row block p, 16 channels) combos, each sQ and sK of
// rows 16 p (r <= p) and sC of the same rows as columns (p2 >= p): 5 16 x 16 pair blocks per
// combo on every warp; the accumulators' elements are then exactly the owners' (row, channel
// pairs), so no sum goes through shared memory and the owners' three global reads go out before
// the combo's MMAs. tq and tb are stored with a column XOR of ((i & 3) << 3 | (i & 4)), the
// scaled tiles with (i & 3) << 3: both conflict-free for the row-major and transposed tf32 A
// fragments and the B fragments. 115456 bytes of shared memory: two blocks per SM.
constexpr float kGradDiagMax = 57.7f;  // log2 units: e^40, prep_tc's diagonal bound
constexpr size_t kGradV2Bytes =
    sizeof(float) * (kMaxC * kHalf + kHalf + 2 * kMaxC * kMaxC + 2 * kMaxC + 3 * kMaxC * kHalf) +
    sizeof(__nv_bfloat16) * 2 * kMaxC * kHalf;

__device__ __forceinline__ int sw_pair(int i) {
  return ((i & 3) << 3) | (i & 4);
}
__device__ __forceinline__ int sw_tile(int i) {
  return (i & 3) << 3;
}
// q and k (bf16, rows of 64 = 128 bytes): 16-byte chunk c of row i at c ^ (i & 7), so that the
// owners' pair loads (8 rows, 4 lanes a row) and the column walks spread over the banks.
__device__ __forceinline__ int qk_at(int i, int x) {
  return i * kHalf + ((((x >> 3) ^ (i & 7)) << 3) | (x & 7));
}

// x as tf32 (hi) and, Split, the tf32 of what that leaves (lo): hi + lo holds x to ~2^-22, so
// the three products hi hi + hi lo + lo hi of two split operands are fp32-accurate (3xTF32).
template <bool Split>
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = mma::to_tf32(x);
  if constexpr (Split) lo = mma::to_tf32(x - __uint_as_float(hi));
}

// The tf32 A fragment of rows m0.. (k0..k0+7) of the swizzled [64][64] M: A(m, k) = M[m0 + m][k0
// + k] or, Trans, M[k0 + k][m0 + m]. Diag keeps only the pairs of a diagonal block (column <= row:
// j <= i, or Trans row >= column: i2 >= i) and splits them (lo).
template <bool Trans, bool Diag>
__device__ __forceinline__ void load_a_sw(uint32_t a[4], uint32_t lo[4], const float* M, int m0,
                                          int k0, int lane) {
  const int g = lane >> 2, c = lane & 3;
  const auto at = [&](int m, int k, uint32_t& hi, uint32_t& low) {
    const int row = Trans ? k0 + k : m0 + m, col = Trans ? m0 + m : k0 + k;
    const float v = M[row * kMaxC + (col ^ sw_pair(row))];
    const bool keep = !Diag || (Trans ? row >= col : col <= row);
    split_tf32<Diag>(keep ? v : 0.f, hi, low);
  };
  at(g, c, a[0], lo[0]);
  at(g + 8, c, a[1], lo[1]);
  at(g, c + 4, a[2], lo[2]);
  at(g + 8, c + 4, a[3], lo[3]);
}

// The B fragment (rows k0.., columns n0..n0+7) of a swizzled [64][64] tile.
template <bool Split>
__device__ __forceinline__ void load_b_sw(uint32_t b[2], uint32_t lo[2], const float* B, int k0,
                                          int n0, int lane) {
  const int g = lane >> 2, c = lane & 3, r0 = k0 + c, r1 = k0 + c + 4;
  split_tf32<Split>(B[r0 * kHalf + ((n0 + g) ^ sw_tile(r0))], b[0], lo[0]);
  split_tf32<Split>(B[r1 * kHalf + ((n0 + g) ^ sw_tile(r1))], b[1], lo[1]);
}

// c += a b, Split: in 3xTF32 (the small cross terms first).
template <bool Split>
__device__ __forceinline__ void mma_sp(float c[4], const uint32_t a[4], const uint32_t alo[4],
                                       const uint32_t b[2], const uint32_t blo[2]) {
  if constexpr (Split) {
    mma::mma_tf32(c, alo, b);
    mma::mma_tf32(c, a, blo);
  }
  mma::mma_tf32(c, a, b);
}

// scan_rows over [kMaxC][kHalf] with compile-time trips: a thread's 16 rows are loaded at once and
// kept in registers for the second pass (scan_rows' run-time bounds made each pass a chain of
// dependent shared loads). The same additions in the same order: bit-identical results. add joins
// row add_row's value first.
template <bool Reverse>
__device__ __forceinline__ void scan_64x64(float* arr, float* part, float scale = 1.f,
                                           int add_row = -1, float add = 0.f) {
  constexpr int N = kHalf, S = kGradThreads / N, R = kMaxC / S;
  static_assert(kGradThreads % N == 0 && kMaxC % S == 0);
  const int x = threadIdx.x % N, s = threadIdx.x / N;
  float v[R];
  float acc = 0.f;
#pragma unroll
  for (int m = 0; m < R; ++m) {
    v[m] = arr[(R * s + m) * N + x];
    if (R * s + m == add_row) v[m] += add;
  }
#pragma unroll
  for (int m = 0; m < R; ++m) acc += v[m];
  part[threadIdx.x] = acc;
  __syncthreads();
  acc = 0.f;
  if constexpr (Reverse) {
#pragma unroll
    for (int s2 = S - 1; s2 > 0; --s2)
      if (s2 > s) acc += part[s2 * N + x];
#pragma unroll
    for (int m = R - 1; m >= 0; --m) {
      acc += v[m];
      arr[(R * s + m) * N + x] = acc * scale;
    }
  } else {
#pragma unroll
    for (int s2 = 0; s2 < S - 1; ++s2)
      if (s2 < s) acc += part[s2 * N + x];
#pragma unroll
    for (int m = 0; m < R; ++m) {
      acc += v[m];
      arr[(R * s + m) * N + x] = acc * scale;
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kGradThreads, 2)
    grads_v2_kernel(Args a, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                    __nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv) {
  using T = __nv_bfloat16;
  constexpr int C = kMaxC, K = kMaxKV, KH = kHalf;
  static_assert(C == KH, "one index for [C][C] and [C][kHalf]");
  // Blocks in (chunk, head, half) order, the half fastest: the two halves of a (chunk, head) run
  // together, so the second's reads of Aqk and Tm (32 KB) find them in L2, and the blocks that
  // run at once cover every head of a few chunks, whose rows of q, k, g, dq, dk, dg and prepared
  // blocks are contiguous (in chunk-fastest order they were 256-byte pieces 16 KB apart).
  const int64_t ch = blockIdx.x >> 1, c = ch / a.H, h = ch % a.H;
  const int L = a.clen[c];
  const int64_t t0 = a.ct0[c];  // (with L: one round trip, not two)
  if (L == 0) return;
  const int V = a.V, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int z = static_cast<int>(blockIdx.x & 1), x0 = z * KH;  // the half
  extern __shared__ __align__(16) unsigned char smem[];
  float* gam = reinterpret_cast<float*>(smem);  // [C][KH] Gam (log2 units), later dGam
  float* dGamL = gam + C * KH;                  // [KH]
  float* tq = dGamL + KH;                       // [C][C] (swizzled)
  float* tb = tq + C * C;                       // [C][C] -dR Delta^T, row i times beta_i
  float* b = tb + C * C;                        // [C]
  float* tkk = b + C;                           // [C]
  float* kd = tkk + C;                          // [C][KH] tiles (swizzled); scan partials first
  float* qu = kd + C * KH;
  float* ku = qu + C * KH;
  T* qs = reinterpret_cast<T*>(ku + C * KH);  // [C][KH]
  T* ks = qs + C * KH;                        // [C][KH]
  float* part = kd;                           // scan partials: before the tiles, after the owners
  float* dbs = qu;                            // [C][4] dbeta shares per 16 channels, at the end
  float* glpart = ku;                         // [4][KH] dGam_L's sums per row block, at the end
  const KdaChunkLayout& lay = a.lay;
  float* blk = a.blk(c, h);
  const float* dds = a.dds(c, h);
  for (int i = tid; i < C; i += kGradThreads) b[i] = i < L ? a.beta[(t0 + i) * a.H + h] : 0.f;
  {
    // grads_kernel's load phase (TC), tq and tb stored swizzled.
    const auto [q8, k8, g4, aq4, tm4, kk4, be] = grad_loads(a, q, k, blk, t0, h, L, z, tid);
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int e = 8 * (tid + kGradThreads * m);
      *reinterpret_cast<uint4*>(qs + qk_at(e / KH, e % KH)) = q8[m];
      *reinterpret_cast<uint4*>(ks + qk_at(e / KH, e % KH)) = k8[m];
    }
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int e = 4 * (tid + kGradThreads * m), i = e / C, j = e % C;
      const int s = i * C + (j ^ sw_pair(i));  // 4 consecutive columns stay together
      *reinterpret_cast<float4*>(gam + e) = g4[m];
      *reinterpret_cast<float4*>(tq + s) = aq4[m];
      const float4 t = tm4[m];
      *reinterpret_cast<float4*>(tb + s) =
          make_float4(t.x * be[m], t.y * be[m], t.z * be[m], t.w * be[m]);
      const float4 kk = kk4[m];
      float pr = (j < i ? t.x * kk.x : 0.f) + (j + 1 < i ? t.y * kk.y : 0.f) +
                 (j + 2 < i ? t.z * kk.z : 0.f) + (j + 3 < i ? t.w * kk.w : 0.f);
      for (int o = 8; o > 0; o >>= 1) pr += __shfl_xor_sync(0xffffffffu, pr, o);
      if ((tid & 15) == 0 && (i & 1) == z) tkk[i] = pr;
    }
  }
  // The owners' global reads (dO S0^T, dR S0^T, Delta dS^T at their rows and channel pairs): the
  // first combo's go out here, the second's after the first's MMAs.
  const int g = lane >> 2, cq4 = lane & 3;
  float2 f[2][2][2][3];
  const auto fetch = [&](int s, float2(&fs)[2][2][3]) {
    const int ci = w + 8 * s, p = ci >> 2, n0 = 16 * (ci & 3);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * p + g + 8 * hf, x = n0 + 8 * nt + 2 * cq4;
        const int64_t at = i * K + x0 + x;
        const float2 zero2 = make_float2(0.f, 0.f);
        const bool in = i < L;
        fs[nt][hf][0] = in ? *reinterpret_cast<const float2*>(blk + lay.dOS0() + at) : zero2;
        fs[nt][hf][1] = in ? *reinterpret_cast<const float2*>(blk + lay.dRS0() + at) : zero2;
        fs[nt][hf][2] = in ? *reinterpret_cast<const float2*>(dds + at) : zero2;
      }
  };
  fetch(0, f[0]);
  const float gL = tid < KH ? blk[lay.gL() + x0 + tid] : 0.f;
  __syncthreads();
  scan_64x64<false>(gam, part, 1.4426950408889634f);             // log2 e Gam
  const auto rrow = [](int bb) { return min(16 * bb, C - 1); };  // R_b's row
  {
    // dGam_L = e^Gam_L (S0 . dS) + sum_i (Delta dS^T)_i k_i e^(Gam_L - Gam_i): the first term
    // here, the sum from the owners' terms (which hold each factor) at the end.
    if (tid < KH) dGamL[tid] = ex2(gam[(L - 1) * KH + tid]) * gL;
    // The scaled tiles: kd = k e^(R_(b+1) - Gam), qu = q e^(Gam - R_b), ku = k e^(Gam - R_b).
    for (int e = tid; e < C * KH; e += kGradThreads) {
      const int i = e / KH, x = e % KH, bb = i >> 4, s = i * KH + (x ^ sw_tile(i));
      const float gi = gam[e], rb = gam[16 * bb * KH + x], rn = gam[rrow(bb + 1) * KH + x];
      const float kv = ld(ks, qk_at(i, x)), eu = ex2(gi - rb);
      kd[s] = kv * ex2(rn - gi);
      qu[s] = ld(qs, qk_at(i, x)) * eu;
      ku[s] = kv * eu;
    }
  }
  __syncthreads();
  float dgam[2][2][2][2];   // [combo][n-tile][row half][channel]
  float dbp[2][2] = {};     // [combo][row half]: the row's dbeta share over the 16 channels
  float glp[2][2][2] = {};  // [combo][n-tile][channel]: dGam_L's sum over the lane's rows
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const int ci = w + 8 * s, p = ci >> 2, cg = ci & 3, n0 = 16 * cg;
    // The owners' global reads: dO S0^T, dR S0^T, Delta dS^T at (row, channel pair).
    // R_p and R_(p+1) of this lane's columns; the diagonal block on MMAs where the range allows.
    // (Read again where used: registers are the limit here.)
    const auto rp = [&](int nt, int u) { return gam[16 * p * KH + n0 + 8 * nt + 2 * cq4 + u]; };
    const auto rn = [&](int nt, int u) {
      return gam[rrow(p + 1) * KH + n0 + 8 * nt + 2 * cq4 + u];
    };
    float range = 0.f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int x = n0 + 8 * nt + 2 * cq4 + u;
        range = fmaxf(range, gam[16 * p * KH + x] - gam[rrow(p + 1) * KH + x]);
      }
    const bool diag = mma::quad_max(range) <= kGradDiagMax;  // the same on every lane
    float oq[2][4] = {}, ok[2][4] = {}, oc[2][4] = {};
    // Rows 16 p: sQ, sK over column blocks r <= p (B = kd rows 16 r); the diagonal block (r = p)
    // masked and in 3xTF32, as exact as the direct loop it replaces (dg's cancellations show
    // tf32's 2^-11 there).
    const auto sqk = [&](auto diag_tag, int r) {
      constexpr bool D = decltype(diag_tag)::value;
      float cq[2][4] = {}, ck[2][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < 16; k0 += 8) {
        if constexpr (D) {  // one split A fragment at a time (registers), B loaded for each
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            uint32_t a[4], al[4];
            load_a_sw<false, true>(a, al, t ? tb : tq, 16 * p, 16 * r + k0, lane);
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
              uint32_t bb[2], bl[2];
              load_b_sw<true>(bb, bl, kd, 16 * r + k0, n0 + 8 * nt, lane);
              mma_sp<true>(t ? ck[nt] : cq[nt], a, al, bb, bl);
            }
          }
        } else {
          uint32_t aq[4], ak[4], unused[4];
          load_a_sw<false, false>(aq, unused, tq, 16 * p, 16 * r + k0, lane);
          load_a_sw<false, false>(ak, unused, tb, 16 * p, 16 * r + k0, lane);
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            uint32_t bb[2], bl[2];
            load_b_sw<false>(bb, bl, kd, 16 * r + k0, n0 + 8 * nt, lane);
            mma::mma_tf32(cq[nt], aq, bb);
            mma::mma_tf32(ck[nt], ak, bb);
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int x = n0 + 8 * nt + 2 * cq4 + u;
          const float d = ex2(rp(nt, u) - gam[rrow(r + 1) * KH + x]);
          oq[nt][u] += d * cq[nt][u];
          oq[nt][2 + u] += d * cq[nt][2 + u];
          ok[nt][u] += d * ck[nt][u];
          ok[nt][2 + u] += d * ck[nt][2 + u];
        }
    };
    for (int r = 0; r < p; ++r) sqk(std::false_type{}, r);
    if (diag) sqk(std::true_type{}, p);
    // Rows 16 p as columns: sC over row blocks p2 >= p (A = tq, tb transposed; B = qu, ku).
    const auto sc = [&](auto diag_tag, int p2) {
      constexpr bool D = decltype(diag_tag)::value;
      float cc[2][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < 16; k0 += 8) {
        if constexpr (D) {  // tq with qu, then tb with ku: one split A fragment at a time
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            uint32_t a[4], al[4];
            load_a_sw<true, true>(a, al, t ? tb : tq, 16 * p, 16 * p2 + k0, lane);
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
              uint32_t bb[2], bl[2];
              load_b_sw<true>(bb, bl, t ? ku : qu, 16 * p2 + k0, n0 + 8 * nt, lane);
              mma_sp<true>(cc[nt], a, al, bb, bl);
            }
          }
        } else {
          uint32_t aq[4], ak[4], unused[4];
          load_a_sw<true, false>(aq, unused, tq, 16 * p, 16 * p2 + k0, lane);
          load_a_sw<true, false>(ak, unused, tb, 16 * p, 16 * p2 + k0, lane);
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            uint32_t bq[2], bk[2], bl[2];
            load_b_sw<false>(bq, bl, qu, 16 * p2 + k0, n0 + 8 * nt, lane);
            load_b_sw<false>(bk, bl, ku, 16 * p2 + k0, n0 + 8 * nt, lane);
            mma::mma_tf32(cc[nt], aq, bq);
            mma::mma_tf32(cc[nt], ak, bk);
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int x = n0 + 8 * nt + 2 * cq4 + u;
          const float d = ex2(gam[16 * p2 * KH + x] - rn(nt, u));
          oc[nt][u] += d * cc[nt][u];
          oc[nt][2 + u] += d * cc[nt][2 + u];
        }
    };
    if (diag) sc(std::true_type{}, p);
    for (int p2 = p + 1; p2 < 4; ++p2) sc(std::false_type{}, p2);
    if (s == 0) fetch(1, f[1]);
      // The owners: (row 16 p + g + 8 hf, channels n0 + 8 nt + 2 c + u) = accumulator element
      // [nt][2 hf + u]. (dbp and glp still add nt = 0 before 1 and hf = 0 before 1.)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * p + g + 8 * hf;
      uint32_t pq[2] = {}, pk[2] = {};  // dq and dk of channels n0 + 8 nt + 2 c + u, bf16 pairs
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int x = n0 + 8 * nt + 2 * cq4;
        dgam[s][nt][hf][0] = dgam[s][nt][hf][1] = 0.f;
        if (i >= L) continue;
        const float2 f0 = f[s][nt][hf][0], f1 = f[s][nt][hf][1], f2 = f[s][nt][hf][2];
        const float dqg[2] = {f0.x * a.scale, f0.y * a.scale}, dkb[2] = {-f1.x, -f1.y},
                    dkgl[2] = {f2.x, f2.y};
        float gi[2], gl[2], qi[2], ki[2];
        load_n<2>(gam + i * KH + x, gi);
        load_n<2>(gam + (L - 1) * KH + x, gl);
        load_n<2>(qs + qk_at(i, x), qi);
        load_n<2>(ks + qk_at(i, x), ki);
        const float bi = b[i];
        float sQ[2], sK[2], sC[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const float fo = ex2(gi[u] - rp(nt, u));
          sQ[u] = fo * oq[nt][2 * hf + u];
          sK[u] = fo * ok[nt][2 * hf + u];
          sC[u] = ex2(rn(nt, u) - gi[u]) * oc[nt][2 * hf + u];
        }
        if (!diag) {  // strong decay: this block's own pairs one by one
          for (int j = 16 * p; j <= i; ++j) {
            float gj[2], kj[2];
            load_n<2>(gam + j * KH + x, gj);
            load_n<2>(ks + qk_at(j, x), kj);
            const int at = i * C + (j ^ sw_pair(i));
            const float aq = tq[at], ak = tb[at];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
              const float ek = ex2(gi[u] - gj[u]) * kj[u];
              sQ[u] += aq * ek;
              sK[u] += ak * ek;
            }
          }
          for (int i2 = i; i2 < min(L, 16 * p + 16); ++i2) {
            float gj[2], qj[2], kj[2];
            load_n<2>(gam + i2 * KH + x, gj);
            load_n<2>(qs + qk_at(i2, x), qj);
            load_n<2>(ks + qk_at(i2, x), kj);
            const int at = i2 * C + (i ^ sw_pair(i2));
            const float aq = tq[at], ak = tb[at];
#pragma unroll
            for (int u = 0; u < 2; ++u) sC[u] += ex2(gj[u] - gi[u]) * (aq * qj[u] + ak * kj[u]);
          }
        }
        float dQ[2], dK[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const float eg = ex2(gi[u]), elg = ex2(gl[u] - gi[u]);
          dQ[u] = dqg[u] * eg + sQ[u];
          dK[u] = bi * eg * dkb[u] + dkgl[u] * elg + (sK[u] + sC[u]);
          float dG = dqg[u] * qi[u] * eg + dkb[u] * bi * ki[u] * eg - dkgl[u] * ki[u] * elg +
                     qi[u] * sQ[u] + ki[u] * (sK[u] - sC[u]);
          dbp[s][hf] += dkb[u] * ki[u] * eg;
          glp[s][nt][u] += dkgl[u] * ki[u] * elg;
          dgam[s][nt][hf][u] = dG;
        }
        pq[nt] = mma::pack_bf16(dQ[0], dQ[1]);
        pk[nt] = mma::pack_bf16(dK[0], dK[1]);
      }
      // The row's 16 channels (32 bytes, one sector) lie on the quad's lanes as pairs 2 c and
      // 8 + 2 c; 4-byte stores of them half-filled the sectors of each store (ncu: 22 of 32 bytes
      // a sector). Lanes c and c ^ 1 swap a pair so that each holds 4 consecutive channels (even
      // c: 2 c..2 c + 3, odd c: 8 + 2 c - 2..8 + 2 c + 1): one 8-byte store a lane, whole sectors.
      const bool odd = cq4 & 1;
      const uint32_t rq = __shfl_xor_sync(0xffffffffu, odd ? pq[0] : pq[1], 1);
      const uint32_t rk = __shfl_xor_sync(0xffffffffu, odd ? pk[0] : pk[1], 1);
      if (i < L) {
        const int64_t at = ((t0 + i) * a.H + h) * K + x0 + n0 + 8 * odd + 4 * (cq4 >> 1);
        *reinterpret_cast<uint2*>(dq + at) = odd ? make_uint2(rq, pq[1]) : make_uint2(pq[0], rq);
        *reinterpret_cast<uint2*>(dk + at) = odd ? make_uint2(rk, pk[1]) : make_uint2(pk[0], rk);
      }
    }
  }
  // dbeta's reads of dR and v for the rows of the half's parity, i = 2 (w + 8 m) + z, go out
  // now, to arrive during the reverse cumsum.
  constexpr int kDbRows = kMaxC / 2 / (kGradThreads / 32);
  float dr[kDbRows][4], vv[kDbRows][4];
#pragma unroll
  for (int m = 0; m < kDbRows; ++m) {
    const int i = 2 * (w + kGradThreads / 32 * m) + z;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int y = lane + 32 * n;
      const bool in = i < L && y < V;
      dr[m][n] = in ? a.bblk(c, h)[lay.dR() + i * V + y] : 0.f;
      vv[m][n] = in ? ld(v, ((t0 + i) * a.H + h) * V + y) : 0.f;
    }
  }
  float dbq[2][2];
#pragma unroll
  for (int s = 0; s < 2; ++s) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) dbq[s][hf] = mma::quad_sum(dbp[s][hf]);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int u = 0; u < 2; ++u)  // over the 8 row groups g, in a fixed order
#pragma unroll
        for (int o = 4; o < 32; o <<= 1)
          glp[s][nt][u] += __shfl_xor_sync(0xffffffffu, glp[s][nt][u], o);
  }
  __syncthreads();  // every warp is done with gam, qs, ks and the tiles
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const int ci = w + 8 * s, p = ci >> 2, cg = ci & 3;
    // As dq's stores: lanes c and c ^ 1 swap a pair, one 16-byte store of 4 consecutive
    // channels a lane (2 rows of a quarter warp on the same 16 banks: 2-way, where the two
    // 8-byte stores of 8 rows on the same 8 banks were 8-way each).
    const bool odd = cq4 & 1;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * p + g + 8 * hf;
      const float(&d0)[2] = dgam[s][0][hf], (&d1)[2] = dgam[s][1][hf];
      const float r0 = __shfl_xor_sync(0xffffffffu, odd ? d0[0] : d1[0], 1);
      const float r1 = __shfl_xor_sync(0xffffffffu, odd ? d0[1] : d1[1], 1);
      *reinterpret_cast<float4*>(gam + i * KH + 16 * cg + 8 * odd + 4 * (cq4 >> 1)) =
          odd ? make_float4(r0, r1, d1[0], d1[1]) : make_float4(d0[0], d0[1], r0, r1);
      if (cq4 == 0) dbs[i * 4 + cg] = dbq[s][hf];
    }
    if (g == 0)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
        *reinterpret_cast<float2*>(glpart + p * KH + 16 * cg + 8 * nt + 2 * cq4) =
            make_float2(glp[s][nt][0], glp[s][nt][1]);
  }
  __syncthreads();
  // dg = reverse cumsum of dGam (rows past L hold zero), dGam_L joining row L - 1's.
  {
    const int x = tid % KH;
    const float add =
        dGamL[x] + glpart[x] + glpart[KH + x] + glpart[2 * KH + x] + glpart[3 * KH + x];
    scan_64x64<true>(gam, part, 1.f, L - 1, add);
  }
  for (int e = tid; e < L * KH; e += kGradThreads) {
    const int i = e / KH, x = e % KH;
    a.dg[((t0 + i) * a.H + h) * K + x0 + x] = gam[e];
  }
  // As grads_kernel (TC): v . dR, dv and Tm . KK of the rows of the half's parity, every row's
  // channel shares, into the U rows of the prepared block (dbeta_sum_kernel adds the halves).
#pragma unroll
  for (int m = 0; m < kDbRows; ++m) {
    const int i1 = 2 * (w + kGradThreads / 32 * m) + z, i2 = i1 + 1 - 2 * z;
    if (i1 < L) {
      float s = 0.f;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int y = lane + 32 * n;
        if (y < V) {
          s += vv[m][n] * dr[m][n];
          st(dv, ((t0 + i1) * a.H + h) * V + y, b[i1] * dr[m][n]);
        }
      }
      if (lane == 0) s += tkk[i1];
      if (lane < 4) s += dbs[i1 * 4 + lane];
      s = warp_sum(s);
      if (lane == 0) blk[lay.dbeta_parts() + z * C + i1] = s;
    }
    if (i2 < L) {
      float s = lane < 4 ? dbs[i2 * 4 + lane] : 0.f;
      s = warp_sum(s);
      if (lane == 0) blk[lay.dbeta_parts() + z * C + i2] = s;
    }
  }
}

// TC: dbeta_i = the channel halves' shares (grads_kernel, in the U rows of the prepared block),
// added in the order of the halves: bit-repeatable, no atomics. A thread per row of the chunk.
__global__ void dbeta_sum_kernel(Args a) {
  const int64_t c = blockIdx.x, h = blockIdx.y;
  const int i = threadIdx.x;
  if (i >= a.clen[c]) return;
  const float* u = a.blk(c, h) + a.lay.dbeta_parts();
  float s = u[i];
  for (int z = 1; z < kGradSplit; ++z) s += u[z * a.C + i];
  a.dbeta[(a.ct0[c] + i) * a.H + h] = s;
}

// `prepared`: the caller's prepared blocks (undefined: they go to the workspace).
Args make_args(Context& ctx, const KdaParams& p, const Tensor& cu, const Tensor& q, const Tensor& g,
               const Tensor& beta, int64_t nchunks, bool backward, const Tensor& prepared,
               Tensor& space) {
  Args a{};
  a.T = p.tokens;
  a.H = p.heads;
  a.N = p.num_seqs;
  a.nchunks = nchunks;
  a.C = static_cast<int>(p.chunk);
  a.K = static_cast<int>(p.head_k);
  a.V = static_cast<int>(p.head_v);
  a.scale = p.qk_scale();
  const bool kept = prepared.defined();
  a.keep = backward || p.keep_for_backward;
  a.keep_block = backward || (p.keep_for_backward && kept);
  a.lay = kda_chunk_layout(p, q.dtype());
  a.block = a.lay.block();
  space =
      ctx.workspace().alloc({kda_chunk_workspace_floats(p, nchunks, backward, kept, q.dtype())});
  float* base = ptr<float>(space);
  int32_t* table = reinterpret_cast<int32_t*>(base);
  // In kda_chunk_table_ints's order; the ready flags (nchunks x heads + 1) after dchunk0 (N + 1).
  a.ct0 = table;
  a.clen = table + nchunks;
  a.dchunk0 = table + 2 * nchunks;
  a.dorder = a.dchunk0 + p.num_seqs + 1 + nchunks * p.heads + 1;
  a.corder = a.dorder + p.num_seqs;
  float* next = base + kda_chunk_table_ints(nchunks, p.num_seqs, p.heads);
  if (kept) {
    a.ws = const_cast<float*>(ptr<float>(prepared));
  } else {
    a.ws = next;
    next += nchunks * p.heads * a.block;
  }
  if (backward) {
    a.back = next;
    a.dS = a.back + nchunks * p.heads * a.lay.back_block();
  }
  a.g = ptr<float>(g);
  a.beta = ptr<float>(beta);
  chunk_table_kernel<<<1, 256, 0, stream(ctx)>>>(
      ptr<int32_t>(cu), p.num_seqs, p.tokens, a.C, nchunks, const_cast<int32_t*>(a.ct0),
      const_cast<int32_t*>(a.clen), const_cast<int32_t*>(a.dchunk0), const_cast<int32_t*>(a.dorder),
      const_cast<int32_t*>(a.corder));
  MT_CUDA_LAUNCH_CHECK();
  return a;
}

// The chunk states: fp32, or bf16 (the entries checked kda_bf16_states_fit, which implies the bf16
// prepared layout and with it the tensor-core state passes).
void set_saved(Args& a, const Tensor& saved) {
  if (saved.dtype() == DType::BF16) {
    MT_CHECK(a.lay.half, InternalError, "kda: bf16 chunk states off the bf16 prepared layout");
    a.saved_h = ptr<__nv_bfloat16>(saved);
  } else {
    a.saved = ptr<float>(saved);
  }
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(bytes)));
  // All of L1 as shared memory, so that kernels under half of it fit twice per SM.
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
}

template <typename T>
void prep(Context& ctx, const Args& a, const Tensor& q, const Tensor& k, const Tensor& v) {
  const size_t sm = prep_smem<T>(a.C, a.K, a.V);
  // The block pairs on tensor cores: bf16 (float Gam), chunk 64, K 128 (one channel per thread).
  auto* kernel = prep_kernel<T, false>;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    // The tensor-core prep takes every call on its path (kda_fwd_tc.h; unaligned tensors through
    // narrower loads), and only it writes the bf16 layout.
    // (A caller's prepared tensor off 16-byte alignment keeps the fp32 layout's CUDA-core prep.)
    const KdaParams pp{.head_k = a.K, .head_v = a.V, .chunk = a.C};
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

template <typename T>
void grads(Context& ctx, const Args& a, const Tensor& q, const Tensor& k, const Tensor& v,
           Tensor& dq, Tensor& dk, Tensor& dv) {
  size_t sm = grads_smem<T>(a.C, a.K);
  unsigned split = 1;
  bool v2 = false;  // grads_v2_kernel (bf16 only)
  // The block pairs on tensor cores and the channel halves under prep's condition, where q, k
  // and g take the 16-byte loads of TC's load phase (and dq, dk its pair stores).
  auto* kernel = grads_kernel<T, false>;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (a.C == kMaxC && a.K == kMaxKV && aligned(q.raw()) && aligned(k.raw()) && aligned(a.g) &&
        aligned(dq.raw()) && aligned(dk.raw())) {
      kernel = grads_kernel<T, true>;
      sm = grads_smem<T>(kMaxC, kHalf) + kGradTileBytes;
      split = kGradSplit;
      v2 = kda_grads_v2();
    }
  }
  const dim3 chunks(static_cast<unsigned>(a.nchunks), static_cast<unsigned>(a.H));
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (v2) {
      allow_smem(grads_v2_kernel, kGradV2Bytes);
      grads_v2_kernel<<<static_cast<unsigned>(kGradSplit * a.nchunks * a.H), kGradThreads,
                        kGradV2Bytes, stream(ctx)>>>(a, ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(dq),
                                                     ptr<T>(dk), ptr<T>(dv));
      MT_CUDA_LAUNCH_CHECK();
    }
  }
  if (!v2) {
    allow_smem(kernel, sm);
    kernel<<<dim3(chunks.x, chunks.y, split), kGradThreads, sm, stream(ctx)>>>(
        a, ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(dq), ptr<T>(dk), ptr<T>(dv));
    MT_CUDA_LAUNCH_CHECK();
  }
  if (split > 1) {
    dbeta_sum_kernel<<<chunks, kMaxC, 0, stream(ctx)>>>(a);
    MT_CUDA_LAUNCH_CHECK();
  }
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

void kda_chunk_forward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                       const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                       const Tensor& h0, Tensor& o, Tensor& hT, Tensor& saved, Tensor& prepared) {
  ArenaScope scope(ctx.workspace());
  Tensor space;
  Args a = make_args(ctx, p, cu_seqlens, q, g, beta, saved.dim(0), false, prepared, space);
  set_saved(a, saved);
  a.h0 = h0.defined() && h0.numel() ? ptr<float>(h0) : nullptr;
  a.hT = hT.defined() && hT.numel() ? ptr<float>(hT) : nullptr;
  MT_DISPATCH_FLOAT(q, "kda", {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      // The bf16 layout implies the tensor-core prep (prep<T> below) and state_tc_fits.
      if (const int blocks = kda_detail::forward_overlap_blocks(ctx, a)) {
        // The prep's persistent grid, then the state pass as its programmatic dependent, which
        // runs beside it on the flags the prep sets per (chunk, head), after the chunk table
        // (kda_forward_overlap).
        a.ready = const_cast<int32_t*>(a.dchunk0) + p.num_seqs + 1;
        MT_CUDA_CHECK(
            cudaMemsetAsync(a.ready, 0, sizeof(int32_t) * (a.nchunks * a.H + 1), stream(ctx)));
        kda_detail::prep_tc(ctx, a, ptr<__nv_bfloat16>(q), ptr<__nv_bfloat16>(k),
                            ptr<__nv_bfloat16>(v), blocks);
        return kda_detail::forward_state_tc_follow(ctx, a, ptr<__nv_bfloat16>(o));
      }
    }
    prep<T>(ctx, a, q, k, v);
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      if (kda_detail::state_tc_fits(a))
        return kda_detail::forward_state_tc(ctx, a, ptr<__nv_bfloat16>(o));
    }
    // The CUDA-core passes read the fp32 layout only; the bf16 one implies state_tc_fits.
    MT_CHECK(!a.lay.half, ValueError, "kda_forward: bf16 prepared layout without tensor cores");
    launch_state(ctx, a, fwd_state_smem(a.C, a.K), fwd_state_kernel<T, true>,
                 fwd_state_kernel<T, false>, ptr<T>(o));
  });
}

void kda_chunk_backward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        const Tensor& saved, Tensor& prepared, const Tensor& dout,
                        const Tensor& dhT, Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg,
                        Tensor& dbeta, Tensor& dh0) {
  ArenaScope scope(ctx.workspace());
  Tensor space;
  Args a = make_args(ctx, p, cu_seqlens, q, g, beta, saved.dim(0), true, prepared, space);
  set_saved(a, saved);
  a.dhT = dhT.defined() && dhT.numel() ? ptr<float>(dhT) : nullptr;
  a.dh0 = dh0.defined() && dh0.numel() ? ptr<float>(dh0) : nullptr;
  a.dg = ptr<float>(dg);
  a.dbeta = ptr<float>(dbeta);
  const dim3 chunks(static_cast<unsigned>(a.nchunks), static_cast<unsigned>(a.H));
  // The bf16 states imply the bf16 layout and with it the tensor-core prep (prep<T> below).
  a.fuse_delta = kda_fused_delta() && kda_prep_v2() && a.saved_h && !prepared.defined();
  a.fuse_pre = a.fuse_delta && kda_fused_pre() && reinterpret_cast<uintptr_t>(dout.raw()) % 16 == 0;
  if (a.fuse_pre) a.dout = ptr<__nv_bfloat16>(dout);
  MT_DISPATCH_FLOAT(q, "kda", {
    if (!prepared.defined()) prep<T>(ctx, a, q, k, v);
    bool tensor_cores = false;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) tensor_cores = kda_detail::state_tc_fits(a);
    MT_CHECK(tensor_cores || !a.lay.half, ValueError,
             "kda_backward: bf16 prepared layout without tensor cores");
    if (tensor_cores)
      kda_detail::backward_state_tc(ctx, a, ptr<__nv_bfloat16>(dout));
    else
      launch_state(ctx, a, bwd_state_smem(a.C, a.K), bwd_state_kernel<T, true>,
                   bwd_state_kernel<T, false>, ptr<T>(dout));
    bool tc_products = false;
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
      tc_products = kda_detail::products_tc_fits(a, dout.raw());
    if (tc_products) {
      kda_detail::products_tc(ctx, a, ptr<__nv_bfloat16>(dout));
    } else {
      allow_smem(products_kernel<T>, kProductSmem);
      products_kernel<T>
          <<<dim3(chunks.x, chunks.y, 3), kThreads, kProductSmem, stream(ctx)>>>(a, ptr<T>(dout));
      MT_CUDA_LAUNCH_CHECK();
    }
    grads<T>(ctx, a, q, k, v, dq, dk, dv);
  });
}

}  // namespace mt::ops::cuda
