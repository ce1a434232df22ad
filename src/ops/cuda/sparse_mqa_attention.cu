// Sparse attention in the absorbed MQA form (ops/sparse_mqa_attention.h) on tensor cores: every
// head of a query reads the same 576-wide latent + rope entry per listed key, so one block per
// (query, up to 64 heads) gathers each key once for all of them, and the heads are the MMA's rows.
//
// Warps: R row groups of 16 heads x kCols = 4. The 576 / 512 widths are too wide for one warp's
// accumulators (16 x 512 fp32 would be 256 registers per lane; FlashMLA splits the value dims
// over warp groups for the same reason), so the four warps of a row group split the work:
// - S = q k^T: warp cg takes keys 8 cg .. 8 cg + 7 of the 32-key tile, over all 576 dims; the
//   tile's row maxima meet in shared memory, and P (bf16) goes to shared memory for
// - O += P V: warp cg owns value columns 128 cg .. 128 cg + 127 over the tile's 32 keys.
// Keys are gathered 32 at a time through cp.async, double buffered, unused slots zero-filled and
// masked; online softmax in log2 units, lse saved (natural log); a row without a valid slot gives
// o = 0 and lse = -inf, as on the CPU.
//
// Backward, per (query, heads) again, P recomputed from the lse: warp cg forms S and
// dP = dout V^T for its 8 keys, P and dS = scale P (dP - Delta) go to shared memory; then
// dq (16 x 144 columns per warp) += dS K, and the tile's key gradient
// dkv[key] += dS^T q (576 columns) + P^T dout (the first 512), summed over all the block's heads
// on the tensor cores, is added with fp32 float4 atomics (sm_90's vector red) into an f32 buffer,
// rounded to bf16 at the end. Atomics rather than a transposed index table: gathering per key
// would re-read a query's whole q and dout rows (64 x 1088 bf16) and recompute P for every
// (key, query) pair, where here each product is formed once next to its operands, and the lists
// of the selection are dense in popular keys (every query lists its recent neighbours). The
// additions' order varies, so a deterministic context runs the composite (the direct kernels'
// transposed table, one writer per key gradient) instead.
// Asked for the DSA KL target, the backward also sums P over its block's heads per tile
// (head_sum_part: mqa_prob_sum_kernel's sums bit for bit) and writes the tile's slots: shuffles
// and one 32-float row per row group, where the separate pass re-gathers every key and
// recomputes S for all heads.
#include <algorithm>
#include <climits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cutlass/sparse_mqa_wgmma.h"
#include "ops/cuda/mma.cuh"
#include "ops/sparse_mqa_attention.h"

namespace mt::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kDk = 576, kDv = 512;
constexpr int kSlots = 32;  // keys per tile
constexpr int kCols = 4;    // warps per row group of 16 heads
constexpr int kPad = 8;     // bf16 padding per shared row: strides of 16 (mod 128) bytes
constexpr int kLd = kDk + kPad, kLdv = kDv + kPad, kLp = kSlots + kPad;
constexpr int kVCols = kDv / kCols, kQCols = kDk / kCols;  // per warp: 128 and 144
constexpr int kMaxRows = 4;                                // row groups: 64 heads per block
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kSlots == 32, "a tile's slots are one per lane (the block-uniform empty-tile test)");
static_assert(kSlots / kCols == 8, "S: one m16n8 tile of keys per warp");
static_assert(kVCols % 8 == 0 && kQCols % 8 == 0 && kDk % 16 == 0 && kDv % 16 == 0,
              "column quarters of whole n-tiles, k of whole m16n8k16 steps");
static_assert((kLd * 2) % 128 == 16 && (kLdv * 2) % 128 == 16, "conflict-free ldmatrix rows");

struct Launch {
  int64_t T, H, K;
  float scale;
};

// `rows` rows of D elements (row stride D in global memory) into tile[rows][LD]; rows from
// `valid` on are zero (heads past H in the last block).
template <int D, int LD>
__device__ __forceinline__ void stage_rows(bf16* tile, const bf16* src, int rows, int valid) {
  constexpr int chunks = D / 8;
  for (int i = threadIdx.x; i < rows * chunks; i += blockDim.x) {
    const int r = i / chunks, c8 = (i % chunks) * 8;
    bf16* d = tile + r * LD + c8;
    if (r < valid)
      mma::cp_async16(d, src + static_cast<int64_t>(r) * D + c8);
    else
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
  }
}

// The entries listed in slots j0 .. j0 + kSlots - 1 of `row` into tile[kSlots][kLd] (zero for
// unused slots: their P is 0, and 0 x stale shared memory could be NaN), their positions into
// slot[] (-1 when unused).
__device__ __forceinline__ void gather(bf16* tile, int* slot, const bf16* kv, int64_t T,
                                       const int32_t* row, int64_t j0, int64_t K) {
  constexpr int chunks = kDk / 8;
  for (int i = threadIdx.x; i < kSlots * chunks; i += blockDim.x) {
    const int r = i / chunks, c8 = (i % chunks) * 8;
    const int64_t j = j0 + r;
    const int32_t s = j < K ? row[j] : -1;
    const bool ok = valid_slot(s, T);
    bf16* d = tile + r * kLd + c8;
    if (ok)
      mma::cp_async16(d, kv + static_cast<int64_t>(s) * kDk + c8);
    else
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    if (c8 == 0) slot[r] = ok ? s : -1;
  }
}

// Starts gathering tile it + 1 into the other buffer and waits until tile it (and everything
// committed before it) has landed for every thread; returns tile it's buffer.
__device__ __forceinline__ int next_tile(const Launch& l, bf16* const buf[2], int* slots,
                                         const bf16* kv, const int32_t* row, int it, int tiles) {
  const int b = it & 1;
  if (it + 1 < tiles)
    gather(buf[b ^ 1], slots + (b ^ 1) * kSlots, kv, l.T, row,
           static_cast<int64_t>(it + 1) * kSlots, l.K);
  mma::cp_async_commit();
  mma::cp_async_wait<1>();
  __syncthreads();
  return b;
}

// Where a thread works: the block's query t and first head h0, the heads it holds (valid; the
// rest of the M rows are padding), the lane's fragment rows r0 and r1 = r0 + 8 in row group rg
// and its key / column quarter cg. Split kernels take the queries last to first: a causal
// selection's later queries list the most keys, so the blocks that start last are the shortest
// and the launch's tail is short (at 8K, 8,192 blocks over 264 resident ones: in query order the
// last to start are full 64-tile blocks, about one such block's time, 1/31 of the launch, with
// the SMs emptying; estimated, not measured on its own).
struct Place {
  int64_t t, h0;
  int valid, lane, w, rg, cg, c, r0, r1;
};

template <int M, bool Split>
__device__ __forceinline__ Place place_of(const Launch& l) {
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * M;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, rg = w / kCols;
  return {Split ? l.T - 1 - static_cast<int64_t>(blockIdx.x) : static_cast<int64_t>(blockIdx.x),
          h0,
          static_cast<int>(min(static_cast<int64_t>(M), l.H - h0)),
          lane,
          w,
          rg,
          w % kCols,
          lane & 3,
          16 * rg + (lane >> 2),
          16 * rg + (lane >> 2) + 8};
}

// The Split kernels' gather: a block of NTHR threads gives each slot of the tile NTHR / kSlots
// threads, and thread i copies chunks i % (NTHR / kSlots) + k NTHR / kSlots of slot i /
// (NTHR / kSlots): one slot index per thread, which the kernel loads a tile ahead (slot_of), so
// that the index's global latency (a miss at 8K, where the [T, 2048] table is 64 MiB) no longer
// stalls every warp right after the barrier that publishes a tile, as `gather`'s loads did.
template <int NTHR>
__device__ __forceinline__ int32_t slot_of(const int32_t* row, int64_t tile, int64_t K) {
  const int64_t j = tile * kSlots + threadIdx.x / (NTHR / kSlots);
  return j < K ? row[j] : -1;
}

template <int NTHR>
__device__ __forceinline__ void gather_slot(bf16* tile, int* slot, const bf16* kv, int64_t T,
                                            int32_t s) {
  constexpr int per_slot = NTHR / kSlots, chunks = kDk / 8;
  static_assert(NTHR % kSlots == 0 && chunks % per_slot == 0, "whole chunks per thread");
  const int r = threadIdx.x / per_slot, c0 = threadIdx.x % per_slot;
  const bool ok = valid_slot(s, T);
  bf16* d = tile + r * kLd;
  const bf16* src = kv + (ok ? static_cast<int64_t>(s) * kDk : 0);
#pragma unroll
  for (int k = 0; k < chunks / per_slot; ++k) {
    const int c8 = 8 * (c0 + per_slot * k);
    if (ok)
      mma::cp_async16(d + c8, src + c8);
    else
      *reinterpret_cast<uint4*>(d + c8) = make_uint4(0, 0, 0, 0);
  }
  if (c0 == 0) slot[r] = ok ? s : -1;
}

// Stages the block's q rows (and, for the backward, its dout rows into Os) as one cp.async group
// and starts gathering tile 0 as the next; returns the number of tiles. Split: through
// gather_slot, and `next` gets the thread's slot index of tile 1.
template <int M, bool Split>
__device__ __forceinline__ int start(const Launch& l, const Place& pl, bf16* Qs, const bf16* q,
                                     bf16* const buf[2], int* slots, const bf16* kv,
                                     const int32_t* row, int32_t& next, bf16* Os = nullptr,
                                     const bf16* dout = nullptr) {
  const int64_t th = pl.t * l.H + pl.h0;
  stage_rows<kDk, kLd>(Qs, q + th * kDk, M, pl.valid);
  if (Os) stage_rows<kDv, kLdv>(Os, dout + th * kDv, M, pl.valid);
  mma::cp_async_commit();
  const int tiles = static_cast<int>((l.K + kSlots - 1) / kSlots);
  if constexpr (Split) {
    if (tiles > 0) gather_slot<8 * M>(buf[0], slots, kv, l.T, slot_of<8 * M>(row, 0, l.K));
    next = slot_of<8 * M>(row, 1, l.K);
  } else if (tiles > 0) {
    gather(buf[0], slots, kv, l.T, row, 0, l.K);
  }
  mma::cp_async_commit();
  return tiles;
}

// c += A B^T for rows 16 rg .. of A (row-major, width D) against keys n0 .. n0 + 7 of B.
template <int D>
__device__ __forceinline__ void scores(float c[4], const bf16* A, int lda, int rg, const bf16* B,
                                       int n0, int lane) {
#pragma unroll 4
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4], b[2];
    mma::ldsm_a(a, A, lda, 16 * rg, 16 * kk, lane);
    mma::ldsm_b_nk(b, B, kLd, n0, 16 * kk, lane);
    mma::mma_bf16(c, a, b);
  }
}

// Fragment loads of the Split kernels, two B fragments per ldmatrix .x4 where mma.cuh's load
// one per .x2 (half the load instructions; lanes 16-31 address the second pair of 8x8 blocks):
// - two k steps (k0 .. k0 + 15 into b0, k0 + 16 .. k0 + 31 into b1) of keys n0 .. n0 + 7 of an
//   n-major tile[n][k], as mma::ldsm_b_nk loads one;
__device__ __forceinline__ void ldsm_b_nk_2k(uint32_t b0[2], uint32_t b1[2], const bf16* tile,
                                             int ld, int n0, int k0, int lane) {
  mma::ldsm_x4_pair<false>(b0, b1, tile + (n0 + (lane & 7)) * ld + k0 + (lane >> 3) * 8);
}

// - two adjacent n-tiles (n0 .. n0 + 7 into b0, n0 + 8 .. n0 + 15 into b1; k0 .. k0 + 15) of a
//   k-major tile[k][n], as mma::load_b_kn loads one;
__device__ __forceinline__ void load_b_kn_2n(uint32_t b0[2], uint32_t b1[2], const bf16* tile,
                                             int ld, int k0, int n0, int lane) {
  mma::ldsm_x4_pair<true>(b0, b1, tile + (k0 + (lane & 15)) * ld + n0 + (lane >> 4) * 8);
}

// - two k steps (k0 .. k0 + 15 into b0, k0 + 16 .. k0 + 31 into b1) of columns n0 .. n0 + 7 of
//   a k-major tile[k][n].
__device__ __forceinline__ void load_b_kn_2k(uint32_t b0[2], uint32_t b1[2], const bf16* tile,
                                             int ld, int k0, int n0, int lane) {
  mma::ldsm_x4_pair<true>(b0, b1, tile + (k0 + lane) * ld + n0);
}

// The B fragments of R k steps (16 rows each) of columns n0 .. n0 + 7 of a k-major tile[k][n]:
// two steps per load_b_kn_2k, one for an odd R's last.
template <int R>
__device__ __forceinline__ void load_b_kn_steps(uint32_t (&b)[R][2], const bf16* tile, int ld,
                                                int n0, int lane) {
#pragma unroll
  for (int kk = 0; kk < R; kk += 2) {
    if (kk + 1 < R)
      load_b_kn_2k(b[kk], b[kk + 1], tile, ld, 16 * kk, n0, lane);
    else
      mma::load_b_kn(b[kk], tile, ld, 16 * kk, n0, lane);
  }
}

// s = A B^T as `scores` forms it, over two accumulators (even and odd k steps) added at the
// end: one chain of D / 16 dependent MMAs waits out the MMA's latency at every step (at two to
// four warps per SM sub-partition nothing else fills it), two chains halve that wait. The Split
// kernels' forward, backward (scores_dp: the same chains) and prob sum all form S this way, so
// the backward's P and the KL target agree with the forward's lse and with each other bit for
// bit, as the Chained kernels' single chains do.
template <int D>
__device__ __forceinline__ void scores2(float s[4], const bf16* A, int lda, int rg, const bf16* B,
                                        int n0, int lane) {
  static_assert(D % 32 == 0, "whole pairs of k steps");
  float c[2][4] = {};
#pragma unroll 3
  for (int kk = 0; kk < D / 16; kk += 2) {
    uint32_t a[2][4], b[2][2];
    ldsm_b_nk_2k(b[0], b[1], B, kLd, n0, 16 * kk, lane);
#pragma unroll
    for (int j = 0; j < 2; ++j) mma::ldsm_a(a[j], A, lda, 16 * rg, 16 * (kk + j), lane);
    mma::mma_bf16(c[0], a[0], b[0]);
    mma::mma_bf16(c[1], a[1], b[1]);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) s[e] = c[0][e] + c[1][e];
}

// The Split backward's S = q k^T (576 dims, in scores2's two chains) and dP = dout v^T (the
// keys' first 512 dims, two chains of its own) for keys n0 .. n0 + 7: each key fragment feeds
// both products (the Chained kernel loaded it twice) and four chains overlap.
__device__ __forceinline__ void scores_dp(float s[4], float dp[4], const bf16* Qs, const bf16* Os,
                                          int rg, const bf16* Ks, int n0, int lane) {
  static_assert(kDv % 32 == 0 && (kDk - kDv) % 32 == 0, "whole pairs of k steps");
  float cs[2][4] = {}, cd[2][4] = {};
#pragma unroll 2
  for (int kk = 0; kk < kDv / 16; kk += 2) {
    uint32_t b[2][2];
    ldsm_b_nk_2k(b[0], b[1], Ks, kLd, n0, 16 * kk, lane);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint32_t aq[4], ao[4];
      mma::ldsm_a(aq, Qs, kLd, 16 * rg, 16 * (kk + j), lane);
      mma::ldsm_a(ao, Os, kLdv, 16 * rg, 16 * (kk + j), lane);
      mma::mma_bf16(cs[j], aq, b[j]);
      mma::mma_bf16(cd[j], ao, b[j]);
    }
  }
#pragma unroll
  for (int kk = kDv / 16; kk < kDk / 16; kk += 2) {  // the rope dims: S only
    uint32_t aq[2][4], b[2][2];
    ldsm_b_nk_2k(b[0], b[1], Ks, kLd, n0, 16 * kk, lane);
#pragma unroll
    for (int j = 0; j < 2; ++j) mma::ldsm_a(aq[j], Qs, kLd, 16 * rg, 16 * (kk + j), lane);
    mma::mma_bf16(cs[0], aq[0], b[0]);
    mma::mma_bf16(cs[1], aq[1], b[1]);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    s[e] = cs[0][e] + cs[1][e];
    dp[e] = cd[0][e] + cd[1][e];
  }
}

// c[jn] += X[16 rows of rg][kSlots] B[kSlots][n0 + 8 jn ..] with X (P or dS) in shared memory.
template <int NT>
__device__ __forceinline__ void times_tile(float (&c)[NT][4], const bf16* X, int rg, const bf16* B,
                                           int n0, int lane) {
#pragma unroll
  for (int kk = 0; kk < kSlots / 16; ++kk) {
    uint32_t a[4];
    mma::ldsm_a(a, X, kLp, 16 * rg, 16 * kk, lane);
#pragma unroll
    for (int jn = 0; jn < NT; ++jn) {
      uint32_t b[2];
      mma::load_b_kn(b, B, kLd, 16 * kk, n0 + 8 * jn, lane);
      mma::mma_bf16(c[jn], a, b);
    }
  }
}

// times_tile for the Split kernels: the same products in the same order, B fragments two n-tiles
// per load (load_b_kn_2n).
template <int NT>
__device__ __forceinline__ void times_tile2(float (&c)[NT][4], const bf16* X, int rg, const bf16* B,
                                            int n0, int lane) {
  static_assert(NT % 2 == 0, "pairs of n-tiles");
#pragma unroll
  for (int kk = 0; kk < kSlots / 16; ++kk) {
    uint32_t a[4];
    mma::ldsm_a(a, X, kLp, 16 * rg, 16 * kk, lane);
#pragma unroll
    for (int jn = 0; jn < NT; jn += 2) {
      uint32_t b0[2], b1[2];
      load_b_kn_2n(b0, b1, B, kLd, 16 * kk, n0 + 8 * jn, lane);
      mma::mma_bf16(c[jn], a, b0);
      mma::mma_bf16(c[jn + 1], a, b1);
    }
  }
}

template <int R>
constexpr size_t fwd_smem() {
  return sizeof(bf16) * (16 * R * kLd + 2 * kSlots * kLd + 16 * R * kLp) +
         sizeof(float) * 16 * R * kCols + sizeof(int) * 2 * kSlots;
}

// Barrier for the kCols warps of row group rg alone (named barrier 1 + rg; __syncthreads takes
// 0): a row group's maxima and P are written and read by its own warps only.
__device__ __forceinline__ void row_group_sync(int rg) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + rg), "n"(kCols * 32) : "memory");
}

// Split (the SparseMqaKernels choice): S in scores2's two chains; the next tile's gather issued
// right after the barrier that publishes this one, which every warp reaches only when done with
// the previous tile's buffer, P and maxima, so the end-of-tile barrier goes; and the maxima and P
// exchanged behind row-group barriers (row_group_sync), so the row groups do not wait for each
// other within a tile: one block-wide barrier per tile, not four.
template <int R, bool Split>
__global__ void __launch_bounds__(R* kCols * 32, Split ? 2 : 0)
    mqa_fwd_kernel(Launch l, const bf16* q, const bf16* kv, const int32_t* idx, bf16* o,
                   float* lse) {
  constexpr int M = 16 * R;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);  // [M][kLd]
  bf16* const buf[2] = {Qs + M * kLd, Qs + M * kLd + kSlots * kLd};
  bf16* Ps = buf[1] + kSlots * kLd;                      // [M][kLp]
  float* red = reinterpret_cast<float*>(Ps + M * kLp);   // [M][kCols] row maxima, then sums
  int* slots = reinterpret_cast<int*>(red + M * kCols);  // [2][kSlots]
  const Place pl = place_of<M, Split>(l);
  const auto [t, h0, valid, lane, w, rg, cg, c, r0, r1] = pl;
  const int32_t* row = idx + t * l.K;
  const float scale_log2 = l.scale * kLog2e;
  int32_t next = -1;  // Split: this thread's slot index of tile it + 1
  const int tiles = start<M, Split>(l, pl, Qs, q, buf, slots, kv, row, next);
  float acc[kVCols / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.f, 0.f};
  for (int it = 0; it < tiles; ++it) {
    int b = it & 1;
    if constexpr (Split) {
      mma::cp_async_wait<0>();
      __syncthreads();  // tile it landed; every warp is done with tile it - 1
      if (it + 1 < tiles) gather_slot<8 * M>(buf[b ^ 1], slots + (b ^ 1) * kSlots, kv, l.T, next);
      mma::cp_async_commit();
      next = slot_of<8 * M>(row, it + 2, l.K);  // used a tile from now
    } else {
      b = next_tile(l, buf, slots, kv, row, it, tiles);
    }
    const int* sl = slots + b * kSlots;
    const bf16* Ks = buf[b];
    if (__any_sync(0xffffffffu, sl[lane] >= 0)) {  // block-uniform
      float s[4] = {};
      if constexpr (Split)
        scores2<kDk>(s, Qs, kLd, rg, Ks, 8 * cg, lane);
      else
        scores<kDk>(s, Qs, kLd, rg, Ks, 8 * cg, lane);
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool ok = sl[8 * cg + 2 * c + (e & 1)] >= 0;
        s[e] = ok ? s[e] * scale_log2 : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[e]);
      }
      mx[0] = mma::quad_max(mx[0]);
      mx[1] = mma::quad_max(mx[1]);
      if (c == 0) {
        red[r0 * kCols + cg] = mx[0];
        red[r1 * kCols + cg] = mx[1];
      }
      if constexpr (Split)
        row_group_sync(rg);
      else
        __syncthreads();
      float al[2], mu[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float* rr = red + (r ? r1 : r0) * kCols;
        const float mn = fmaxf(fmaxf(m[r], fmaxf(rr[0], rr[1])), fmaxf(rr[2], rr[3]));
        mu[r] = mn == -INFINITY ? 0.f : mn;
        al[r] = exp2f(m[r] - mu[r]);
        m[r] = mn;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) s[e] = exp2f(s[e] - mu[e >> 1]);
      lsum[0] = lsum[0] * al[0] + s[0] + s[1];
      lsum[1] = lsum[1] * al[1] + s[2] + s[3];
      *reinterpret_cast<uint32_t*>(Ps + r0 * kLp + 8 * cg + 2 * c) = mma::pack_bf16(s[0], s[1]);
      *reinterpret_cast<uint32_t*>(Ps + r1 * kLp + 8 * cg + 2 * c) = mma::pack_bf16(s[2], s[3]);
#pragma unroll
      for (int jn = 0; jn < kVCols / 8; ++jn) {
        acc[jn][0] *= al[0];
        acc[jn][1] *= al[0];
        acc[jn][2] *= al[1];
        acc[jn][3] *= al[1];
      }
      // P of all four key quarters.
      if constexpr (Split)
        row_group_sync(rg);
      else
        __syncthreads();
      if constexpr (Split)
        times_tile2<kVCols / 8>(acc, Ps, rg, Ks, kVCols * cg, lane);
      else
        times_tile<kVCols / 8>(acc, Ps, rg, Ks, kVCols * cg, lane);
    }
    // Chained: every warp is done with this buffer, P and red before they are refilled.
    if constexpr (!Split) __syncthreads();
  }
  const float part[2] = {mma::quad_sum(lsum[0]), mma::quad_sum(lsum[1])};
  if (c == 0) {
    red[r0 * kCols + cg] = part[0];
    red[r1 * kCols + cg] = part[1];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int hr = r ? r1 : r0;
    if (hr >= valid) continue;
    const float* rr = red + hr * kCols;
    const float L = (rr[0] + rr[1]) + (rr[2] + rr[3]);
    const float inv = L > 0.f ? 1.f / L : 0.f;  // no valid slot: o = 0, lse = -inf
    const int64_t th = t * l.H + h0 + hr;
    bf16* orow = o + th * kDv + kVCols * cg + 2 * c;
#pragma unroll
    for (int jn = 0; jn < kVCols / 8; ++jn)
      *reinterpret_cast<__nv_bfloat162*>(orow + 8 * jn) =
          __floats2bfloat162_rn(acc[jn][2 * r] * inv, acc[jn][2 * r + 1] * inv);
    if (cg == 0 && c == 0) lse[th] = L > 0.f ? (m[r] + log2f(L)) * kLn2 : -INFINITY;
  }
}

// The Split backward keeps one key buffer (the Chained one two): 113,920 bytes at 32 heads, so
// two blocks share an SM (2 x (111.25 + 1) KiB of the 228).
template <int R, bool Split>
constexpr size_t bwd_smem() {
  constexpr int buffers = Split ? 1 : 2;
  return sizeof(bf16) * (16 * R * (kLd + kLdv) + buffers * kSlots * kLd + 2 * 16 * R * kLp) +
         sizeof(float) * (2 * 16 * R + R * kSlots) + sizeof(int) * 2 * kSlots;
}
static_assert(bwd_smem<kMaxRows, false>() <= 232448,
              "the backward's tiles fit Hopper's shared memory");
static_assert(2 * (bwd_smem<2, true>() + 1024) <= 233472,
              "two 32-head Split backward blocks fit an SM");

// The KL target's share of one tile (mqa_prob_sum_kernel and mqa_bwd_kernel, which must agree bit
// for bit): the lane's P of rows r0 and r1 for its two key columns summed over the fragment's
// rows (lane bits 2-4), the row group's sums into part[rg][kSlots].
__device__ __forceinline__ void head_sum_part(float* part, const float p[4], int rg, int cg, int c,
                                              int lane) {
  float v[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    v[e] = p[e] + p[2 + e];
#pragma unroll
    for (int x = 4; x < 32; x <<= 1) v[e] += __shfl_xor_sync(0xffffffffu, v[e], x);
  }
  if (lane < 4) {
    part[rg * kSlots + 8 * cg + 2 * c] = v[0];
    part[rg * kSlots + 8 * cg + 2 * c + 1] = v[1];
  }
}

// Thread j < kSlots writes slot it * kSlots + j of query t: the row groups' sums (0 for a tile
// without a valid slot), added when the heads span several blocks.
template <int R>
__device__ __forceinline__ void write_prob_sum(float* out, const float* part, const Launch& l,
                                               int64_t t, int it, bool any, bool add) {
  const int64_t j = static_cast<int64_t>(it) * kSlots + threadIdx.x;
  if (threadIdx.x < kSlots && j < l.K) {
    float v = 0.f;
    if (any)
#pragma unroll
      for (int g = 0; g < R; ++g) v += part[g * kSlots + threadIdx.x];
    if (add)
      atomicAdd(out + t * l.K + j, v);
    else
      out[t * l.K + j] = v;
  }
}

// Adds a C fragment (rows: slots m0 + g, m0 + g + 8; columns 8 n + 2c, +1) into the f32 rows of
// the listed keys, one float4 per lane: lanes c and c ^ 1 swap halves, so even c holds row g's
// columns 8 n + 2c .. + 3 and odd c row g + 8's columns 8 n + 2c - 2 .. + 1.
__device__ __forceinline__ void add_key_rows(float* dst, const int* sl, int m0, int n,
                                             const float cf[4], int lane) {
  const int c = lane & 3, g = lane >> 2;
  const bool even = (c & 1) == 0;
  const float x0 = __shfl_xor_sync(0xffffffffu, even ? cf[2] : cf[0], 1);
  const float x1 = __shfl_xor_sync(0xffffffffu, even ? cf[3] : cf[1], 1);
  const int s = sl[m0 + g + (even ? 0 : 8)];
  if (s < 0) return;
  const int col = 8 * n + 2 * c - (even ? 0 : 2);
  const float4 v = even ? make_float4(cf[0], cf[1], x0, x1) : make_float4(x0, x1, cf[2], cf[3]);
  atomicAdd(reinterpret_cast<float4*>(dst + static_cast<int64_t>(s) * kDk + col), v);
}

// Column tile n of the tile's key gradient (the Split backward): dS^T q and P^T dout in
// accumulators of their own, added before the atomics, so two chains of R MMAs overlap where the
// Chained loop waited on one chain of 2 R. (Two tiles at a time, four chains, spill at 128
// registers.)
template <int R>
__device__ __forceinline__ void key_grad_tile(float* dkv_acc, const int* sl, int m0, int n,
                                              const uint32_t (&ad)[R][4],
                                              const uint32_t (&ap)[R][4], const bf16* Qs,
                                              const bf16* Os, int lane) {
  float cq[4] = {}, co[4] = {};
  // Two k steps (16-head row groups) per load, one for an odd R's last: every bq[kk] and bo[kk]
  // is loaded whatever R (an odd R > 1 left bq[1], bo[1] unset when the odd-R branch loaded only
  // the even steps; only R <= 2 takes Split today).
  uint32_t bq[R][2], bo[R][2];
  load_b_kn_steps<R>(bq, Qs, kLd, 8 * n, lane);
#pragma unroll
  for (int kk = 0; kk < R; ++kk) mma::mma_bf16(cq, ad[kk], bq[kk]);
  if (8 * n < kDv) {  // the value columns: + P^T dout
    load_b_kn_steps<R>(bo, Os, kLdv, 8 * n, lane);
#pragma unroll
    for (int kk = 0; kk < R; ++kk) mma::mma_bf16(co, ap[kk], bo[kk]);
  }
  const float cf[4] = {cq[0] + co[0], cq[1] + co[1], cq[2] + co[2], cq[3] + co[3]};
  add_key_rows(dkv_acc, sl, m0, n, cf, lane);
}

// Split (the SparseMqaKernels choice): S and dP through scores_dp; dq += dS K behind a barrier of
// the row group (it reads its own rows of dS only); one key buffer, whose next tile is gathered
// once dq is done with it, under the key-gradient products (which read only q, dout, P and dS):
// two block-wide barriers per tile and one of a row group, where Chained had three block-wide;
// the key gradient in two chains per column tile (key_grad_tile). Blocks of up to 32 heads only
// (with_split): two share an SM (bwd_smem, and at most 128 registers a thread).
template <int R, bool Split>
__global__ void __launch_bounds__(R* kCols * 32, Split ? 2 : 0)
    mqa_bwd_kernel(Launch l, const bf16* q, const bf16* kv, const int32_t* idx, const bf16* o,
                   const float* lse, const bf16* dout, bf16* dq, float* dkv_acc, float* psum,
                   bool padd) {
  constexpr int M = 16 * R, W = R * kCols;
  // The key-gradient products: 2 slot halves x 72 column tiles, dealt as (half, run of NT).
  constexpr int NT = (kDk / 8) / (W / 2);
  static_assert(NT * (W / 2) == kDk / 8, "column tiles split evenly over the warps");
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);  // [M][kLd]
  bf16* Os = Qs + M * kLd;                   // [M][kLdv] dout
  // Key tiles [Split ? 1 : 2][kSlots][kLd] (Split: both names are the one buffer).
  bf16* const buf[2] = {Os + M * kLdv, Os + M * kLdv + (Split ? 0 : kSlots * kLd)};
  bf16* Ps = buf[1] + kSlots * kLd;                        // [M][kLp]
  bf16* Ds = Ps + M * kLp;                                 // [M][kLp] scale * dS
  float* lse2 = reinterpret_cast<float*>(Ds + M * kLp);    // [M] log2 units
  float* dl = lse2 + M;                                    // [M] Delta
  float* part = dl + M;                                    // [R][kSlots] the KL target's sums
  int* slots = reinterpret_cast<int*>(part + R * kSlots);  // [2][kSlots]
  const Place pl = place_of<M, Split>(l);
  const auto [t, h0, valid, lane, w, rg, cg, c, r0, r1] = pl;
  const int32_t* row = idx + t * l.K;
  const float scale_log2 = l.scale * kLog2e;
  int32_t next = -1;  // Split: this thread's slot index of tile it + 1
  const int tiles = start<M, Split>(l, pl, Qs, q, buf, slots, kv, row, next, Os, dout);
  // Delta = o . dout per head, a warp per head; padded heads get P = 0 through lse = -inf.
  for (int r = w; r < M; r += W) {
    const int64_t th = t * l.H + h0 + r;
    float s = 0.f;
    if (r < valid)
      for (int d = lane; d < kDv; d += 32)
        s += __bfloat162float(o[th * kDv + d]) * __bfloat162float(dout[th * kDv + d]);
    s = warp_sum(s);
    if (lane == 0) {
      dl[r] = s;
      lse2[r] = r < valid ? lse[th] * kLog2e : -INFINITY;
    }
  }
  float acc[kQCols / 8][4] = {};
  for (int it = 0; it < tiles; ++it) {
    int b = it & 1;  // Split: the slot list's buffer (the keys have one)
    if constexpr (Split) {
      mma::cp_async_wait<0>();
      __syncthreads();  // tile it landed (also Delta and lse); every warp is done with tile it - 1
    } else {
      b = next_tile(l, buf, slots, kv, row, it, tiles);  // also Delta and lse
    }
    const int* sl = slots + b * kSlots;
    const bf16* Ks = buf[Split ? 0 : b];
    const bool any = __any_sync(0xffffffffu, sl[lane] >= 0);  // block-uniform
    if (any) {
      float s[4] = {}, dp[4] = {};
      if constexpr (Split) {
        scores_dp(s, dp, Qs, Os, rg, Ks, 8 * cg, lane);
      } else {
        scores<kDk>(s, Qs, kLd, rg, Ks, 8 * cg, lane);
        scores<kDv>(dp, Os, kLdv, rg, Ks, 8 * cg, lane);
      }
      const float lr[2] = {lse2[r0], lse2[r1]}, dr[2] = {dl[r0], dl[r1]};
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const bool ok = sl[8 * cg + 2 * c + (e & 1)] >= 0 && lr[r] != -INFINITY;
        p[e] = ok ? exp2f(s[e] * scale_log2 - lr[r]) : 0.f;
        s[e] = l.scale * p[e] * (dp[e] - dr[r]);
      }
      const int col = 8 * cg + 2 * c;
      *reinterpret_cast<uint32_t*>(Ps + r0 * kLp + col) = mma::pack_bf16(p[0], p[1]);
      *reinterpret_cast<uint32_t*>(Ps + r1 * kLp + col) = mma::pack_bf16(p[2], p[3]);
      *reinterpret_cast<uint32_t*>(Ds + r0 * kLp + col) = mma::pack_bf16(s[0], s[1]);
      *reinterpret_cast<uint32_t*>(Ds + r1 * kLp + col) = mma::pack_bf16(s[2], s[3]);
      if (psum) head_sum_part(part, p, rg, cg, c, lane);
    }
    if constexpr (Split) {
      // dq += dS K reads its own row group's dS only: behind that group's barrier. Then one
      // block-wide barrier publishes every P and dS (for the key gradient) and the target's sums,
      // and frees the keys, whose next tile is gathered under the key-gradient products.
      row_group_sync(rg);
      if (any) times_tile2<kQCols / 8>(acc, Ds, rg, Ks, kQCols * cg, lane);  // dq += dS K
      __syncthreads();
      // part is next written after the next tile's first barrier, so warp 0 reads it now.
      if (psum) write_prob_sum<R>(psum, part, l, t, it, any, padd);
      if (it + 1 < tiles) {
        gather_slot<8 * M>(buf[0], slots + (b ^ 1) * kSlots, kv, l.T, next);
        mma::cp_async_commit();
        next = slot_of<8 * M>(row, it + 2, l.K);  // used a tile from now
      }
    } else {
      __syncthreads();  // P and dS of every key quarter (and the target's sums)
      // part is next written after the end-of-tile barrier, so warp 0 reads it before its MMAs.
      if (psum) write_prob_sum<R>(psum, part, l, t, it, any, padd);
    }
    if (any) {
      if constexpr (!Split) times_tile<kQCols / 8>(acc, Ds, rg, Ks, kQCols * cg, lane);  // dq
      const int m0 = 16 * (w & 1), n_begin = NT * (w >> 1);
      uint32_t ad[R][4], ap[R][4];
#pragma unroll
      for (int kk = 0; kk < R; ++kk) {
        mma::ldsm_a_trans(ad[kk], Ds, kLp, m0, 16 * kk, lane);
        mma::ldsm_a_trans(ap[kk], Ps, kLp, m0, 16 * kk, lane);
      }
      if constexpr (Split) {
#pragma unroll 2
        for (int n = n_begin; n < n_begin + NT; ++n)
          key_grad_tile<R>(dkv_acc, sl, m0, n, ad, ap, Qs, Os, lane);
      } else {
#pragma unroll 1
        for (int n = n_begin; n < n_begin + NT; ++n) {
          float cf[4] = {};
#pragma unroll
          for (int kk = 0; kk < R; ++kk) {
            uint32_t bq[2];
            mma::load_b_kn(bq, Qs, kLd, 16 * kk, 8 * n, lane);
            mma::mma_bf16(cf, ad[kk], bq);
            if (8 * n < kDv) {  // the value columns: + P^T dout
              uint32_t bo[2];
              mma::load_b_kn(bo, Os, kLdv, 16 * kk, 8 * n, lane);
              mma::mma_bf16(cf, ap[kk], bo);
            }
          }
          add_key_rows(dkv_acc, sl, m0, n, cf, lane);
        }
      }
    }
    // Chained: the buffers and P / dS are refilled next.
    if constexpr (!Split) __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int hr = r ? r1 : r0;
    if (hr >= valid) continue;
    bf16* out = dq + (t * l.H + h0 + hr) * kDk + kQCols * cg + 2 * c;
#pragma unroll
    for (int jd = 0; jd < kQCols / 8; ++jd)
      *reinterpret_cast<__nv_bfloat162*>(out + 8 * jd) =
          __floats2bfloat162_rn(acc[jd][2 * r], acc[jd][2 * r + 1]);
  }
}

template <int R>
constexpr size_t prob_sum_smem() {
  return sizeof(bf16) * (16 * R * kLd + 2 * kSlots * kLd) + sizeof(float) * (R * kSlots + 16 * R) +
         sizeof(int) * 2 * kSlots;
}

// The KL target: per tile, warp cg forms P for its 8 keys from the lse as the backward does and
// sums its 16 heads across the fragment's rows (shuffles over lane bits 2-4); the row groups
// meet in shared memory and one warp writes the tile's slots (adds, when the heads span blocks).
// Split: S as the Split backward forms it (scores2), so that the two targets agree bit for bit.
template <int R, bool Split>
__global__ void __launch_bounds__(R* kCols * 32)
    mqa_prob_sum_kernel(Launch l, const bf16* q, const bf16* kv, const int32_t* idx,
                        const float* lse, float* out, bool add) {
  constexpr int M = 16 * R;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);  // [M][kLd]
  bf16* const buf[2] = {Qs + M * kLd, Qs + M * kLd + kSlots * kLd};
  float* part = reinterpret_cast<float*>(buf[1] + kSlots * kLd);  // [R][kSlots]
  float* lse2 = part + R * kSlots;                                // [M] log2 units
  int* slots = reinterpret_cast<int*>(lse2 + M);                  // [2][kSlots]
  const Place pl = place_of<M, Split>(l);
  const auto [t, h0, valid, lane, w, rg, cg, c, r0, r1] = pl;
  const int32_t* row = idx + t * l.K;
  const float scale_log2 = l.scale * kLog2e;
  int32_t unused = -1;
  const int tiles = start<M, false>(l, pl, Qs, q, buf, slots, kv, row, unused);
  for (int r = threadIdx.x; r < M; r += blockDim.x)
    lse2[r] = r < valid ? lse[t * l.H + h0 + r] * kLog2e : -INFINITY;
  for (int it = 0; it < tiles; ++it) {
    const int b = next_tile(l, buf, slots, kv, row, it, tiles);  // also lse2
    const int* sl = slots + b * kSlots;
    const bool any = __any_sync(0xffffffffu, sl[lane] >= 0);  // block-uniform
    if (any) {
      float s[4] = {};
      if constexpr (Split)
        scores2<kDk>(s, Qs, kLd, rg, buf[b], 8 * cg, lane);
      else
        scores<kDk>(s, Qs, kLd, rg, buf[b], 8 * cg, lane);
      const float lr[2] = {lse2[r0], lse2[r1]};
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // as the backward forms P
        const int r = e >> 1;
        const bool ok = sl[8 * cg + 2 * c + (e & 1)] >= 0 && lr[r] != -INFINITY;
        p[e] = ok ? exp2f(s[e] * scale_log2 - lr[r]) : 0.f;
      }
      head_sum_part(part, p, rg, cg, c, lane);
    }
    __syncthreads();  // every row group's sums
    write_prob_sum<R>(out, part, l, t, it, any, add);
  }
}

// Row groups per block: enough for the heads, at most kMaxRows (larger H: more blocks per query);
// and the kernels' generation (SparseMqaParams::kernels): Split for blocks of up to 32 heads only
// (Wgmma's backward and prob sum are Split's). Past that a block fills an SM's shared memory
// either way, and the Split backward's second accumulator chains spill at 128 registers a thread
// (64 heads: 512 threads).
template <int R, typename F>
void with_split(SparseMqaKernels gen, F&& f) {
  if constexpr (R <= 2)
    if (gen != SparseMqaKernels::Chained) return f.template operator()<R, true>();
  f.template operator()<R, false>();
}

template <typename F>
void with_rows(const SparseMqaParams& p, F&& f) {
  const int64_t r = std::min<int64_t>(kMaxRows, (p.heads + 15) / 16);
  if (r == 1)
    with_split<1>(p.kernels, f);
  else if (r == 2)
    with_split<2>(p.kernels, f);
  else if (r == 3)
    with_split<3>(p.kernels, f);
  else
    with_split<4>(p.kernels, f);
}

// The kernels' shapes, bf16, and 16-byte aligned rows for cp.async.
bool takes(const SparseMqaParams& p, std::initializer_list<const Tensor*> ts) {
  if (!sparse_mqa_fits(p.heads, p.qk_dim, p.v_dim)) return false;
  for (const Tensor* t : ts)
    if (t->dtype() != DType::BF16 || reinterpret_cast<uintptr_t>(t->raw()) % 16 != 0) return false;
  return true;
}

dim3 grid_of(const SparseMqaParams& p, int rows) {
  const int64_t per_block = 16 * rows, blocks = (p.heads + per_block - 1) / per_block;
  MT_CHECK(p.tokens < INT_MAX && blocks <= 65535, ValueError, "sparse_mqa: ", p.tokens,
           " tokens or ", p.heads, " heads exceed one grid");
  return dim3(static_cast<unsigned>(p.tokens), static_cast<unsigned>(blocks));
}

// Wgmma3 runs the backward and the prob sum on wgmma (ops/cuda/cutlass/sparse_mqa_wgmma.cu) for
// up to 32 heads, one block per query; more heads keep Split's.
bool wgmma_backward(const SparseMqaParams& p) {
  MT_CHECK(p.tokens < INT_MAX, ValueError, "sparse_mqa: ", p.tokens, " tokens exceed one grid");
  return p.kernels == SparseMqaKernels::Wgmma3 && p.heads <= kMqaWgmmaHeads;
}

MqaWgmmaBwdArgs wgmma_args(const SparseMqaParams& p, const Tensor& q, const Tensor& kv,
                           const Tensor& indices, const Tensor& lse) {
  return {.q = q.raw(),
          .kv = kv.raw(),
          .idx = ptr<int32_t>(indices),
          .lse = ptr<float>(lse),
          .T = p.tokens,
          .H = p.heads,
          .K = p.kmax,
          .scale = p.scale};
}

}  // namespace

void sparse_mqa_forward(Context& ctx, const SparseMqaParams& p, const Tensor& q, const Tensor& kv,
                        const Tensor& indices, Tensor& o, Tensor& lse) {
  if (!takes(p, {&q, &kv, &o})) return sparse_mqa_composite_forward(ctx, p, q, kv, indices, o, lse);
  if (p.tokens == 0) return;
  MT_CHECK(p.tokens < INT_MAX && (p.heads + kMqaWgmmaHeads - 1) / kMqaWgmmaHeads <= 65535,
           ValueError, "sparse_mqa: ", p.tokens, " tokens or ", p.heads, " heads exceed one grid");
  // Wgmma takes blocks of 32 heads: past 32 a query's blocks would each gather every key (Split's
  // 64-head blocks gather once), so larger head counts keep Split.
  const SparseMqaKernels gen = p.kernels;
  if (gen != SparseMqaKernels::Split && gen != SparseMqaKernels::Chained &&
      p.heads <= kMqaWgmmaHeads) {
    const MqaWgmmaArgs a{.q = q.raw(),
                         .kv = kv.raw(),
                         .idx = ptr<int32_t>(indices),
                         .o = o.raw(),
                         .lse = ptr<float>(lse),
                         .T = p.tokens,
                         .H = p.heads,
                         .K = p.kmax,
                         .scale = p.scale};
    MT_CUDA_CHECK(sparse_mqa_fwd_wgmma(a, gen == SparseMqaKernels::Wgmma ? 2 : 1, stream(ctx)));
    return;
  }
  const Launch l{p.tokens, p.heads, p.kmax, p.scale};
  with_rows(p, [&]<int R, bool Split>() {
    auto kernel = mqa_fwd_kernel<R, Split>;
    const size_t sm = smem_for(kernel, fwd_smem<R>(), "sparse_mqa_forward");
    kernel<<<grid_of(p, R), R * kCols * 32, sm, stream(ctx)>>>(
        l, ptr<bf16>(q), ptr<bf16>(kv), ptr<int32_t>(indices), ptr<bf16>(o), ptr<float>(lse));
    MT_CUDA_LAUNCH_CHECK();
  });
}

void sparse_mqa_backward(Context& ctx, const SparseMqaParams& p, const Tensor& q, const Tensor& kv,
                         const Tensor& indices, const Tensor& o, const Tensor& lse,
                         const Tensor& dout, Tensor& dq, Tensor& dkv, Tensor& prob_sum) {
  if (ctx.deterministic() || !takes(p, {&q, &kv, &o, &dout, &dq, &dkv}))
    return sparse_mqa_composite_backward(ctx, p, q, kv, indices, o, lse, dout, dq, dkv, prob_sum);
  if (p.tokens == 0) return;
  const Launch l{p.tokens, p.heads, p.kmax, p.scale};
  ArenaScope scope(ctx.workspace());
  Tensor acc = ctx.workspace().alloc(dkv.shape(), DType::F32);
  cudaStream_t s = stream(ctx);
  MT_CUDA_CHECK(cudaMemsetAsync(acc.raw(), 0, acc.bytes(), s));
  float* psum = prob_sum.defined() && p.kmax > 0 ? ptr<float>(prob_sum) : nullptr;
  if (wgmma_backward(p)) {  // one block per query: one writer per slot of psum
    MqaWgmmaBwdArgs a = wgmma_args(p, q, kv, indices, lse);
    a.o = o.raw();
    a.dout = dout.raw();
    a.dq = dq.raw();
    a.dkv = ptr<float>(acc);
    a.psum = psum;
    MT_CUDA_CHECK(sparse_mqa_bwd_wgmma(a, s));
  } else {
    with_rows(p, [&]<int R, bool Split>() {
      const dim3 grid = grid_of(p, R);
      // As sparse_mqa_prob_sum: heads over several blocks add into a zeroed table.
      const bool padd = psum && grid.y > 1;
      if (padd) MT_CUDA_CHECK(cudaMemsetAsync(psum, 0, prob_sum.bytes(), s));
      auto kernel = mqa_bwd_kernel<R, Split>;
      const size_t sm = smem_for(kernel, bwd_smem<R, Split>(), "sparse_mqa_backward");
      kernel<<<grid, R * kCols * 32, sm, s>>>(l, ptr<bf16>(q), ptr<bf16>(kv), ptr<int32_t>(indices),
                                              ptr<bf16>(o), ptr<float>(lse), ptr<bf16>(dout),
                                              ptr<bf16>(dq), ptr<float>(acc), psum, padd);
      MT_CUDA_LAUNCH_CHECK();
    });
  }
  const float* pa = ptr<float>(acc);
  bf16* out = ptr<bf16>(dkv);
  for_each_index(ctx, dkv.numel(), [=] __device__(int64_t i) { out[i] = __float2bfloat16(pa[i]); });
}

void sparse_mqa_prob_sum(Context& ctx, const SparseMqaParams& p, const Tensor& q, const Tensor& kv,
                         const Tensor& indices, const Tensor& lse, Tensor& out) {
  if (!takes(p, {&q, &kv})) return sparse_mqa_composite_prob_sum(ctx, p, q, kv, indices, lse, out);
  if (p.tokens == 0 || p.kmax == 0) return;
  if (wgmma_backward(p)) {
    MqaWgmmaBwdArgs a = wgmma_args(p, q, kv, indices, lse);
    a.psum = ptr<float>(out);
    MT_CUDA_CHECK(sparse_mqa_prob_sum_wgmma(a, stream(ctx)));
    return;
  }
  const Launch l{p.tokens, p.heads, p.kmax, p.scale};
  with_rows(p, [&]<int R, bool Split>() {
    const dim3 grid = grid_of(p, R);
    // Heads over several blocks add into a zeroed table; one block per query writes its slots.
    const bool add = grid.y > 1;
    if (add) MT_CUDA_CHECK(cudaMemsetAsync(out.raw(), 0, out.bytes(), stream(ctx)));
    auto kernel = mqa_prob_sum_kernel<R, Split>;
    const size_t sm = smem_for(kernel, prob_sum_smem<R>(), "sparse_mqa_prob_sum");
    kernel<<<grid, R * kCols * 32, sm, stream(ctx)>>>(l, ptr<bf16>(q), ptr<bf16>(kv),
                                                      ptr<int32_t>(indices), ptr<float>(lse),
                                                      ptr<float>(out), add);
    MT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace mt::ops::cuda
