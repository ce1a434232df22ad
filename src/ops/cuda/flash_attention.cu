// Dense causal attention inside each document on tensor cores (bf16 in, fp32 accumulation), the
// flash-attention algorithm: scores, probabilities and their gradients live in registers tile by
// tile and never reach memory; only o, lse and the gradients are written.
//
// Forward: one block of four warps per (64 queries, head); each warp owns 16 query rows, keeps
// its q fragments in registers and walks the key tiles of its documents with an online softmax
// (running max and sum in log2 units). Backward, without atomics and so bit-repeatable: Delta =
// o . dout per row; dq per (64 queries, head), walking key tiles; dk and dv per (64 keys, head),
// walking the query tiles that can see them (32 at a time: the accumulators of dk and dv fill the
// registers). Probabilities are recomputed from the saved lse.
//
// Head dims are padded with zeros in shared memory to the next instantiated width (64/64,
// 128/128, 192/128), so any qk_dim <= 192 and v_dim <= 128 run here; rows past the end and keys
// outside a query's document are masked. Tiles come from global memory through cp.async: double
// buffered in the forward and dk/dv kernels, one stage in dq (whose q and dout rows leave room
// for two blocks per SM only then); no TMA or wgmma yet (bench/RESULTS.md: what it reaches).
#include <climits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/flash_attention.h"
#include "ops/cuda/mma.cuh"

namespace mt::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kBlockM = 64;  // query rows per forward / dq block
constexpr int kBlockN = 64;  // keys per tile; key rows per dk/dv block
constexpr int kBlockQ = 32;  // query rows per tile of the dk/dv block
constexpr int kPad = 8;      // bf16 elements of padding per shared row: conflict-free fragments
constexpr int kThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Rows row0 .. row0+R-1 of head h of a [T, H, D] tensor into tile[R][DP + kPad], zero past D
// and past T. `vec`: D is a multiple of 8 and the base 16-byte aligned, so 8 elements move at once
// through cp.async (in flight until the caller's cp_async_wait; the zero fill is immediate).
template <int R, int DP>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* src, int64_t T, int64_t H,
                                          int64_t h, int D, int64_t row0, bool vec) {
  constexpr int ld = DP + kPad, chunks = DP / 8;
  for (int i = threadIdx.x; i < R * chunks; i += kThreads) {
    const int r = i / chunks, c = (i % chunks) * 8;
    const int64_t t = row0 + r;
    bf16* d = tile + r * ld + c;
    const bf16* s = src + (t * H + h) * D + c;
    if (vec && t < T && c + 8 <= D) {
      mma::cp_async16(d, s);
    } else {
      for (int e = 0; e < 8; ++e) d[e] = (t < T && c + e < D) ? s[e] : __float2bfloat16(0.f);
    }
  }
}

// Per-row data of a query tile: its document's first token (INT_MAX past T: every key masked),
// and optionally lse (log2 units) and Delta.
template <int R>
__device__ __forceinline__ void load_rows(int* start, float* lse2, float* dl, int64_t T, int64_t H,
                                          int64_t h, int64_t row0, const int32_t* cu, int64_t nseq,
                                          const float* lse, const float* delta) {
  for (int r = threadIdx.x; r < R; r += kThreads) {
    const int64_t t = row0 + r;
    const bool in = t < T;
    start[r] = in ? cu[doc_index(cu, nseq, t)] : INT_MAX;
    if (lse2) lse2[r] = in ? lse[t * H + h] * kLog2e : 0.f;
    if (dl) dl[r] = in ? delta[t * H + h] : 0.f;
  }
}

// Fragment row r (0: the lane's row g, 1: row g + 8) of a warp's N accumulator tiles of 8
// columns, times `mul`, as bf16 into `out` (columns below d).
template <int N>
__device__ __forceinline__ void store_row(bf16* out, int d, const float (&acc)[N][4], int r,
                                          float mul, int c) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int col = 8 * j + 2 * c;
    if (col < d) out[col] = __float2bfloat16(acc[j][2 * r] * mul);
    if (col + 1 < d) out[col + 1] = __float2bfloat16(acc[j][2 * r + 1] * mul);
  }
}

// Whether a tile of kBlockN keys from kb needs no mask for a warp's 16 rows from `row0` (in
// their order, so the first row is the earliest): every key at or before the first row and at or
// after the last row's document start (the latest start: INT_MAX past T). Warp-uniform, so the
// masked and the plain loops do not diverge; most tiles of a long document take the plain one.
__device__ __forceinline__ bool inside(int64_t kb, int64_t row0, int last_start) {
  return kb + kBlockN - 1 <= row0 && kb >= last_start;
}

template <int DK, int DV>
__global__ void __launch_bounds__(kThreads)
    flash_fwd_kernel(int64_t T, int64_t H, int dk, int dv, float scale_log2, const int32_t* cu,
                     int64_t nseq, bool vec, const bf16* q, const bf16* k, const bf16* v, bf16* o,
                     float* lse) {
  constexpr int LK = DK + kPad, LV = DV + kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Kb[2] = {Qs + kBlockM * LK, Qs + kBlockM * LK + kBlockN * (LK + LV)};
  bf16* Vb[2] = {Kb[0] + kBlockN * LK, Kb[1] + kBlockN * LK};
  int* start = reinterpret_cast<int*>(Vb[1] + kBlockN * LV);
  // The longest tiles (latest queries) first, so that short ones fill the tail.
  const int64_t h = blockIdx.y, q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kBlockM;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  load_rows<kBlockM>(start, nullptr, nullptr, T, H, h, q0, cu, nseq, nullptr, nullptr);
  load_tile<kBlockM, DK>(Qs, q, T, H, h, dk, q0, vec);
  mma::cp_async_commit();
  __syncthreads();  // start[]
  const int64_t last = (q0 + kBlockM < T ? q0 + kBlockM : T) - 1;
  const int64_t kb0 = start[0] / kBlockN * kBlockN;
  const int tiles = static_cast<int>((last - kb0) / kBlockN + 1);
  // Key/value tiles double-buffered: tile it+1 is in flight while tile it is computed.
  load_tile<kBlockN, DK>(Kb[0], k, T, H, h, dk, kb0, vec);
  load_tile<kBlockN, DV>(Vb[0], v, T, H, h, dv, kb0, vec);
  mma::cp_async_commit();
  mma::cp_async_wait<1>();  // q
  __syncthreads();

  uint32_t qa[DK / 16][4];
#pragma unroll
  for (int kk = 0; kk < DK / 16; ++kk) mma::ldsm_a(qa[kk], Qs, LK, 16 * w, 16 * kk, lane);
  float acc[DV / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int64_t t0 = q0 + 16 * w + g, t1 = t0 + 8;
  const int s0 = start[16 * w + g], s1 = start[16 * w + g + 8];
  const int warp_start = start[16 * w];      // the smallest of the warp's rows
  const int warp_last = start[16 * w + 15];  // the largest (INT_MAX past T)
  for (int it = 0; it < tiles; ++it) {
    const int64_t kb = kb0 + static_cast<int64_t>(it) * kBlockN;
    if (it + 1 < tiles) {
      load_tile<kBlockN, DK>(Kb[(it + 1) & 1], k, T, H, h, dk, kb + kBlockN, vec);
      load_tile<kBlockN, DV>(Vb[(it + 1) & 1], v, T, H, h, dv, kb + kBlockN, vec);
    }
    mma::cp_async_commit();
    mma::cp_async_wait<1>();
    __syncthreads();  // tile it has landed for every thread
    const bf16* Ks = Kb[it & 1];
    const bf16* Vs = Vb[it & 1];
    // Warp-uniform: a tile wholly after the warp's rows, or before their documents.
    if (kb <= q0 + 16 * w + 15 && kb + kBlockN > warp_start) {
      float s[kBlockN / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk)
#pragma unroll
        for (int j = 0; j < kBlockN / 8; j += 2) {
          uint32_t b0[2], b1[2];
          mma::ldsm_b_nk2(b0, b1, Ks, LK, 8 * j, 16 * kk, lane);
          mma::mma_bf16(s[j], qa[kk], b0);
          mma::mma_bf16(s[j + 1], qa[kk], b1);
        }
      float mx0 = -INFINITY, mx1 = -INFINITY;
      if (inside(kb, q0 + 16 * w, warp_last)) {
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[j][e] *= scale_log2;
            if (e < 2)
              mx0 = fmaxf(mx0, s[j][e]);
            else
              mx1 = fmaxf(mx1, s[j][e]);
          }
      } else {
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int64_t key = kb + 8 * j + 2 * c + e;
            s[j][e] = (key <= t0 && key >= s0) ? s[j][e] * scale_log2 : -INFINITY;
            s[j][2 + e] = (key <= t1 && key >= s1) ? s[j][2 + e] * scale_log2 : -INFINITY;
            mx0 = fmaxf(mx0, s[j][e]);
            mx1 = fmaxf(mx1, s[j][2 + e]);
          }
      }
      const float mn0 = fmaxf(m[0], mma::quad_max(mx0)), mn1 = fmaxf(m[1], mma::quad_max(mx1));
      // A row with nothing unmasked yet keeps max -inf; 0 keeps its exponentials at 0, not NaN.
      const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
      const float al0 = exp2f(m[0] - mu0), al1 = exp2f(m[1] - mu1);
      m[0] = mn0;
      m[1] = mn1;
      float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
        s[j][0] = exp2f(s[j][0] - mu0);
        s[j][1] = exp2f(s[j][1] - mu0);
        s[j][2] = exp2f(s[j][2] - mu1);
        s[j][3] = exp2f(s[j][3] - mu1);
        rs0 += s[j][0] + s[j][1];
        rs1 += s[j][2] + s[j][3];
      }
      l[0] = l[0] * al0 + rs0;
      l[1] = l[1] * al1 + rs1;
#pragma unroll
      for (int jv = 0; jv < DV / 8; ++jv) {
        acc[jv][0] *= al0;
        acc[jv][1] *= al0;
        acc[jv][2] *= al1;
        acc[jv][3] *= al1;
      }
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t a[4];
        mma::c_to_a(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int jv = 0; jv < DV / 8; ++jv) {
          uint32_t b[2];
          mma::load_b_kn(b, Vs, LV, 16 * kk, 8 * jv, lane);
          mma::mma_bf16(acc[jv], a, b);
        }
      }
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }

  // Every row in range saw its own key, so its sum is positive.
  const float L[2] = {mma::quad_sum(l[0]), mma::quad_sum(l[1])};
  const int64_t rows[2] = {t0, t1};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= T) continue;
    store_row(o + (rows[r] * H + h) * dv, dv, acc, r, 1.f / L[r], c);
    if (c == 0) lse[rows[r] * H + h] = (m[r] + log2f(L[r])) * kLn2;
  }
}

// Delta[t, h] = o . dout over the value dims, one warp per row.
__global__ void flash_delta_kernel(int64_t rows, int dv, const bf16* o, const bf16* dout,
                                   float* delta) {
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (r >= rows) return;
  float s = 0.f;
  for (int d = threadIdx.x & 31; d < dv; d += 32)
    s += __bfloat162float(o[r * dv + d]) * __bfloat162float(dout[r * dv + d]);
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) delta[r] = s;
}

template <int DK, int DV>
__global__ void __launch_bounds__(kThreads)
    flash_dq_kernel(int64_t T, int64_t H, int dk, int dv, float scale_log2, float scale,
                    const int32_t* cu, int64_t nseq, bool vec, const bf16* q, const bf16* k,
                    const bf16* v, const bf16* dout, const float* lse, const float* delta,
                    bf16* dq) {
  constexpr int LK = DK + kPad, LV = DV + kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  // One stage of key tiles, not two: the q and dout rows already take 43 KB at 192/128, and a
  // second block per SM (87 KB each) hides the loads better than double buffering in one.
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Os = Qs + kBlockM * LK;  // dout rows
  bf16* Ks = Os + kBlockM * LV;
  bf16* Vs = Ks + kBlockN * LK;
  int* start = reinterpret_cast<int*>(Vs + kBlockN * LV);
  float* lse2 = reinterpret_cast<float*>(start + kBlockM);
  float* dl = lse2 + kBlockM;
  const int64_t h = blockIdx.y, q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kBlockM;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  load_rows<kBlockM>(start, lse2, dl, T, H, h, q0, cu, nseq, lse, delta);
  load_tile<kBlockM, DK>(Qs, q, T, H, h, dk, q0, vec);
  load_tile<kBlockM, DV>(Os, dout, T, H, h, dv, q0, vec);
  mma::cp_async_commit();
  __syncthreads();  // start[]
  const int64_t last = (q0 + kBlockM < T ? q0 + kBlockM : T) - 1;
  const int64_t kb0 = start[0] / kBlockN * kBlockN;
  const int tiles = static_cast<int>((last - kb0) / kBlockN + 1);

  float acc[DK / 8][4] = {};
  const int r0 = 16 * w + g, r1 = r0 + 8;
  const int64_t t0 = q0 + r0, t1 = q0 + r1;
  const int warp_start = start[16 * w], warp_last = start[16 * w + 15];
  for (int it = 0; it < tiles; ++it) {
    const int64_t kb = kb0 + static_cast<int64_t>(it) * kBlockN;
    load_tile<kBlockN, DK>(Ks, k, T, H, h, dk, kb, vec);
    load_tile<kBlockN, DV>(Vs, v, T, H, h, dv, kb, vec);
    mma::cp_async_commit();
    mma::cp_async_wait<0>();
    __syncthreads();
    if (kb <= q0 + 16 * w + 15 && kb + kBlockN > warp_start) {
      float s[kBlockN / 8][4] = {}, dp[kBlockN / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk) {
        uint32_t a[4];
        mma::ldsm_a(a, Qs, LK, 16 * w, 16 * kk, lane);
#pragma unroll
        for (int j = 0; j < kBlockN / 8; j += 2) {
          uint32_t b0[2], b1[2];
          mma::ldsm_b_nk2(b0, b1, Ks, LK, 8 * j, 16 * kk, lane);
          mma::mma_bf16(s[j], a, b0);
          mma::mma_bf16(s[j + 1], a, b1);
        }
      }
#pragma unroll
      for (int kk = 0; kk < DV / 16; ++kk) {
        uint32_t a[4];
        mma::ldsm_a(a, Os, LV, 16 * w, 16 * kk, lane);
#pragma unroll
        for (int j = 0; j < kBlockN / 8; j += 2) {
          uint32_t b0[2], b1[2];
          mma::ldsm_b_nk2(b0, b1, Vs, LV, 8 * j, 16 * kk, lane);
          mma::mma_bf16(dp[j], a, b0);
          mma::mma_bf16(dp[j + 1], a, b1);
        }
      }
      // dS = P (dP - Delta), P = exp2(s * scale log2e - lse log2e); the softmax scale comes last.
      const float l0 = lse2[r0], l1 = lse2[r1], d0 = dl[r0], d1 = dl[r1];
      if (inside(kb, q0 + 16 * w, warp_last)) {
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            s[j][e] = exp2f(s[j][e] * scale_log2 - l0) * (dp[j][e] - d0);
            s[j][2 + e] = exp2f(s[j][2 + e] * scale_log2 - l1) * (dp[j][2 + e] - d1);
          }
      } else {
        const int st0 = start[r0], st1 = start[r1];
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int64_t key = kb + 8 * j + 2 * c + e;
            const float p0 = (key <= t0 && key >= st0) ? exp2f(s[j][e] * scale_log2 - l0) : 0.f;
            const float p1 = (key <= t1 && key >= st1) ? exp2f(s[j][2 + e] * scale_log2 - l1) : 0.f;
            s[j][e] = p0 * (dp[j][e] - d0);
            s[j][2 + e] = p1 * (dp[j][2 + e] - d1);
          }
      }
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t a[4];
        mma::c_to_a(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int jd = 0; jd < DK / 8; ++jd) {
          uint32_t b[2];
          mma::load_b_kn(b, Ks, LK, 16 * kk, 8 * jd, lane);
          mma::mma_bf16(acc[jd], a, b);
        }
      }
    }
    __syncthreads();
  }

  const int64_t rows[2] = {t0, t1};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= T) continue;
    store_row(dq + (rows[r] * H + h) * dk, dk, acc, r, scale, c);
  }
}

template <int DK, int DV>
__global__ void __launch_bounds__(kThreads)
    flash_dkv_kernel(int64_t T, int64_t H, int dk, int dv, float scale_log2, float scale,
                     const int32_t* cu, int64_t nseq, bool vec, const bf16* q, const bf16* k,
                     const bf16* v, const bf16* dout, const float* lse, const float* delta,
                     bf16* dkey, bf16* dval) {
  constexpr int LK = DK + kPad, LV = DV + kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + kBlockN * LK;
  // Query tiles double-buffered: tile it+1 (rows and their lse, Delta, document starts) is in
  // flight while tile it is computed.
  bf16* Qb[2] = {Vs + kBlockN * LV, Vs + kBlockN * LV + kBlockQ * (LK + LV)};
  bf16* Ob[2] = {Qb[0] + kBlockQ * LK, Qb[1] + kBlockQ * LK};    // dout rows
  int* startb = reinterpret_cast<int*>(Ob[1] + kBlockQ * LV);    // [2][kBlockQ]
  float* lseb = reinterpret_cast<float*>(startb + 2 * kBlockQ);  // [2][kBlockQ]
  float* dlb = lseb + 2 * kBlockQ;                               // [2][kBlockQ]
  __shared__ int64_t query_end;
  const int64_t h = blockIdx.y, kb = static_cast<int64_t>(blockIdx.x) * kBlockN;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  load_tile<kBlockN, DK>(Ks, k, T, H, h, dk, kb, vec);
  load_tile<kBlockN, DV>(Vs, v, T, H, h, dv, kb, vec);
  if (threadIdx.x == 0) {
    // Queries that can see a key of this tile: up to the end of the last key's document.
    const int64_t key_last = kb + kBlockN - 1 < T ? kb + kBlockN - 1 : T - 1;
    query_end = cu[doc_index(cu, nseq, key_last) + 1];
  }
  __syncthreads();
  const int tiles = static_cast<int>((query_end - kb + kBlockQ - 1) / kBlockQ);
  auto load_queries = [&](int it) {
    const int b = it & 1;
    const int64_t qb = kb + static_cast<int64_t>(it) * kBlockQ;
    load_rows<kBlockQ>(startb + b * kBlockQ, lseb + b * kBlockQ, dlb + b * kBlockQ, T, H, h, qb, cu,
                       nseq, lse, delta);
    load_tile<kBlockQ, DK>(Qb[b], q, T, H, h, dk, qb, vec);
    load_tile<kBlockQ, DV>(Ob[b], dout, T, H, h, dv, qb, vec);
  };
  if (tiles > 0) load_queries(0);
  mma::cp_async_commit();

  float ak[DK / 8][4] = {}, av[DV / 8][4] = {};
  const int64_t key0 = kb + 16 * w + g, key1 = key0 + 8;
  for (int it = 0; it < tiles; ++it) {
    const int64_t qb = kb + static_cast<int64_t>(it) * kBlockQ;
    if (it + 1 < tiles) load_queries(it + 1);
    mma::cp_async_commit();
    mma::cp_async_wait<1>();
    __syncthreads();
    const bf16* Qs = Qb[it & 1];
    const bf16* Os = Ob[it & 1];
    const int* start = startb + (it & 1) * kBlockQ;
    const float* lse2 = lseb + (it & 1) * kBlockQ;
    const float* dl = dlb + (it & 1) * kBlockQ;
    // Warp-uniform: every key of the warp after every query of the tile, or past T.
    if (kb + 16 * w <= qb + kBlockQ - 1 && kb + 16 * w < T) {
      // Transposed scores: rows are the warp's keys, columns the tile's queries.
      float s[kBlockQ / 8][4] = {}, dp[kBlockQ / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk) {
        uint32_t a[4];
        mma::ldsm_a(a, Ks, LK, 16 * w, 16 * kk, lane);
#pragma unroll
        for (int j = 0; j < kBlockQ / 8; j += 2) {
          uint32_t b0[2], b1[2];
          mma::ldsm_b_nk2(b0, b1, Qs, LK, 8 * j, 16 * kk, lane);
          mma::mma_bf16(s[j], a, b0);
          mma::mma_bf16(s[j + 1], a, b1);
        }
      }
      // Unmasked when every key of the warp is at or before the tile's first query and at or after
      // its last query's document start (INT_MAX past T).
      if (kb + 16 * w + 15 <= qb && kb + 16 * w >= start[kBlockQ - 1]) {
#pragma unroll
        for (int j = 0; j < kBlockQ / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[j][e] = exp2f(s[j][e] * scale_log2 - lse2[8 * j + 2 * c + (e & 1)]);
      } else {
#pragma unroll
        for (int j = 0; j < kBlockQ / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = 8 * j + 2 * c + (e & 1);
            const int64_t t = qb + col, key = e < 2 ? key0 : key1;
            s[j][e] =
                (key <= t && key >= start[col]) ? exp2f(s[j][e] * scale_log2 - lse2[col]) : 0.f;
          }
      }
      // dv += P^T dout.
#pragma unroll
      for (int kk = 0; kk < kBlockQ / 16; ++kk) {
        uint32_t a[4];
        mma::c_to_a(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int jv = 0; jv < DV / 8; ++jv) {
          uint32_t b[2];
          mma::load_b_kn(b, Os, LV, 16 * kk, 8 * jv, lane);
          mma::mma_bf16(av[jv], a, b);
        }
      }
      // dP^T = v dout^T, then dS^T = P^T (dP^T - Delta).
#pragma unroll
      for (int kk = 0; kk < DV / 16; ++kk) {
        uint32_t a[4];
        mma::ldsm_a(a, Vs, LV, 16 * w, 16 * kk, lane);
#pragma unroll
        for (int j = 0; j < kBlockQ / 8; j += 2) {
          uint32_t b0[2], b1[2];
          mma::ldsm_b_nk2(b0, b1, Os, LV, 8 * j, 16 * kk, lane);
          mma::mma_bf16(dp[j], a, b0);
          mma::mma_bf16(dp[j + 1], a, b1);
        }
      }
#pragma unroll
      for (int j = 0; j < kBlockQ / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] *= dp[j][e] - dl[8 * j + 2 * c + (e & 1)];
          // dk += dS^T q.
#pragma unroll
      for (int kk = 0; kk < kBlockQ / 16; ++kk) {
        uint32_t a[4];
        mma::c_to_a(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int jd = 0; jd < DK / 8; ++jd) {
          uint32_t b[2];
          mma::load_b_kn(b, Qs, LK, 16 * kk, 8 * jd, lane);
          mma::mma_bf16(ak[jd], a, b);
        }
      }
    }
    __syncthreads();
  }

  const int64_t keys[2] = {key0, key1};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (keys[r] >= T) continue;
    store_row(dkey + (keys[r] * H + h) * dk, dk, ak, r, scale, c);
    store_row(dval + (keys[r] * H + h) * dv, dv, av, r, 1.f, c);
  }
}

struct Launch {
  int64_t T, H;
  int dk, dv;
  float scale;
  const int32_t* cu;
  int64_t nseq;
  bool vec;
  unsigned tiles(int rows) const { return static_cast<unsigned>((T + rows - 1) / rows); }
};

Launch launch_of(const AttentionParams& p, const Tensor& cu,
                 std::initializer_list<const Tensor*> ts) {
  bool vec = p.qk_dim % 8 == 0 && p.v_dim % 8 == 0;
  for (const Tensor* t : ts) vec = vec && reinterpret_cast<uintptr_t>(t->raw()) % 16 == 0;
  MT_CHECK(p.tokens < INT_MAX, ValueError, "flash attention: ", p.tokens,
           " tokens exceed 32-bit positions");
  MT_CHECK((p.tokens + kBlockM - 1) / kBlockM <= 0x7fffffff && p.heads <= 65535, ValueError,
           "flash attention: ", p.heads, " heads exceed one grid");
  return {p.tokens,
          p.heads,
          static_cast<int>(p.qk_dim),
          static_cast<int>(p.v_dim),
          p.scale,
          ptr<int32_t>(cu),
          cu.numel() - 1,
          vec};
}

template <int DK, int DV>
void forward_as(Context& ctx, const Launch& l, const Tensor& q, const Tensor& k, const Tensor& v,
                Tensor& o, Tensor& lse) {
  constexpr size_t LK = DK + kPad, LV = DV + kPad;
  auto kernel = flash_fwd_kernel<DK, DV>;
  const size_t sm = smem_for(
      kernel, sizeof(bf16) * (kBlockM * LK + 2 * kBlockN * (LK + LV)) + sizeof(int) * kBlockM,
      "flash_attention_forward");
  kernel<<<dim3(l.tiles(kBlockM), static_cast<unsigned>(l.H)), kThreads, sm, stream(ctx)>>>(
      l.T, l.H, l.dk, l.dv, l.scale * kLog2e, l.cu, l.nseq, l.vec, ptr<bf16>(q), ptr<bf16>(k),
      ptr<bf16>(v), ptr<bf16>(o), ptr<float>(lse));
  MT_CUDA_LAUNCH_CHECK();
}

template <int DK, int DV>
void backward_as(Context& ctx, const Launch& l, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& lse, const Tensor& dout, const float* delta, Tensor& dq, Tensor& dk,
                 Tensor& dv) {
  constexpr size_t LK = DK + kPad, LV = DV + kPad;
  const char* op = "flash_attention_backward";
  const size_t rows_bytes = sizeof(int) + 2 * sizeof(float);
  auto k1 = flash_dq_kernel<DK, DV>;
  const size_t sm1 = smem_for(
      k1, sizeof(bf16) * (kBlockM * (LK + LV) + kBlockN * (LK + LV)) + rows_bytes * kBlockM, op);
  k1<<<dim3(l.tiles(kBlockM), static_cast<unsigned>(l.H)), kThreads, sm1, stream(ctx)>>>(
      l.T, l.H, l.dk, l.dv, l.scale * kLog2e, l.scale, l.cu, l.nseq, l.vec, ptr<bf16>(q),
      ptr<bf16>(k), ptr<bf16>(v), ptr<bf16>(dout), ptr<float>(lse), delta, ptr<bf16>(dq));
  MT_CUDA_LAUNCH_CHECK();
  auto k2 = flash_dkv_kernel<DK, DV>;
  const size_t sm2 = smem_for(
      k2, sizeof(bf16) * (kBlockN * (LK + LV) + 2 * kBlockQ * (LK + LV)) + 2 * rows_bytes * kBlockQ,
      op);
  k2<<<dim3(l.tiles(kBlockN), static_cast<unsigned>(l.H)), kThreads, sm2, stream(ctx)>>>(
      l.T, l.H, l.dk, l.dv, l.scale * kLog2e, l.scale, l.cu, l.nseq, l.vec, ptr<bf16>(q),
      ptr<bf16>(k), ptr<bf16>(v), ptr<bf16>(dout), ptr<float>(lse), delta, ptr<bf16>(dk),
      ptr<bf16>(dv));
  MT_CUDA_LAUNCH_CHECK();
}

// The narrowest instantiated widths that hold the head dims (flash_attention_fits).
template <typename F>
void with_widths(const AttentionParams& p, F&& f) {
  if (p.qk_dim <= 64 && p.v_dim <= 64)
    f.template operator()<64, 64>();
  else if (p.qk_dim <= 128 && p.v_dim <= 128)
    f.template operator()<128, 128>();
  else
    f.template operator()<192, 128>();
}

}  // namespace

void flash_attention_forward(Context& ctx, const AttentionParams& p, const Tensor& cu_seqlens,
                             const Tensor& q, const Tensor& k, const Tensor& v, Tensor& o,
                             Tensor& lse) {
  if (p.tokens == 0) return;
  const Launch l = launch_of(p, cu_seqlens, {&q, &k, &v, &o});
  with_widths(p, [&]<int DK, int DV>() { forward_as<DK, DV>(ctx, l, q, k, v, o, lse); });
}

void flash_attention_backward(Context& ctx, const AttentionParams& p, const Tensor& cu_seqlens,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                              const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                              Tensor& dv) {
  if (p.tokens == 0) return;
  const Launch l = launch_of(p, cu_seqlens, {&q, &k, &v, &dout, &dq, &dk, &dv});
  ArenaScope scope(ctx.workspace());
  Tensor delta = ctx.workspace().alloc({p.tokens, p.heads});
  const int64_t rows = p.tokens * p.heads;
  flash_delta_kernel<<<blocks_for(rows * 32, 256, 0x7fffffff), 256, 0, stream(ctx)>>>(
      rows, l.dv, ptr<bf16>(o), ptr<bf16>(dout), ptr<float>(delta));
  MT_CUDA_LAUNCH_CHECK();
  with_widths(p, [&]<int DK, int DV>() {
    backward_as<DK, DV>(ctx, l, q, k, v, lse, dout, ptr<float>(delta), dq, dk, dv);
  });
}

}  // namespace mt::ops::cuda
