// The skinny grouped products of expert LoRA (lora_grouped.h). Every kernel runs 128 threads (4
// warps) on bf16 tiles in shared memory fed by 16-byte loads, zero-filled past the group's rows,
// the widths and the rank, so the MMAs need no bounds of their own; results are stored only
// where they exist. The rank is padded to a multiple of 16 in shared memory (zeros), which makes
// it one or more whole mma k-steps (up) or n-tile pairs (down, dW).
//
// Blocks find their tile of rows from a table of the non-empty groups passed by value
// (__grid_constant__, read in place: a dynamically indexed by-value parameter would otherwise be
// copied to local memory), by binary search over the groups' first tiles: no host-to-device copy.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cutlass/grouped_gemm_sm90.h"
#include "ops/cuda/lora_grouped.h"
#include "ops/cuda/mma.cuh"

namespace mt::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 128;
constexpr int kRowTile = 64;   // rows of a down / up block: 4 warps x 16
constexpr int kKStage = 64;    // k per shared-memory stage of the down product
constexpr int kColTile = 128;  // output columns of an up block, wide columns of a dW block
constexpr int kDwRows = 32;    // rows per shared-memory stage of the dW product
constexpr int kDwChunk = 512;  // rows of a group per dW block outside deterministic mode
constexpr int kLd = kSkinnyMaxRank + 8;  // a 64-wide tile's row pitch: 144 bytes, so the 8 rows
                                         // an ldmatrix reads fall in distinct banks
constexpr int kLdWide = kColTile + 8;    // a 128-wide tile's pitch (272 bytes), likewise

// The non-empty groups and, for a tile height, the first tile of each: tile0[i] .. tile0[i+1]-1
// are group[i]'s tiles (tile0[count] = the total).
struct Tiles {
  int32_t group[kMaxGroups], row0[kMaxGroups], rows[kMaxGroups];
  int32_t tile0[kMaxGroups + 1];
  int32_t count = 0, tile_rows = 0;
};

struct Tile {
  int group, r0, rows;  // the group, the tile's first row, its row count (1 .. tile_rows)
};

__device__ Tile find_tile(const Tiles& t, int b) {
  int lo = 0, hi = t.count - 1;  // the last entry whose first tile is <= b
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (t.tile0[mid] <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int r0 = t.row0[lo] + (b - t.tile0[lo]) * t.tile_rows;
  return {t.group[lo], r0, min(t.tile_rows, t.row0[lo] + t.rows[lo] - r0)};
}

// The tile of a block that takes the tiles last first: the down and out_grads kernels read an
// activation the kernel before them wrote in ascending row order (h by SwiGLU, dgate_up by its
// backward, X and dY by the gather and the combine), so its last rows may still sit in L2.
__device__ __forceinline__ Tile last_first_tile(const Tiles& t) {
  return find_tile(t, static_cast<int>(gridDim.x - 1 - blockIdx.x));
}

__device__ __forceinline__ uint4 ld16(const bf16* p) {
  return *reinterpret_cast<const uint4*>(p);
}

// A fragment (m0 .. m0+15, k0 .. k0+15) from a k-major tile[k][m] (the weight gradient's rows
// are its k): ldmatrix .x4 .trans, matrix i = lane / 8 takes rows k0 + (i / 2) 8 .. + 7 at
// column m0 + (i % 2) 8, so that a0..a3 come out in mma.cuh's order (see ldsm_a).
__device__ __forceinline__ void ldsm_a_km(uint32_t a[4], const bf16* tile, int ld, int m0, int k0,
                                          int lane) {
  const int i = lane >> 3;
  const bf16* p = tile + (k0 + (lane & 7) + ((i >> 1) << 3)) * ld + m0 + ((i & 1) << 3);
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(addr));
}

// c0 += a B(k0 .. k0+15, n0 .. n0+7) and c1 += a B(.., n0+8 .. n0+15), B from a tile stored
// n-major (tile[n][k]) when `n_major`, else k-major (tile[k][n]); `ld` is the tile's pitch.
__device__ __forceinline__ void mma_pair(float c0[4], float c1[4], const uint32_t a[4],
                                         const bf16* tile, bool n_major, int ld, int n0, int k0,
                                         int lane) {
  uint32_t b0[2], b1[2];
  if (n_major) {
    mma::ldsm_b_nk2(b0, b1, tile, ld, n0, k0, lane);
  } else {
    mma::load_b_kn(b0, tile, ld, k0, n0, lane);
    mma::load_b_kn(b1, tile, ld, k0, n0 + 8, lane);
  }
  mma::mma_bf16(c0, a, b0);
  mma::mma_bf16(c1, a, b1);
}

// Two adjacent columns of a bf16 row, one 4-byte store (col even, the row 4-byte aligned).
__device__ __forceinline__ void st_pair(bf16* p, float lo, float hi) {
  *reinterpret_cast<uint32_t*>(p) = mma::pack_bf16(lo, hi);
}

// The streaming kernels (down, dW, out_grads) each read a large operand once, so HBM's speed is
// theirs only with enough bytes in flight (about 30 KB per SM at 4 TB/s and a microsecond of
// latency): they fill a ring of kStages shared-memory stages through cp.async, kStages - 1 stages
// ahead of the MMAs. Loading a stage synchronously and then computing on it left an SM a block's
// single stage in flight per resident block half of the time (session 11, shape A: out_grads 1.9
// TB/s at 4 blocks per SM, dW 2.4 at 4, down 3.3 at 8). Accumulators are sized by the padded rank
// (kP = its n-tile pairs, a template argument): sized for rank 64 they held 128 registers.
// kStages is the default depth; session 14's kernels run 3 where that fits more blocks per SM
// (kDownStages, kSbStages).
constexpr int kStages = 4;

// 16 bytes global -> shared through cp.async, or 16 zeros when !valid (src-size 0: nothing is
// read; `src` is a mapped address all the same). Zeros past the rows, widths and rank keep the
// MMAs free of bounds and of the garbage a stale stage would add to a reduction over rows.
__device__ __forceinline__ void cp16_or_zero(bf16* dst, const bf16* src, bool valid) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src),
               "r"(valid ? 16 : 0));
}

// A [rows][r16] rank tile's pitch: 16-byte rows whose 8 rows of an ldmatrix fall in distinct
// banks (48, 80, 112 or 144 bytes).
__host__ __device__ constexpr int rank_ld(int r16) {
  return r16 + 8;
}

// The template's n-tile pairs for rank r: 1, 2 or 4 (a padded rank of 48 runs kP = 4 with three
// pairs used).
int rank_pairs(int64_t r) {
  const int64_t pairs = (r + 15) / 16;
  return pairs <= 1 ? 1 : pairs == 2 ? 2 : 4;
}

// Calls f(std::integral_constant<int, kP>) for the pairs of rank r.
template <typename F>
void with_pairs(int64_t r, const F& f) {
  switch (rank_pairs(r)) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    default:
      return f(std::integral_constant<int, 4>{});
  }
}

// Runs the ring of `Stages` slots: load(s) issues stage s's copies into slot s % Stages,
// compute(s, slot) consumes it. One commit group per stage (empty past the last), so
// wait_group<Stages - 2> means stage s
// has landed; the barrier after it also tells every thread that the slot refilled next (the one
// consumed last iteration) is free. Ends with every copy landed and the slots free again.
template <int Stages = kStages, typename Load, typename Compute>
__device__ __forceinline__ void run_ring(int stages, const Load& load, const Compute& compute) {
#pragma unroll
  for (int s = 0; s < Stages - 1; ++s) {
    if (s < stages) load(s);
    mma::cp_async_commit();
  }
  for (int s = 0; s < stages; ++s) {
    mma::cp_async_wait<Stages - 2>();
    __syncthreads();
    if (s + Stages - 1 < stages) load(s + Stages - 1);
    mma::cp_async_commit();
    compute(s, s % Stages);
  }
  mma::cp_async_wait<0>();
  __syncthreads();
}

// C [rows, r] = alpha X W^T (w_rk: W_g [r, K]) or alpha X W (W_g [K, r]), one 64-row tile per
// block, K in stages of 64 through the ring (dynamic shared memory: DownLayout).
struct DownArgs {
  const bf16* x;
  int64_t ldx, K;
  const bf16* w;
  bool w_rk;
  int r;
  bf16* c;
  int64_t ldc;
  float alpha;
};

// The down and dW kernels' ring: 3 stages (the down kernel's 12 KB at rank 16 fit 6 blocks per
// SM, where 4 stages fit 4; dW's 10 KB 7, where 5): about the same bytes in flight from more warps
// (session 14: the skinny kernels ran faster the more warps an SM held, out_grads at 8 per SM 1.8
// TB/s, down at 16 2.8, dW at 20 3.1; session 11's down kernel, 8 blocks without a ring, 3.3).
constexpr int kDownStages = 3;

template <int kP>
struct DownLayout {
  static constexpr int kX = kRowTile * kLd;  // X [64 rows][64 k]
  // W's stage: [r16 rows j][64 k] at kLd (w_rk) or [64 k][r16 columns j] at rank_ld.
  static constexpr int kW = std::max(16 * kP * kLd, kKStage* rank_ld(16 * kP));
  static constexpr int kSlot = kX + kW;
  static constexpr int kBytes = kDownStages * kSlot * static_cast<int>(sizeof(bf16));
};

template <int kP>
__global__ void __launch_bounds__(kThreads)
    down_kernel(const __grid_constant__ Tiles tiles, const DownArgs p) {
  using L = DownLayout<kP>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ring = reinterpret_cast<bf16*>(smem);
  const Tile t = last_first_tile(tiles);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r16 = (p.r + 15) & ~15, pairs = r16 >> 4, chunks = r16 >> 3;
  const int wld = p.w_rk ? kLd : rank_ld(r16);
  const bf16* x = p.x + static_cast<int64_t>(t.r0) * p.ldx;
  const bf16* w = p.w + static_cast<int64_t>(t.group) * p.r * p.K;
  const auto load = [&](int s) {
    bf16* xs = ring + (s % kDownStages) * L::kSlot;
    bf16* ws = xs + L::kX;
    const int64_t k0 = static_cast<int64_t>(s) * kKStage;
    // X: 64 rows x 8 chunks of 8 columns (K is a multiple of 8: a chunk is all in or all out).
    for (int i = tid; i < kRowTile * (kKStage / 8); i += kThreads) {
      const int row = i >> 3, col = (i & 7) << 3;
      const bool ok = row < t.rows && k0 + col < p.K;
      cp16_or_zero(&xs[row * kLd + col], ok ? x + row * p.ldx + k0 + col : p.x, ok);
    }
    if (p.w_rk) {  // [r16 rows j][64 k]
      for (int i = tid; i < r16 * (kKStage / 8); i += kThreads) {
        const int j = i >> 3, col = (i & 7) << 3;
        const bool ok = j < p.r && k0 + col < p.K;
        cp16_or_zero(&ws[j * kLd + col], ok ? w + j * p.K + k0 + col : p.w, ok);
      }
    } else {  // [64 k][r16 columns j]
      for (int i = tid; i < kKStage * chunks; i += kThreads) {
        const int kk = i / chunks, j = (i % chunks) << 3;
        const bool ok = j < p.r && k0 + kk < p.K;
        cp16_or_zero(&ws[kk * wld + j], ok ? w + (k0 + kk) * p.r + j : p.w, ok);
      }
    }
  };
  float acc[2 * kP][4] = {};
  const auto compute = [&](int, int slot) {
    const bf16* xs = ring + slot * L::kSlot;
    const bf16* ws = xs + L::kX;
#pragma unroll
    for (int kk = 0; kk < kKStage; kk += 16) {
      uint32_t a[4];
      mma::ldsm_a(a, xs, kLd, warp * 16, kk, lane);
#pragma unroll
      for (int q = 0; q < kP; ++q) {
        if (q >= pairs) break;
        mma_pair(acc[2 * q], acc[2 * q + 1], a, ws, p.w_rk, wld, 16 * q, kk, lane);
      }
    }
  };
  run_ring<kDownStages>(static_cast<int>((p.K + kKStage - 1) / kKStage), load, compute);
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int n = 0; n < 2 * kP; ++n) {
    const int col = 8 * n + 2 * c;
    if (col >= p.r) break;  // r is a multiple of 8: col + 1 < r too
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp * 16 + g + 8 * h;
      if (row < t.rows)
        st_pair(p.c + (t.r0 + row) * p.ldc + col, p.alpha * acc[n][2 * h],
                p.alpha * acc[n][2 * h + 1]);
    }
  }
}

// The rank-r operand's 64-row tile of a group ([64][r16], zeros past the rows and the rank).
__device__ __forceinline__ void load_rank_tile(bf16* ss, const bf16* src, int64_t ld, const Tile& t,
                                               int r, int tid) {
  const int chunks = ((r + 15) & ~15) >> 3;
  for (int i = tid; i < kRowTile * chunks; i += kThreads) {
    const int row = i / chunks, j = (i % chunks) << 3;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < t.rows && j < r) v = ld16(src + (t.r0 + row) * ld + j);
    *reinterpret_cast<uint4*>(&ss[row * kLd + j]) = v;
  }
}

// acc (64 rows x 128 columns: warp w has rows 16 w .. 16 w + 15) = the rank tile ss times the
// weight tile ws ([128 n][r16] when w_nr, else [r16][128 n]), over the padded rank r16.
__device__ __forceinline__ void up_mma(float (&acc)[kColTile / 8][4], const bf16* ss,
                                       const bf16* ws, bool w_nr, int r16, int warp, int lane) {
#pragma unroll
  for (int kk = 0; kk < kSkinnyMaxRank; kk += 16) {
    if (kk >= r16) break;
    uint32_t a[4];
    mma::ldsm_a(a, ss, kLd, warp * 16, kk, lane);
#pragma unroll
    for (int q = 0; q < kColTile / 16; ++q)
      mma_pair(acc[2 * q], acc[2 * q + 1], a, ws, w_nr, w_nr ? kLd : kLdWide, 16 * q, kk, lane);
  }
}

// Calls f(row, col, nt, h) for each pair of adjacent elements (row, col), (row, col + 1) that
// this lane holds in acc[nt][2 h], acc[nt][2 h + 1] of a 64-row tile (warp w: rows 16 w ..),
// over the first kTiles n-tiles: columns n0 + 8 nt + 2 (lane % 4) below n (a multiple of 8),
// rows below `rows`.
template <int kTiles, typename F>
__device__ __forceinline__ void for_each_pair(int64_t n0, int64_t n, int rows, int warp, int lane,
                                              const F& f) {
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
    const int64_t col = n0 + 8 * nt + 2 * c;
    if (col >= n) break;  // n is a multiple of 8: col + 1 < n too
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp * 16 + g + 8 * h;
      if (row < rows) f(row, col, nt, h);
    }
  }
}

// The up products' output tiles are staged in shared memory ([64 rows][128 columns], pitch
// kLdWide) and move between it and global memory in 16-byte chunks, a warp covering two whole rows
// of 256 bytes: storing the MMA fragments straight to global memory (4 bytes per lane, 8 rows per
// warp access) ran these bandwidth-bound kernels at a third of HBM's speed. A block walks several
// column tiles of its row tile, so the rank tile and the group lookup serve 512 columns.
constexpr int kUpTilesPerBlock = 4;

// Global -> shared (cp.async, uncommitted) or shared -> global for the tile's rows < rows and
// 8-column chunks whose first column `col(c)` of global memory (c = the tile's column) is < n.
// A tile is kCols wide at pitch kPitch: the output tiles (128, kLdWide) or, in the SwiGLU
// kernels, the 64-column h and dh tiles (64, kLd).
template <bool kLoad, int kCols = kColTile, int kPitch = kLdWide, typename G, typename Col>
__device__ __forceinline__ void move_tile(bf16* tile, G* g, int64_t ld, int rows, int64_t n,
                                          const Col& col, int tid) {
  constexpr int kChunks = kCols / 8;
  for (int i = tid; i < kRowTile * kChunks; i += kThreads) {
    const int row = i / kChunks, c = (i % kChunks) << 3;
    const int64_t gc = col(c);
    if (row >= rows || gc >= n) continue;
    bf16* sm = tile + row * kPitch + c;
    if constexpr (kLoad)
      mma::cp_async16(sm, g + row * ld + gc);
    else
      *reinterpret_cast<uint4*>(g + row * ld + gc) = *reinterpret_cast<const uint4*>(sm);
  }
}

// C [rows, n] = alpha S W^T (w_nr: W_g [n, r]) or alpha S W (W_g [r, n]), + beta C; one block per
// 64-row tile (blockIdx.x) and kUpTilesPerBlock tiles of 128 columns (blockIdx.y). The whole rank
// is one stage.
struct UpArgs {
  const bf16* s;
  int64_t lds;
  int r;
  const bf16* w;
  bool w_nr;
  int64_t n;
  bf16* c;
  int64_t ldc;
  float alpha, beta;
};

__global__ void __launch_bounds__(kThreads)
    up_kernel(const __grid_constant__ Tiles tiles, const UpArgs p) {
  __shared__ alignas(16) bf16 ss[kRowTile * kLd];
  __shared__ alignas(16) bf16 ws[kColTile * kLd];      // [128 n][r16] (w_nr) or [r16][128 n]
  __shared__ alignas(16) bf16 os[kRowTile * kLdWide];  // C's tile in, the output tile out
  static_assert(kSkinnyMaxRank * kLdWide <= kColTile * kLd, "ws holds either layout");
  const Tile t = find_tile(tiles, static_cast<int>(blockIdx.x));
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r16 = (p.r + 15) & ~15, chunks = r16 >> 3;
  const bf16* w = p.w + static_cast<int64_t>(t.group) * p.r * p.n;
  bf16* c = p.c + static_cast<int64_t>(t.r0) * p.ldc;
  load_rank_tile(ss, p.s, p.lds, t, p.r, tid);
  for (int tile = 0; tile < kUpTilesPerBlock; ++tile) {
    const int64_t n0 = (static_cast<int64_t>(blockIdx.y) * kUpTilesPerBlock + tile) * kColTile;
    if (n0 >= p.n) break;
    if (p.beta != 0.f)  // beta = 0 never reads C (it may hold NaN)
      move_tile<true>(
          os, c, p.ldc, t.rows, p.n, [&](int col) { return n0 + col; }, tid);
    mma::cp_async_commit();
    if (p.w_nr) {  // [128 rows n][r16 columns j]
      for (int i = tid; i < kColTile * chunks; i += kThreads) {
        const int nn = i / chunks, j = (i % chunks) << 3;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (n0 + nn < p.n && j < p.r) v = ld16(w + (n0 + nn) * p.r + j);
        *reinterpret_cast<uint4*>(&ws[nn * kLd + j]) = v;
      }
    } else {  // [r16 rows j][128 columns n]
      for (int i = tid; i < r16 * (kColTile / 8); i += kThreads) {
        const int j = i / (kColTile / 8), nn = (i % (kColTile / 8)) << 3;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (j < p.r && n0 + nn < p.n) v = ld16(w + j * p.n + n0 + nn);
        *reinterpret_cast<uint4*>(&ws[j * kLdWide + nn]) = v;
      }
    }
    mma::cp_async_wait<0>();
    __syncthreads();
    float acc[kColTile / 8][4] = {};
    up_mma(acc, ss, ws, p.w_nr, r16, warp, lane);
    for_each_pair<kColTile / 8>(
        0, p.n - n0, t.rows, warp, lane, [&](int row, int64_t col, int nt, int h) {
          bf16* o = &os[row * kLdWide + col];
          float v0 = p.alpha * acc[nt][2 * h], v1 = p.alpha * acc[nt][2 * h + 1];
          if (p.beta != 0.f) {
            v0 += p.beta * __bfloat162float(o[0]);
            v1 += p.beta * __bfloat162float(o[1]);
          }
          st_pair(o, v0, v1);
        });
    __syncthreads();
    move_tile<false>(
        os, c, p.ldc, t.rows, p.n, [&](int col) { return n0 + col; }, tid);
    __syncthreads();  // os and ws are refilled for the next tile
  }
}

constexpr int kHalfTile = kColTile / 2;
constexpr int kUpTile = kHalfTile / 8;  // the first up n-tile of a SwiGLU kernel's accumulators

// The SwiGLU kernels' staged [gate | up] tile for the F columns c0 .. c0+63: its column cc is
// gate_up's column c0 + cc (gate) or F + c0 + cc - 64 (up); past F, 2F (outside every row).
struct GateUpCols {
  int64_t c0, F;
  __device__ int64_t operator()(int cc) const {
    const int64_t col = c0 + (cc & (kHalfTile - 1));
    return col >= F ? 2 * F : col + (cc < kHalfTile ? 0 : F);
  }
};

// B_g's rows for those columns, [gate c0.., up F+c0..][r16] (B_g [2F, r]; zeros past F and r).
__device__ __forceinline__ void load_gate_up_b(bf16* ws, const bf16* w, int64_t c0, int64_t F,
                                               int r, int tid) {
  const int chunks = ((r + 15) & ~15) >> 3;
  for (int i = tid; i < kColTile * chunks; i += kThreads) {
    const int nn = i / chunks, j = (i % chunks) << 3;
    const int64_t col = c0 + (nn < kHalfTile ? nn : nn - kHalfTile);  // of the F columns
    uint4 v = make_uint4(0, 0, 0, 0);
    if (col < F && j < r) v = ld16(w + (col + (nn < kHalfTile ? 0 : F)) * r + j);
    *reinterpret_cast<uint4*>(&ws[nn * kLd + j]) = v;
  }
}

// The adapted gate and up of element e of the pair (nt, h) this lane holds: the staged value plus
// s times the up product, rounded to bf16 as both SwiGLU kernels round it (`gp` points at the
// pair's gate column in the staged tile, its up column kHalfTile further).
__device__ __forceinline__ void adapted_gate_up(const float (&acc)[kColTile / 8][4], const bf16* gp,
                                                int nt, int h, int e, float s, float& g, float& u) {
  const auto bf = [](float v) { return __bfloat162float(__float2bfloat16(v)); };
  g = bf(s * acc[nt][2 * h + e] + __bfloat162float(gp[e]));
  u = bf(s * acc[nt + kUpTile][2 * h + e] + __bfloat162float(gp[kHalfTile + e]));
}

// The gate/up projection's adapter term and SwiGLU in one pass, after the base GEMM wrote
// gate_up = [g | u] [rows, 2F]: h = silu(g) * u with g = bf16(g + s xa B_g[:F]^T), u = bf16(u +
// s xa B_g[F:]^T) (B_g [2F, r]); gate_up is only read (backward forms the sums again). One block
// per 64-row tile (blockIdx.x) and kUpTilesPerBlock tiles of 64 columns c0 .. c0+63 of F
// (blockIdx.y): the 128 columns of the up product's tile are gate c0.. and up F+c0.., so a thread
// holds g and u of the same elements; g and u come in through the staged tile, h goes out
// through the weight tile's space once the MMAs are done with it.
struct SwigluArgs {
  const bf16* xa;
  int64_t ldx;
  int r;
  const bf16* b;  // [G, 2F, r]
  int64_t F;
  const bf16* gu;
  int64_t ldgu;
  bf16* h;
  int64_t ldh;
  float s;
};

__global__ void __launch_bounds__(kThreads)
    up_swiglu_kernel(const __grid_constant__ Tiles tiles, const SwigluArgs p) {
  __shared__ alignas(16) bf16 ss[kRowTile * kLd];
  __shared__ alignas(16) bf16 ws[kColTile * kLd];      // [gate c0.., up F+c0..][r16], then h's tile
  __shared__ alignas(16) bf16 os[kRowTile * kLdWide];  // [64 rows][gate c0.., up F+c0..]
  static_assert(kRowTile * kLd <= kColTile * kLd, "h's tile fits in the weight tile");
  const Tile t = find_tile(tiles, static_cast<int>(blockIdx.x));
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r16 = (p.r + 15) & ~15;
  const bf16* w = p.b + static_cast<int64_t>(t.group) * 2 * p.F * p.r;
  const bf16* gu = p.gu + static_cast<int64_t>(t.r0) * p.ldgu;
  bf16* hg = p.h + static_cast<int64_t>(t.r0) * p.ldh;
  load_rank_tile(ss, p.xa, p.ldx, t, p.r, tid);
  for (int tile = 0; tile < kUpTilesPerBlock; ++tile) {
    const int64_t c0 = (static_cast<int64_t>(blockIdx.y) * kUpTilesPerBlock + tile) * kHalfTile;
    if (c0 >= p.F) break;
    const auto f_col = [&](int cc) { return c0 + cc; };
    move_tile<true>(os, gu, p.ldgu, t.rows, 2 * p.F, GateUpCols{c0, p.F}, tid);
    mma::cp_async_commit();
    load_gate_up_b(ws, w, c0, p.F, p.r, tid);
    mma::cp_async_wait<0>();
    __syncthreads();
    float acc[kColTile / 8][4] = {};
    up_mma(acc, ss, ws, true, r16, warp, lane);
    __syncthreads();  // every warp is done with ws: h's tile goes there
    bf16* hs = ws;
    for_each_pair<kUpTile>(
        0, p.F - c0, t.rows, warp, lane, [&](int row, int64_t col, int nt, int h) {
          float g[2], u[2];
          for (int e = 0; e < 2; ++e)
            adapted_gate_up(acc, &os[row * kLdWide + col], nt, h, e, p.s, g[e], u[e]);
          st_pair(&hs[row * kLd + col], g[0] / (1.0f + expf(-g[0])) * u[0],
                  g[1] / (1.0f + expf(-g[1])) * u[1]);
        });
    __syncthreads();
    move_tile<false, kHalfTile, kLd>(hs, hg, p.ldh, t.rows, p.F, f_col, tid);
    __syncthreads();  // os and ws are refilled for the next tile
  }
}

// The backward of up_swiglu_kernel joined with the down projection's adapter input gradient:
// [g | u] formed again exactly as forward formed it (same MMAs, same rounding), dh + dr A_d (dr
// [rows, r], A_d [G, r, F]: the term the base GEMM's dh lacks), then dgate_up, written. Tiles as
// up_swiglu_kernel's, with dr's rank tile, A_d's [r16][64] tile and dh's [64][64] tile beside
// them (dynamic shared memory, kSwigluBwdSmem).
struct SwigluBwdArgs {
  const bf16* xa;
  int64_t ldx;
  const bf16* dr;
  int64_t ldr;
  int r;
  const bf16* b;  // [G, 2F, r]
  const bf16* a;  // [G, r, F]
  int64_t F;
  const bf16* gu;
  int64_t ldgu;
  const bf16* dh;
  int64_t lddh;
  bf16* dgu;
  int64_t lddgu;
  float s;
};

constexpr int kSwigluBwdSmem =
    static_cast<int>((2 * kRowTile * kLd + kColTile * kLd + kSkinnyMaxRank * kLd +
                      kRowTile * kLdWide + kRowTile * kLd) *
                     sizeof(bf16));

__global__ void __launch_bounds__(kThreads)
    up_swiglu_bwd_kernel(const __grid_constant__ Tiles tiles, const SwigluBwdArgs p) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ss = reinterpret_cast<bf16*>(smem);  // xa's rank tile [64][r16]
  bf16* rs = ss + kRowTile * kLd;            // dr's rank tile
  bf16* ws = rs + kRowTile * kLd;            // B_g: [gate c0.., up F+c0..][r16]
  bf16* as = ws + kColTile * kLd;            // A_d: [r16][64 columns c0..]
  bf16* os = as + kSkinnyMaxRank * kLd;      // [64][gate | up]: gate_up in, dgate_up out
  bf16* ds = os + kRowTile * kLdWide;        // dh: [64][64]
  const Tile t = find_tile(tiles, static_cast<int>(blockIdx.x));
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r16 = (p.r + 15) & ~15;
  const bf16* wb = p.b + static_cast<int64_t>(t.group) * 2 * p.F * p.r;
  const bf16* wa = p.a + static_cast<int64_t>(t.group) * p.r * p.F;
  const bf16* gu = p.gu + static_cast<int64_t>(t.r0) * p.ldgu;
  const bf16* dh = p.dh + static_cast<int64_t>(t.r0) * p.lddh;
  bf16* dgu = p.dgu + static_cast<int64_t>(t.r0) * p.lddgu;
  load_rank_tile(ss, p.xa, p.ldx, t, p.r, tid);
  load_rank_tile(rs, p.dr, p.ldr, t, p.r, tid);
  for (int tile = 0; tile < kUpTilesPerBlock; ++tile) {
    const int64_t c0 = (static_cast<int64_t>(blockIdx.y) * kUpTilesPerBlock + tile) * kHalfTile;
    if (c0 >= p.F) break;
    const GateUpCols gu_col{c0, p.F};
    move_tile<true>(os, gu, p.ldgu, t.rows, 2 * p.F, gu_col, tid);
    move_tile<true, kHalfTile, kLd>(
        ds, dh, p.lddh, t.rows, p.F, [&](int cc) { return c0 + cc; }, tid);
    mma::cp_async_commit();
    load_gate_up_b(ws, wb, c0, p.F, p.r, tid);
    for (int i = tid; i < r16 * (kHalfTile / 8); i += kThreads) {  // [r16 rows j][64 columns]
      const int j = i / (kHalfTile / 8), cc = (i % (kHalfTile / 8)) << 3;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (j < p.r && c0 + cc < p.F) v = ld16(wa + j * p.F + c0 + cc);
      *reinterpret_cast<uint4*>(&as[j * kLd + cc]) = v;
    }
    mma::cp_async_wait<0>();
    __syncthreads();
    float acc[kColTile / 8][4] = {};
    up_mma(acc, ss, ws, true, r16, warp, lane);
    float accd[kHalfTile / 8][4] = {};  // dr A_d over the tile's 64 columns
#pragma unroll
    for (int kk = 0; kk < kSkinnyMaxRank; kk += 16) {
      if (kk >= r16) break;
      uint32_t a[4];
      mma::ldsm_a(a, rs, kLd, warp * 16, kk, lane);
#pragma unroll
      for (int q = 0; q < kHalfTile / 16; ++q)
        mma_pair(accd[2 * q], accd[2 * q + 1], a, as, false, kLd, 16 * q, kk, lane);
    }
    for_each_pair<kUpTile>(
        0, p.F - c0, t.rows, warp, lane, [&](int row, int64_t col, int nt, int h) {
          bf16* gp = &os[row * kLdWide + col];
          bf16* up = gp + kHalfTile;
          const bf16* dp = &ds[row * kLd + col];
          float dg[2], du[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {  // as swiglu_bwd_kernel (ops/cuda/grouped_ffn.cu)
            float g, u;
            adapted_gate_up(acc, gp, nt, h, e, p.s, g, u);
            const float d = __bfloat162float(dp[e]) + accd[nt][2 * h + e];
            const float sg = 1.0f / (1.0f + expf(-g));
            du[e] = d * g * sg;
            dg[e] = d * u * sg * (1.0f + g * (1.0f - sg));
          }
          st_pair(gp, dg[0], dg[1]);
          st_pair(up, du[0], du[1]);
        });
    __syncthreads();
    move_tile<false>(os, dgu, p.lddgu, t.rows, 2 * p.F, gu_col, tid);
    __syncthreads();  // the tiles are refilled for the next tile
  }
}

// dW_g += alpha sum over the tile's rows of P[row]^T S[row] (P [rows, wide], S [rows, r]):
// dW_g [r, wide] (s_first: the form's A is S) or [wide, r]. One block per 128 wide columns
// (blockIdx.x: the blocks that share a row tile run side by side, so S's rows come from L2 and
// P's rows are read whole at once) and row tile (blockIdx.y, striding by gridDim.y past 65535
// tiles); rows in stages of 32 through the ring (DwLayout). The MMA's m is the wide column, its n
// the rank, its k the row.
struct DwArgs {
  const bf16* pw;  // the wide operand
  int64_t ldp, wide;
  const bf16* s;
  int64_t lds;
  int r;
  bool s_first, atomic;
  float* dw;
  float alpha;
};

template <int kP>
struct DwLayout {
  static constexpr int kPw = kDwRows * kLdWide;                   // P [32 rows][128 wide]
  static constexpr int kSlot = kPw + kDwRows * rank_ld(16 * kP);  // + S [32 rows][r16]
  static constexpr int kBytes = kDownStages * kSlot * static_cast<int>(sizeof(bf16));
};

template <int kP>
__global__ void __launch_bounds__(kThreads)
    dw_kernel(const __grid_constant__ Tiles tiles, const DwArgs p) {
  using L = DwLayout<kP>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ring = reinterpret_cast<bf16*>(smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r16 = (p.r + 15) & ~15, pairs = r16 >> 4, chunks = r16 >> 3, sld = rank_ld(r16);
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kColTile;
  const int g = lane >> 2, c = lane & 3;
  for (int tb = static_cast<int>(blockIdx.y); tb < tiles.tile0[tiles.count];
       tb += static_cast<int>(gridDim.y)) {
    const Tile t = find_tile(tiles, tb);
    const auto load = [&](int s) {
      bf16* ps = ring + (s % kDownStages) * L::kSlot;
      bf16* ss = ps + L::kPw;
      const int s0 = s * kDwRows, rows = min(kDwRows, t.rows - s0);
      const int64_t row0 = t.r0 + s0;
      for (int i = tid; i < kDwRows * (kColTile / 8); i += kThreads) {
        const int row = i / (kColTile / 8), col = (i % (kColTile / 8)) << 3;
        const bool ok = row < rows && m0 + col < p.wide;
        cp16_or_zero(&ps[row * kLdWide + col], ok ? p.pw + (row0 + row) * p.ldp + m0 + col : p.pw,
                     ok);
      }
      for (int i = tid; i < kDwRows * chunks; i += kThreads) {
        const int row = i / chunks, j = (i % chunks) << 3;
        const bool ok = row < rows && j < p.r;
        cp16_or_zero(&ss[row * sld + j], ok ? p.s + (row0 + row) * p.lds + j : p.s, ok);
      }
    };
    float acc[2][2 * kP][4] = {};
    const auto compute = [&](int, int slot) {
      const bf16* ps = ring + slot * L::kSlot;
      const bf16* ss = ps + L::kPw;
#pragma unroll
      for (int kk = 0; kk < kDwRows; kk += 16) {
        uint32_t a[2][4];
        ldsm_a_km(a[0], ps, kLdWide, warp * 32, kk, lane);
        ldsm_a_km(a[1], ps, kLdWide, warp * 32 + 16, kk, lane);
#pragma unroll
        for (int q = 0; q < kP; ++q) {
          if (q >= pairs) break;
          uint32_t b0[2], b1[2];
          mma::load_b_kn(b0, ss, sld, kk, 16 * q, lane);
          mma::load_b_kn(b1, ss, sld, kk, 16 * q + 8, lane);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma::mma_bf16(acc[mt][2 * q], a[mt], b0);
            mma::mma_bf16(acc[mt][2 * q + 1], a[mt], b1);
          }
        }
      }
    };
    run_ring<kDownStages>((t.rows + kDwRows - 1) / kDwRows, load, compute);
    float* dw = p.dw + static_cast<int64_t>(t.group) * p.r * p.wide;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int n = 0; n < 2 * kP; ++n) {
        const int j = 8 * n + 2 * c;
        if (j >= p.r) break;
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // c0, c1: (m g, j, j+1); c2, c3: (m g+8, same)
          const int64_t m = m0 + warp * 32 + 16 * mt + g + 8 * (e >> 1);
          const int jj = j + (e & 1);
          if (m >= p.wide) continue;
          float* out = dw + (p.s_first ? jj * p.wide + m : m * p.r + jj);
          const float v = p.alpha * acc[mt][n][e];
          if (p.atomic)
            atomicAdd(out, v);
          else
            *out += v;  // this block is the element's only writer
        }
      }
  }
}

// dW_g *= beta for the groups listed (beta = 0 clears, NaN included), before the dW kernel adds.
__global__ void scale_groups_kernel(const __grid_constant__ Tiles tiles, int64_t wsize, float beta,
                                    float* dw) {
  const int64_t n = static_cast<int64_t>(tiles.count) * wsize;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float* e = dw + tiles.group[i / wsize] * wsize + i % wsize;
    *e = beta == 0.f ? 0.f : beta * *e;
  }
}

// The two products of expert LoRA's backward that read the projection's output gradient dOut
// [rows, K], in one pass over it (the separate kernels read it twice, once per product):
//   dr = s dOut_g B_g (B_g [K, r], written, bf16) and dB_g += s dOut_g^T xa_g (f32, atomics).
// One block per tile of up to kOgRows rows of a group; the stages of the ring (OgLayout) are
// [kOgRows rows][64 k] tiles of dOut, so that each stage feeds both MMAs: warp w owns rows
// w kOgRows / 4 .. of dr (accumulated in registers over the k-stages) and columns 16 w .. 16 w + 15
// of the k-stage's dB, which meets the other blocks' through f32 atomics (two adjacent elements
// per float2 atomic). Session 13's kernel held 2 blocks per SM and ran at 1.8 TB/s (shape A, ncu),
// as fast with dB's atomics four times fewer (session 14's mid-session run); session 14 ran two
// 64-row parts per block (5 blocks per SM). Session 17 found the kernel issuing ~400 instructions
// per warp and stage (the copies' addresses formed per copy), addressed each thread's copies once,
// and runs one 128-row part again, the faster form since (skinny_lora_out_grads). Ranks up to 32.
constexpr int kOgRows = 128;
constexpr int kFusedMaxRank = 32;  // out_grads_kernel<1> and <2>

struct OutGradArgs {
  const bf16* dout;
  int64_t ldo, K;
  const bf16* b;  // [G, K, r]
  const bf16* xa;
  int64_t ldx;
  int r;
  bf16* dr;
  int64_t lddr;
  float* db;  // [G, K, r], or null
  float s;
};

template <int kP>
struct OgLayout {
  static constexpr int kLdB = rank_ld(16 * kP);
  static constexpr int kD = kOgRows * kLd;           // dOut [kOgRows rows][64 k]
  static constexpr int kSlot = kD + kKStage * kLdB;  // + B_g's stage [64 k][r16]
  static constexpr int kXa = kOgRows * kLdB;         // xa of the block's rows, once
  static constexpr int kRing = kStages;              // 4 deep
  static constexpr int kBytes = (kRing * kSlot + kXa) * static_cast<int>(sizeof(bf16));
};

template <int kP>
__global__ void __launch_bounds__(kThreads)
    out_grads_kernel(const __grid_constant__ Tiles tiles, const OutGradArgs p) {
  using L = OgLayout<kP>;
  constexpr int kRows = kOgRows;
  constexpr int kMt = kRows / (16 * (kThreads / 32));  // 16-row m-tiles of dr per warp
  static_assert(kMt * 16 * (kThreads / 32) == kRows && kKStage == 16 * (kThreads / 32),
                "a warp owns kRows / 4 rows of dr and 16 columns of a stage's dB");
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ring = reinterpret_cast<bf16*>(smem);
  bf16* xs = ring + L::kRing * L::kSlot;
  const Tile t = last_first_tile(tiles);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int chunks = 2 * kP;                   // 16-byte chunks of a padded rank row
  const int parts = (t.rows + kRows - 1) / kRows;  // 1: the tiles hold at most kRows rows
  const bf16* dout = p.dout + static_cast<int64_t>(t.r0) * p.ldo;
  const bf16* b = p.b + static_cast<int64_t>(t.group) * p.K * p.r;
  float* db_g = p.db == nullptr ? nullptr : p.db + static_cast<int64_t>(t.group) * p.K * p.r;
  for (int i = tid; i < parts * kRows * chunks; i += kThreads) {  // lands with stage 0
    const int row = i / chunks, j = (i % chunks) << 3;
    const bool ok = row < t.rows && j < p.r;
    cp16_or_zero(&xs[row * L::kLdB + j], ok ? p.xa + (t.r0 + row) * p.ldx + j : p.xa, ok);
  }
  // Stage s: k-stage s. The thread's share of a stage, fixed but for k0: dOut's rows
  // tid / 8 + 16 it at column 8 (tid % 8), and B's (k, 8-column chunk) pairs tid + kThreads it,
  // addressed once here
  // (session 17 ncu: with the addresses formed per copy the kernel issued ~400 instructions per
  // warp and stage, ALU the busiest pipe, 2.0 TB/s).
  constexpr int kDoutIters = kRows * (kKStage / 8) / kThreads,
                kBIters = kKStage * chunks / kThreads;
  static_assert(
      kDoutIters * kThreads == kRows * (kKStage / 8) && kBIters * kThreads == kKStage * chunks,
      "a stage's 16-byte copies spread evenly over the threads");
  const int dcol = (tid & 7) << 3, drow = tid >> 3;
  const bf16* dsrc[kDoutIters];
  uint32_t drow_ok = 0;  // bit it: that row exists
#pragma unroll
  for (int it = 0; it < kDoutIters; ++it) {
    const int row = drow + it * (kThreads / 8);
    dsrc[it] = dout + static_cast<int64_t>(row) * p.ldo + dcol;
    if (row < t.rows) drow_ok |= 1u << it;
  }
  const auto load = [&](int s) {
    bf16* ds = ring + (s % L::kRing) * L::kSlot;
    bf16* bs = ds + L::kD;
    const int64_t k0 = static_cast<int64_t>(s) * kKStage;
    const bool col_ok = k0 + dcol < p.K;
#pragma unroll
    for (int it = 0; it < kDoutIters; ++it) {
      const bool ok = col_ok && (drow_ok >> it & 1u);
      cp16_or_zero(&ds[(drow + it * (kThreads / 8)) * kLd + dcol], ok ? dsrc[it] + k0 : p.dout, ok);
    }
#pragma unroll
    for (int it = 0; it < kBIters; ++it) {
      const int i = tid + it * kThreads, kk = i / chunks, j = (i % chunks) << 3;
      const bool ok = j < p.r && k0 + kk < p.K;
      cp16_or_zero(&bs[kk * L::kLdB + j], ok ? b + (k0 + kk) * p.r + j : p.b, ok);
    }
  };
  const int g = lane >> 2, c = lane & 3;
  float dr[kMt][2 * kP][4] = {};
  float db[2 * kP][4] = {};
  const auto compute = [&](int s, int slot) {
    const bf16* ds = ring + slot * L::kSlot;
    const bf16* bs = ds + L::kD;
    // dr: the warp's rows x the stage's k.
#pragma unroll
    for (int kk = 0; kk < kKStage; kk += 16) {
      uint32_t b0[kP][2], b1[kP][2];
#pragma unroll
      for (int n = 0; n < kP; ++n) {
        mma::load_b_kn(b0[n], bs, L::kLdB, kk, 16 * n, lane);
        mma::load_b_kn(b1[n], bs, L::kLdB, kk, 16 * n + 8, lane);
      }
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        uint32_t a[4];
        mma::ldsm_a(a, ds, kLd, (warp * kMt + mt) * 16, kk, lane);
#pragma unroll
        for (int n = 0; n < kP; ++n) {
          mma::mma_bf16(dr[mt][2 * n], a, b0[n]);
          mma::mma_bf16(dr[mt][2 * n + 1], a, b1[n]);
        }
      }
    }
    if (db_g == nullptr) return;
#pragma unroll
    for (int kr = 0; kr < kRows; kr += 16) {  // dB: the warp's stage columns x the tile's rows
      uint32_t a_t[4];
      ldsm_a_km(a_t, ds, kLd, warp * 16, kr, lane);
#pragma unroll
      for (int n = 0; n < kP; ++n)
        mma_pair(db[2 * n], db[2 * n + 1], a_t, xs, false, L::kLdB, 16 * n, kr, lane);
    }
    if (parts != 1) return;
    const int64_t k0 = static_cast<int64_t>(s) * kKStage;
#pragma unroll
    for (int n = 0; n < 2 * kP; ++n) {
      const int j = 8 * n + 2 * c;
      if (j < p.r) {  // r is a multiple of 8: j + 1 < r too
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // (k g, j..j+1), (k g+8, j..j+1): adjacent, 8-byte aligned
          const int64_t k = k0 + warp * 16 + g + 8 * h;
          if (k < p.K)
            atomicAdd(reinterpret_cast<float2*>(db_g + k * p.r + j),
                      make_float2(p.s * db[n][2 * h], p.s * db[n][2 * h + 1]));
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) db[n][e] = 0.f;
    }
  };
  run_ring<L::kRing>(static_cast<int>((p.K + kKStage - 1) / kKStage) * parts, load, compute);
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int n = 0; n < 2 * kP; ++n) {
      const int col = 8 * n + 2 * c;
      if (col >= p.r) break;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = (warp * kMt + mt) * 16 + g + 8 * h;
        if (row < t.rows)
          st_pair(p.dr + (t.r0 + row) * p.lddr + col, p.s * dr[mt][n][2 * h],
                  p.s * dr[mt][n][2 * h + 1]);
      }
    }
}

// The K-concatenation path's SwiGLU backward joined with the products that read its output and h
// (ops/grouped_ffn.h, grouped_ffn_lora_swiglu_backward_grads), in one pass over gate_up and dh:
//   dgate_up = SwiGLU'(g, u) dh (written; [g | u] = gate_up, adapted already),
//   dr_gu = s dgate_up B_gu (written, bf16), dB_gu += s dgate_up^T xa (f32 atomics),
//   dA_down += dr_down^T h (f32 atomics), h = silu(g) u formed again from SwiGLU's sigmoid (to
//   the saved h's last bit: a gradient's operand).
// Separately these were SwiGLU's backward, a pass over dgate_up (out_grads_kernel) and one over h
// (dw_kernel): at shape A 0.34 + 0.28 + 0.10 ms in session 13's ncu, the last two re-reading
// 2 N F + N F elements that this kernel has in shared memory. One block per up to kSbParts x 64
// rows of a group; the ring's stages (SbLayout) are [64 rows][32 columns of F] tiles of gate and
// up (64 columns: gate c0.., up F+c0..) and of dh, column chunk outer and 64-row part inner. A
// stage's SwiGLU backward writes dgate_up over the gate/up tile and h over the dh tile; then warp w
// adds its 16 rows of the part x the stage's 64 columns into dr_gu (registers, per part), its 16
// columns of dgate_up^T xa into dB's chunk and the chunk's n-tile w of dr_down^T h into dA's, both
// summed over the block's parts before one atomic per element pair. Ranks up to 32.
constexpr int kSbRows = kRowTile;         // rows of a part: 4 warps x 16
constexpr int kSbCols = 32;               // columns of F per stage (64 of dgate_up)
constexpr int kSbParts = 3;               // parts per block: 192 rows
constexpr int kSbStages = 3;              // its ring's depth: 3 blocks (12 warps) per SM
constexpr int kSbLdGu = 2 * kSbCols + 8;  // the gate/up tile's pitch: 144 bytes
constexpr int kSbLdH = kSbCols + 8;       // the dh / h tile's pitch: 80 bytes

struct SwigluBwdGradsArgs {
  const bf16* gu;
  int64_t ldgu;
  const bf16* dh;
  int64_t lddh;
  const bf16* drd;  // dr_down [rows, r]
  int64_t lddrd;
  const bf16* xa;
  int64_t ldx;
  const bf16* b;  // B_gu [G, 2F, r]
  int64_t F;
  int r;
  bf16* dgu;
  int64_t lddgu;
  bf16* drg;  // dr_gu [rows, r]
  int64_t lddrg;
  float* db;  // dB_gu [G, 2F, r], or null
  float* da;  // dA_down [G, r, F], or null
  float s;
};

template <int kP>
struct SbLayout {
  static constexpr int kLdB = rank_ld(16 * kP);
  static constexpr int kGu = kSbRows * kSbLdGu;  // [64 rows][gate 32 | up 32]
  static constexpr int kH = kSbRows * kSbLdH;    // [64 rows][32]: dh in, h out
  static constexpr int kB = 2 * kSbCols * kLdB;  // B_gu's rows of the stage's 64 columns
  static constexpr int kSlot = kGu + kH + kB;
  static constexpr int kRank = kSbParts * kSbRows * kLdB;  // xa, dr_down: the block's rows
  static constexpr int kBytes = (kSbStages * kSlot + 2 * kRank) * static_cast<int>(sizeof(bf16));
};

template <int kP>
__global__ void __launch_bounds__(kThreads)
    swiglu_bwd_grads_kernel(const __grid_constant__ Tiles tiles, const SwigluBwdGradsArgs p) {
  using L = SbLayout<kP>;
  static_assert(kSbCols == 8 * (kThreads / 32), "a warp owns one n-tile of a stage's dA");
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ring = reinterpret_cast<bf16*>(smem);
  bf16* xs = ring + kSbStages * L::kSlot;  // xa of the block's rows
  bf16* rs = xs + L::kRank;                // dr_down of the block's rows
  const Tile t = last_first_tile(tiles);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int chunks = ((p.r + 15) & ~15) >> 3;
  const int parts = (t.rows + kSbRows - 1) / kSbRows;  // 1 .. kSbParts
  const int64_t F = p.F;
  const bf16* gu = p.gu + static_cast<int64_t>(t.r0) * p.ldgu;
  const bf16* dh = p.dh + static_cast<int64_t>(t.r0) * p.lddh;
  const bf16* wb = p.b + static_cast<int64_t>(t.group) * 2 * F * p.r;
  for (int i = tid; i < parts * kSbRows * chunks; i += kThreads) {  // land with stage 0
    const int row = i / chunks, j = (i % chunks) << 3;
    const bool ok = row < t.rows && j < p.r;
    cp16_or_zero(&xs[row * L::kLdB + j], ok ? p.xa + (t.r0 + row) * p.ldx + j : p.xa, ok);
    cp16_or_zero(&rs[row * L::kLdB + j], ok ? p.drd + (t.r0 + row) * p.lddrd + j : p.drd, ok);
  }
  // The stage's column of gate_up for tile column cc (0..63): gate c0 + cc or up F + c0 + cc - 32.
  const auto gu_col = [&](int64_t c0, int cc) {
    return cc < kSbCols ? c0 + cc : F + c0 + cc - kSbCols;
  };
  // Stage s: column chunk s / parts, part s % parts.
  const auto load = [&](int s) {
    bf16* gs = ring + (s % kSbStages) * L::kSlot;
    bf16* hs = gs + L::kGu;
    bf16* bs = hs + L::kH;
    const int row0 = (s % parts) * kSbRows;
    const int64_t c0 = static_cast<int64_t>(s / parts) * kSbCols;
    for (int i = tid; i < kSbRows * (2 * kSbCols / 8); i += kThreads) {
      const int row = i >> 3, cc = (i & 7) << 3;
      const bool ok = row0 + row < t.rows && c0 + (cc & (kSbCols - 1)) < F;
      cp16_or_zero(&gs[row * kSbLdGu + cc], ok ? gu + (row0 + row) * p.ldgu + gu_col(c0, cc) : p.gu,
                   ok);
    }
    for (int i = tid; i < kSbRows * (kSbCols / 8); i += kThreads) {
      const int row = i >> 2, cc = (i & 3) << 3;
      const bool ok = row0 + row < t.rows && c0 + cc < F;
      cp16_or_zero(&hs[row * kSbLdH + cc], ok ? dh + (row0 + row) * p.lddh + c0 + cc : p.dh, ok);
    }
    for (int i = tid; i < 2 * kSbCols * chunks; i += kThreads) {  // [64 columns][r16]
      const int cc = i / chunks, j = (i % chunks) << 3;
      const bool ok = j < p.r && c0 + (cc & (kSbCols - 1)) < F;
      cp16_or_zero(&bs[cc * L::kLdB + j], ok ? wb + gu_col(c0, cc) * p.r + j : p.b, ok);
    }
  };
  float drg[kSbParts][2 * kP][4] = {};
  float db[2 * kP][4] = {};  // dB's chunk: the warp's 16 columns x the rank
  float da[kP][4] = {};      // dA's chunk: the rank x the warp's 8 columns
  const auto compute = [&](int s, int slot) {
    bf16* gs = ring + slot * L::kSlot;
    bf16* hs = gs + L::kGu;
    const bf16* bs = hs + L::kH;
    const int part = s % parts;
    const int64_t c0 = static_cast<int64_t>(s / parts) * kSbCols;
    // SwiGLU's backward, two adjacent columns per step; zeros (rows past the group, columns past
    // F) give zeros.
    for (int i = tid; i < kSbRows * (kSbCols / 2); i += kThreads) {
      const int row = i / (kSbCols / 2), cc = (i % (kSbCols / 2)) * 2;
      bf16* gp = &gs[row * kSbLdGu + cc];
      bf16* up = gp + kSbCols;
      bf16* hp = &hs[row * kSbLdH + cc];
      const float2 g2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(gp)),
                   u2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(up)),
                   d2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(hp));
      const float gv[2] = {g2.x, g2.y}, uv[2] = {u2.x, u2.y}, dv[2] = {d2.x, d2.y};
      float dg[2], du[2], h[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {  // as swiglu_bwd_kernel (ops/cuda/grouped_ffn.cu)
        const float gj = gv[e], uj = uv[e], dj = dv[e];
        const float sg = 1.0f / (1.0f + expf(-gj));
        du[e] = dj * gj * sg;
        dg[e] = dj * uj * sg * (1.0f + gj * (1.0f - sg));
        // silu(g) u for dA only: from sg (one exp, one division less than the forward kernel's
        // g / (1 + exp(-g)) u; the rounded h may differ from the saved one in its last bit).
        h[e] = gj * sg * uj;
      }
      st_pair(gp, dg[0], dg[1]);
      st_pair(up, du[0], du[1]);
      st_pair(hp, h[0], h[1]);
    }
    __syncthreads();
    // dgate_up out: the part's rows, the chunk's columns below F.
    bf16* dgu = p.dgu + static_cast<int64_t>(t.r0 + part * kSbRows) * p.lddgu;
    const int rows = min(kSbRows, t.rows - part * kSbRows);
    for (int i = tid; i < kSbRows * (2 * kSbCols / 8); i += kThreads) {
      const int row = i >> 3, cc = (i & 7) << 3;
      if (row < rows && c0 + (cc & (kSbCols - 1)) < F)
        *reinterpret_cast<uint4*>(dgu + row * p.lddgu + gu_col(c0, cc)) =
            *reinterpret_cast<const uint4*>(&gs[row * kSbLdGu + cc]);
    }
    // dr_gu: the warp's 16 rows of the part x the stage's 64 columns (k) times B's rows. The part
    // picks the accumulators through a compile-time index.
#pragma unroll
    for (int q = 0; q < kSbParts; ++q) {
      if (q != part) continue;
#pragma unroll
      for (int kk = 0; kk < 2 * kSbCols; kk += 16) {
        uint32_t a[4];
        mma::ldsm_a(a, gs, kSbLdGu, warp * 16, kk, lane);
#pragma unroll
        for (int n = 0; n < kP; ++n)
          mma_pair(drg[q][2 * n], drg[q][2 * n + 1], a, bs, false, L::kLdB, 16 * n, kk, lane);
      }
    }
    const bf16* xp = xs + part * kSbRows * L::kLdB;
    const bf16* rp = rs + part * kSbRows * L::kLdB;
#pragma unroll
    for (int kr = 0; kr < kSbRows; kr += 16) {
      if (p.db != nullptr) {  // dB: the warp's columns 16 w.. of the 64 x the rank, over the rows
        uint32_t a_t[4];
        ldsm_a_km(a_t, gs, kSbLdGu, warp * 16, kr, lane);
#pragma unroll
        for (int n = 0; n < kP; ++n)
          mma_pair(db[2 * n], db[2 * n + 1], a_t, xp, false, L::kLdB, 16 * n, kr, lane);
      }
      if (p.da != nullptr) {  // dA: the rank (m) x the warp's 8 columns of h (n), over the rows
        uint32_t bh[2];
        mma::load_b_kn(bh, hs, kSbLdH, kr, 8 * warp, lane);
#pragma unroll
        for (int m = 0; m < kP; ++m) {
          uint32_t a_t[4];
          ldsm_a_km(a_t, rp, L::kLdB, 16 * m, kr, lane);
          mma::mma_bf16(da[m], a_t, bh);
        }
      }
    }
    if (part != parts - 1) return;  // the chunk's dB and dA sum the block's other parts first
    if (p.db != nullptr) {
      float* db_g = p.db + static_cast<int64_t>(t.group) * 2 * F * p.r;
#pragma unroll
      for (int n = 0; n < 2 * kP; ++n) {
        const int j = 8 * n + 2 * c;
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // (column g, j..j+1), (g + 8, j..j+1)
          const int cc = warp * 16 + g + 8 * h;
          if (j < p.r && c0 + (cc & (kSbCols - 1)) < F)
            atomicAdd(reinterpret_cast<float2*>(db_g + gu_col(c0, cc) * p.r + j),
                      make_float2(p.s * db[n][2 * h], p.s * db[n][2 * h + 1]));
          db[n][2 * h] = db[n][2 * h + 1] = 0.f;
        }
      }
    }
    if (p.da != nullptr) {
      float* da_g = p.da + static_cast<int64_t>(t.group) * p.r * F;
      const int64_t col = c0 + 8 * warp + 2 * c;  // F is a multiple of 8: col + 1 < F too
#pragma unroll
      for (int m = 0; m < kP; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // (j = 16 m + g + 8 h; col, col + 1)
          const int j = 16 * m + g + 8 * h;
          if (j < p.r && col < F)
            atomicAdd(reinterpret_cast<float2*>(da_g + j * F + col),
                      make_float2(da[m][2 * h], da[m][2 * h + 1]));
          da[m][2 * h] = da[m][2 * h + 1] = 0.f;
        }
      }
    }
  };
  run_ring<kSbStages>(static_cast<int>((F + kSbCols - 1) / kSbCols) * parts, load, compute);
#pragma unroll
  for (int q = 0; q < kSbParts; ++q)
#pragma unroll
    for (int n = 0; n < 2 * kP; ++n) {
      const int col = 8 * n + 2 * c;
      if (col >= p.r) break;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = q * kSbRows + warp * 16 + g + 8 * h;
        if (row < t.rows)
          st_pair(p.drg + (t.r0 + row) * p.lddrg + col, p.s * drg[q][n][2 * h],
                  p.s * drg[q][n][2 * h + 1]);
      }
    }
}

// The K-concatenation path's SwiGLU forward joined with the down adapter's first product
// (ops/grouped_ffn.h, grouped_ffn_lora_swiglu_ha): h = silu(g) u (written, as swiglu_fwd_kernel
// rounds it) and ha = h A_down^T (written, bf16; A_down [G, r, F]) from the same h tile in shared
// memory, where the down kernel read h back from HBM (session 13's ncu: 0.10 ms at A, 0.06 at B).
// One block per 64-row tile of a group; the ring's stages (HaLayout) are [64 rows][gate 32 | up
// 32] tiles of gate_up with A_down's [r16][32] columns; warp w forms h for its share of the tile,
// then adds its 16 rows x the stage's 32 columns (k) into ha (registers). No atomics: a block
// holds its rows' whole sums. A 3-stage ring (kSbStages) leaves room for 4 blocks per SM at ranks
// up to 16. Ranks up to 64.
struct SwigluHaArgs {
  const bf16* gu;
  int64_t ldgu;
  const bf16* a;  // A_down [G, r, F]
  int64_t F;
  int r;
  bf16* h;
  int64_t ldh;
  bf16* ha;
  int64_t ldha;
};

template <int kP>
struct HaLayout {
  static constexpr int kGu = kSbRows * kSbLdGu;  // [64 rows][gate 32 | up 32]
  static constexpr int kH = kSbRows * kSbLdH;    // [64 rows][32]: h
  static constexpr int kA = 16 * kP * kSbLdH;    // A_down's [r16 rows j][32 columns]
  static constexpr int kSlot = kGu + kH + kA;
  static constexpr int kBytes = kSbStages * kSlot * static_cast<int>(sizeof(bf16));
};

template <int kP>
__global__ void __launch_bounds__(kThreads)
    swiglu_ha_kernel(const __grid_constant__ Tiles tiles, const SwigluHaArgs p) {
  using L = HaLayout<kP>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ring = reinterpret_cast<bf16*>(smem);
  const Tile t = find_tile(tiles, static_cast<int>(blockIdx.x));
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r16 = (p.r + 15) & ~15, pairs = r16 >> 4;
  const int64_t F = p.F;
  const bf16* gu = p.gu + static_cast<int64_t>(t.r0) * p.ldgu;
  const bf16* wa = p.a + static_cast<int64_t>(t.group) * p.r * F;
  bf16* hg = p.h + static_cast<int64_t>(t.r0) * p.ldh;
  const auto gu_col = [&](int64_t c0, int cc) {
    return cc < kSbCols ? c0 + cc : F + c0 + cc - kSbCols;
  };
  const auto load = [&](int s) {
    bf16* gs = ring + (s % kSbStages) * L::kSlot;
    bf16* as = gs + L::kGu + L::kH;
    const int64_t c0 = static_cast<int64_t>(s) * kSbCols;
    for (int i = tid; i < kSbRows * (2 * kSbCols / 8); i += kThreads) {
      const int row = i >> 3, cc = (i & 7) << 3;
      const bool ok = row < t.rows && c0 + (cc & (kSbCols - 1)) < F;
      cp16_or_zero(&gs[row * kSbLdGu + cc], ok ? gu + row * p.ldgu + gu_col(c0, cc) : p.gu, ok);
    }
    for (int i = tid; i < r16 * (kSbCols / 8); i += kThreads) {  // [r16 rows j][32 columns]
      const int j = i >> 2, cc = (i & 3) << 3;
      const bool ok = j < p.r && c0 + cc < F;
      cp16_or_zero(&as[j * kSbLdH + cc], ok ? wa + j * F + c0 + cc : p.a, ok);
    }
  };
  float acc[2 * kP][4] = {};
  const auto compute = [&](int s, int slot) {
    const bf16* gs = ring + slot * L::kSlot;
    bf16* hs = ring + slot * L::kSlot + L::kGu;
    const bf16* as = hs + L::kH;
    const int64_t c0 = static_cast<int64_t>(s) * kSbCols;
    for (int i = tid; i < kSbRows * (kSbCols / 2); i += kThreads) {
      const int row = i / (kSbCols / 2), cc = (i % (kSbCols / 2)) * 2;
      const bf16* gp = &gs[row * kSbLdGu + cc];
      float h[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {  // as swiglu_fwd_kernel (ops/cuda/grouped_ffn.cu)
        const float gj = __bfloat162float(gp[e]);
        h[e] = gj / (1.0f + expf(-gj)) * __bfloat162float(gp[kSbCols + e]);
      }
      st_pair(&hs[row * kSbLdH + cc], h[0], h[1]);
    }
    __syncthreads();
    for (int i = tid; i < kSbRows * (kSbCols / 8); i += kThreads) {  // h out
      const int row = i >> 2, cc = (i & 3) << 3;
      if (row < t.rows && c0 + cc < F)
        *reinterpret_cast<uint4*>(hg + row * p.ldh + c0 + cc) =
            *reinterpret_cast<const uint4*>(&hs[row * kSbLdH + cc]);
    }
#pragma unroll
    for (int kk = 0; kk < kSbCols; kk += 16) {  // ha: the warp's 16 rows x the rank
      uint32_t a[4];
      mma::ldsm_a(a, hs, kSbLdH, warp * 16, kk, lane);
#pragma unroll
      for (int q = 0; q < kP; ++q) {
        if (q >= pairs) break;
        mma_pair(acc[2 * q], acc[2 * q + 1], a, as, true, kSbLdH, 16 * q, kk, lane);
      }
    }
  };
  run_ring<kSbStages>(static_cast<int>((F + kSbCols - 1) / kSbCols), load, compute);
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int n = 0; n < 2 * kP; ++n) {
    const int col = 8 * n + 2 * c;
    if (col >= p.r) break;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp * 16 + g + 8 * h;
      if (row < t.rows)
        st_pair(p.ha + (t.r0 + row) * p.ldha + col, acc[n][2 * h], acc[n][2 * h + 1]);
    }
  }
}

// grouped_ffn_lora_swiglu_ha with the product's fragments formed in registers
// (LoraKernels::Registers). swiglu_ha_kernel stages gate_up through a shared-memory ring and
// meets its warps at two barriers per 32 columns, with 4 blocks (16 warps) per SM; this kernel is
// laid out like the frozen SwiGLU kernel instead (ops/cuda/grouped_ffn.cu: 16-byte loads straight
// into registers, no shared memory, many warps per SM), each warp one 16-row tile of a group across
// all F columns. The MMA's k (h's columns) may be taken in any order as long as A_down's fragment
// takes the same, so lane (g, c) reads the 8 adjacent columns 8c .. 8c + 7 of each 32-column chunk
// of rows g and g + 8 (one 16-byte load per row and operand) and they are the k-positions its A
// fragments hold: in k16 step s of the chunk, logical k {2c, 2c+1} = column 8c + 4s + {0, 1} and
// {2c+8, 2c+9} = 8c + 4s + {2, 3}, i.e. h's packed registers 2s and 2s + 1 of each row; B's
// fragment for n-tile q (j = 8q + g) is the same 8 columns of A_down's row j, one 16-byte load
// (L1-resident: a group's warps share it). ha sums a row over all of F in registers: no atomics.
constexpr int kRegWarps = 8;   // warps per block
constexpr int kRegRows = 16;   // rows per warp: one m16 tile
constexpr int kRegChunk = 32;  // columns of F per k-chunk: 8 per lane of a quad

__device__ __forceinline__ uint4 ldg16_or_zero(const bf16* p, bool ok) {
  return ok ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// h = silu(g) u of 8 packed columns, rounded to bf16 pairs, as swiglu_fwd_kernel computes it.
__device__ __forceinline__ uint4 swiglu8(const uint4& gv, const uint4& uv) {
  const bf16* g = reinterpret_cast<const bf16*>(&gv);
  const bf16* u = reinterpret_cast<const bf16*>(&uv);
  uint32_t h[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    float v[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float gj = __bfloat162float(g[2 * k + e]);
      v[e] = gj / (1.0f + expf(-gj)) * __bfloat162float(u[2 * k + e]);
    }
    h[k] = mma::pack_bf16(v[0], v[1]);
  }
  return make_uint4(h[0], h[1], h[2], h[3]);
}

// Without kSwiglu: xa = X A^T (grouped_ffn_lora_xa) the same way, X's packs as the A fragments
// (gu = X, F = its width K, a = A [G, r, K], ha = xa; h unused).
template <int kNT, bool kSwiglu>  // r = 8 kNT; 3 blocks (24 warps) per SM up to rank 16
__global__ void __launch_bounds__(kRegWarps * 32, kNT <= 2 ? 3 : 1)
    swiglu_ha_regs_kernel(const __grid_constant__ Tiles tiles, const SwigluHaArgs p) {
  const int lane = threadIdx.x & 31;
  const int wt = static_cast<int>(blockIdx.x) * kRegWarps + static_cast<int>(threadIdx.x >> 5);
  if (wt >= tiles.tile0[tiles.count]) return;  // the warp's own exit: no block-wide barriers
  const Tile t = find_tile(tiles, wt);
  const int g = lane >> 2, c = lane & 3;
  const bool ok[2] = {g < t.rows, g + 8 < t.rows};
  const int64_t F = p.F;
  const bf16* gu[2] = {p.gu + static_cast<int64_t>(t.r0 + g) * p.ldgu,
                       p.gu + static_cast<int64_t>(t.r0 + g + 8) * p.ldgu};
  bf16* h[2] = {kSwiglu ? p.h + static_cast<int64_t>(t.r0 + g) * p.ldh : nullptr,
                kSwiglu ? p.h + static_cast<int64_t>(t.r0 + g + 8) * p.ldh : nullptr};
  const bf16* a = p.a + (static_cast<int64_t>(t.group) * p.r + g) * F;  // A_down's row j = g
  float acc[kNT][4] = {};
  // One chunk of loaded columns: g and u of both rows, A_down's rows 8q + g.
  struct Chunk {
    uint4 g[2], u[2], a[kNT];
  };
  const auto load = [&](int64_t col, Chunk& k) {
    const bool in = col < F;  // F is a multiple of 8: the lane's 8 columns are all in or all out
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      k.g[i] = ldg16_or_zero(gu[i] + col, in && ok[i]);
      if constexpr (kSwiglu) k.u[i] = ldg16_or_zero(gu[i] + F + col, in && ok[i]);
    }
#pragma unroll
    for (int q = 0; q < kNT; ++q) k.a[q] = ldg16_or_zero(a + 8 * q * F + col, in);
  };
  const auto compute = [&](int64_t col, const Chunk& k) {
    uint4 hv[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if constexpr (kSwiglu) {
        hv[i] = swiglu8(k.g[i], k.u[i]);  // zeros in, zeros out: rows and columns past the ends
        if (col < F && ok[i]) *reinterpret_cast<uint4*>(h[i] + col) = hv[i];
      } else {
        hv[i] = k.g[i];
      }
    }
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const uint32_t af[4] = {word(hv[0], 2 * s), word(hv[1], 2 * s), word(hv[0], 2 * s + 1),
                              word(hv[1], 2 * s + 1)};
#pragma unroll
      for (int q = 0; q < kNT; ++q) {
        const uint32_t bf[2] = {word(k.a[q], 2 * s), word(k.a[q], 2 * s + 1)};
        mma::mma_bf16(acc[q], af, bf);
      }
    }
  };
  // Two chunks per step, both loaded before either is used: 16 loads of 16 bytes in flight per
  // lane at rank 16.
  for (int64_t c0 = 0; c0 < F; c0 += 2 * kRegChunk) {
    Chunk k0, k1;
    load(c0 + 8 * c, k0);
    load(c0 + kRegChunk + 8 * c, k1);
    compute(c0 + 8 * c, k0);
    compute(c0 + kRegChunk + 8 * c, k1);
  }
#pragma unroll
  for (int q = 0; q < kNT; ++q) {
    const int col = 8 * q + 2 * c;
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (ok[i])
        st_pair(p.ha + static_cast<int64_t>(t.r0 + g + 8 * i) * p.ldha + col, acc[q][2 * i],
                acc[q][2 * i + 1]);
  }
}

// grouped_ffn_lora_swiglu_backward_grads with dr_gu's fragments formed in registers
// (LoraKernels::Registers; swiglu_bwd_grads_kernel stages every operand through a 3-stage
// ring with 3 blocks of 4 warps per SM and two barriers per stage). A block takes 128 rows of a
// group, warp w rows 16 w .. 16 w + 15 across all of F in 32-column chunks, each lane the 8
// adjacent columns 8c .. 8c + 7 of rows g and g + 8 (16-byte loads of gate, up and dh straight into
// registers; dgate_up stored from them), as swiglu_ha_regs_kernel does:
//   dr_gu = s dgate_up B_gu sums a row over the columns: the warp's own, in registers, with
//     dgate_up's packed registers as the A fragments (the k order of swiglu_ha_regs_kernel) and
//     B_gu's rows of the chunk staged in shared memory in that order (ldmatrix .trans);
//   dB_gu += s dgate_up^T xa and dA_down += dr_down^T h sum a column over the rows: each warp also
//     stores its dgate_up and h into the chunk's [128 rows][gate 32 | up 32 | h 32] tile, and after
//     the chunk's one barrier warps 0-3 take dB's 16 columns 16 w.. of the 64 (m = the column, n =
//     the rank, k = the block's 128 rows) and warps 4-7 dA's 8 columns (m = the rank), one f32
//     float2 atomic per element pair and 128 rows. The tile and B's stage are double-buffered, so
//     that the one barrier orders both (a shared-memory reduction of each warp's 16 rows measured
//     48 CAS loops per lane and chunk in the SASS: shared f32 atomics are not native).
// Ranks up to 32 (kMT m-tiles of 16: the rank padded with zeros).
constexpr int kRbWarps = 8;
constexpr int kRbRows = kRbWarps * kRegRows;  // rows of a group per block
constexpr int kRbLdT = 3 * kRegChunk + 8;     // the tile's pitch: 208 bytes, ldmatrix conflict-free

// The chunk's column (0 .. 31) that logical k L (0 .. 15) of k16 step ss (0, 1) stands for.
__device__ __forceinline__ int chunk_col(int ss, int L) {
  return 8 * ((L & 7) >> 1) + 4 * ss + 2 * (L >> 3) + (L & 1);
}

template <int kMT>
struct RbLayout {
  static constexpr int kR16 = 16 * kMT;
  static constexpr int kLdR = kR16 + 8;     // rank-wide rows: 16-byte aligned, conflict-free
  static constexpr int kB = 4 * 16 * kLdR;  // B's rows for the chunk's 4 k16 steps (gate 2, up 2)
  static constexpr int kT = kRbRows * kRbLdT;
  static constexpr int kRank = kRbRows * kLdR;  // xa or dr_down of the block's rows
  static constexpr int kBytes = (2 * kB + 2 * kT + 2 * kRank) * static_cast<int>(sizeof(bf16));
};

// kSwiglu: the kernel above. Without it, the out_grads pass (skinny_lora_out_grads) on the same
// layout: dOut [rows, K] in 64-column chunks as the two halves (columns c0 + 8c.. and c0 + 32 +
// 8c.. of a lane) that SwiGLU's gate and up are, dr = s dOut B written (B [G, K, r]), dB += s
// dOut^T xa by warps 0-3 from the tile (warps 4-7 idle there: no dA). The arguments are
// SwigluBwdGradsArgs's with gu = dOut, F = K, xa the rank-r input, drg = dr, db = dB (dh, drd, dgu,
// da unused).
template <int kMT, bool kSwiglu>  // 2 blocks (16 warps) per SM with SwiGLU, else 3 up to rank 16
__global__ void __launch_bounds__(kRbWarps * 32, kSwiglu || kMT > 1 ? 2 : 3)
    bwd_grads_regs_kernel(const __grid_constant__ Tiles tiles, const SwigluBwdGradsArgs p) {
  using L = RbLayout<kMT>;
  constexpr int kNT = 2 * kMT;  // the rank's n-tiles of 8
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* bs = reinterpret_cast<bf16*>(smem);  // [2][kB]
  bf16* ts = bs + 2 * L::kB;                 // [2][kT]
  bf16* xs = ts + 2 * L::kT;                 // xa [128][kLdR]
  bf16* rs = xs + L::kRank;                  // dr_down [128][kLdR]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const Tile t = find_tile(tiles, static_cast<int>(blockIdx.x));
  const int64_t F = p.F;  // the width: F (SwiGLU) or K (dOut)
  const int r = p.r;
  const int w0 = warp * kRegRows;  // the warp's first row in the tile
  const bool ok[2] = {w0 + g < t.rows, w0 + g + 8 < t.rows};
  const int64_t row[2] = {t.r0 + w0 + g, t.r0 + w0 + g + 8};
  // A chunk's two halves: half h's column `off` (0 .. 31) is the operand's column c0 + col_of(h,
  // off), within the width where c0 + width_of(h, off) < F.
  const auto col_of = [&](int h, int off) -> int64_t {
    return kSwiglu ? (h ? F : 0) + off : kRegChunk * h + off;
  };
  const auto width_of = [&](int h, int off) { return kSwiglu ? off : kRegChunk * h + off; };
  constexpr int kAdvance = kSwiglu ? kRegChunk : 2 * kRegChunk;
  const bf16* wb = p.b + static_cast<int64_t>(t.group) * (kSwiglu ? 2 * F : F) * r;
  constexpr int kChunks = L::kR16 / 8;  // 16-byte pieces of a rank-wide row
  // B's rows of chunk c0 in logical k order: steps 0, 1 of the first half, 2, 3 of the second.
  const auto load_b = [&](int64_t c0, bf16* dst) {
    for (int i = tid; i < 4 * 16 * kChunks; i += kRbWarps * 32) {
      const int step = i / (16 * kChunks), lr = (i / kChunks) % 16, j = (i % kChunks) * 8;
      const int off = chunk_col(step & 1, lr), h = step >> 1;
      const bool in = c0 + width_of(h, off) < F && j < r;
      cp16_or_zero(dst + (step * 16 + lr) * L::kLdR + j,
                   in ? wb + (c0 + col_of(h, off)) * r + j : p.b, in);
    }
  };
  for (int i = tid; i < kRbRows * kChunks; i += kRbWarps * 32) {  // xa, dr_down: zeros past
    const int rr = i / kChunks, j = (i % kChunks) * 8;            // the rows and the rank
    const bool in = rr < t.rows && j < r;
    const int64_t gr = t.r0 + rr;
    cp16_or_zero(xs + rr * L::kLdR + j, in ? p.xa + gr * p.ldx + j : p.xa, in);
    if constexpr (kSwiglu)
      cp16_or_zero(rs + rr * L::kLdR + j, in ? p.drd + gr * p.lddrd + j : p.drd, in);
  }
  load_b(0, bs);
  mma::cp_async_commit();
  mma::cp_async_wait<0>();
  __syncthreads();  // B's first stage, xa and dr_down
  float dr[kNT][4] = {};
  const int nchunks = static_cast<int>((F + kAdvance - 1) / kAdvance);
  // The lane's packs of a chunk: per row the two halves (gate and up, or dOut's two 32-column
  // halves) and dh. Loaded one chunk ahead, so that they are in flight across the chunk before's
  // SwiGLU, barrier and column sums (issued after the barrier, the loads' latency was exposed at
  // every chunk: 1.7 TB/s at shape A in session 16's mid-session ncu, where the barrier-free
  // forward kernel ran 2.8).
  struct Packs {
    uint4 a[2], b[2], d[2];
  };
  const auto load = [&](int64_t c0, Packs& k) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const bf16* gp = p.gu + row[i] * p.ldgu + c0;
      if constexpr (kSwiglu) {
        const bool v = c0 + 8 * c < F && ok[i];
        k.a[i] = ldg16_or_zero(gp + 8 * c, v);
        k.b[i] = ldg16_or_zero(gp + F + 8 * c, v);
        k.d[i] = ldg16_or_zero(p.dh + row[i] * p.lddh + c0 + 8 * c, v);
      } else {
        k.a[i] = ldg16_or_zero(gp + 8 * c, c0 + 8 * c < F && ok[i]);
        k.b[i] = ldg16_or_zero(gp + kRegChunk + 8 * c, c0 + kRegChunk + 8 * c < F && ok[i]);
      }
    }
  };
  Packs cur;
  load(0, cur);
  for (int ci = 0; ci < nchunks; ++ci) {
    const int64_t c0 = static_cast<int64_t>(ci) * kAdvance;
    const bf16* bcur = bs + (ci & 1) * L::kB;
    bf16* tcur = ts + (ci & 1) * L::kT;
    if (ci + 1 < nchunks) load_b(c0 + kAdvance, bs + ((ci + 1) & 1) * L::kB);
    mma::cp_async_commit();
    Packs next;
    load(ci + 1 < nchunks ? c0 + kAdvance : F, next);  // past the width: zeros, nothing read
    uint4 dgv[2], duv[2];  // the halves' packs of rows g, g + 8 (dgate_up's gate and up)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      bf16* tr = tcur + (w0 + g + 8 * i) * kRbLdT + 8 * c;
      if constexpr (kSwiglu) {
        const bool v = c0 + 8 * c < F && ok[i];
        const uint4 gq = cur.a[i], uq = cur.b[i], dq = cur.d[i];
        const bf16* gb = reinterpret_cast<const bf16*>(&gq);
        const bf16* ub = reinterpret_cast<const bf16*>(&uq);
        const bf16* hb = reinterpret_cast<const bf16*>(&dq);
        uint32_t dgw[4], duw[4], hw[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          float dgf[2], duf[2], hf[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {  // as swiglu_bwd_kernel (ops/cuda/grouped_ffn.cu)
            const float gj = __bfloat162float(gb[2 * k + e]), uj = __bfloat162float(ub[2 * k + e]),
                        dj = __bfloat162float(hb[2 * k + e]);
            const float sg = 1.0f / (1.0f + expf(-gj));
            duf[e] = dj * gj * sg;
            dgf[e] = dj * uj * sg * (1.0f + gj * (1.0f - sg));
            hf[e] = gj * sg * uj;  // for dA only, from sg (as swiglu_bwd_grads_kernel)
          }
          dgw[k] = mma::pack_bf16(dgf[0], dgf[1]);
          duw[k] = mma::pack_bf16(duf[0], duf[1]);
          hw[k] = mma::pack_bf16(hf[0], hf[1]);
        }
        dgv[i] = make_uint4(dgw[0], dgw[1], dgw[2], dgw[3]);
        duv[i] = make_uint4(duw[0], duw[1], duw[2], duw[3]);
        if (v) {
          bf16* out = p.dgu + row[i] * p.lddgu + c0 + 8 * c;
          *reinterpret_cast<uint4*>(out) = dgv[i];
          *reinterpret_cast<uint4*>(out + F) = duv[i];
        }
        *reinterpret_cast<uint4*>(tr + 2 * kRegChunk) = make_uint4(hw[0], hw[1], hw[2], hw[3]);
      } else {
        dgv[i] = cur.a[i];
        duv[i] = cur.b[i];
      }
      // The tile (zeros past the rows and the width, from the zero loads).
      *reinterpret_cast<uint4*>(tr) = dgv[i];
      *reinterpret_cast<uint4*>(tr + kRegChunk) = duv[i];
    }
    // dr over the chunk: k16 steps 0, 1 of the first half, then of the second.
#pragma unroll
    for (int step = 0; step < 4; ++step) {
      const uint4* src = step < 2 ? dgv : duv;
      const int ss = step & 1;
      const uint32_t af[4] = {word(src[0], 2 * ss), word(src[1], 2 * ss), word(src[0], 2 * ss + 1),
                              word(src[1], 2 * ss + 1)};
#pragma unroll
      for (int q = 0; q < kNT; ++q) {
        uint32_t bf[2];
        mma::load_b_kn(bf, bcur + step * 16 * L::kLdR, L::kLdR, 0, 8 * q, lane);
        mma::mma_bf16(dr[q], af, bf);
      }
    }
    mma::cp_async_wait<0>();
    __syncthreads();                    // the chunk's tile is whole; B's next stage has landed
    if (warp < 4 && p.db != nullptr) {  // dB: columns 16 w .. 16 w + 15 of the tile's 64 x the rank
      float acc[kNT][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < kRbRows; k0 += 16) {
        uint32_t a[4];
        ldsm_a_km(a, tcur, kRbLdT, 16 * warp, k0, lane);
#pragma unroll
        for (int q = 0; q < kNT; ++q) {
          uint32_t bf[2];
          mma::load_b_kn(bf, xs, L::kLdR, k0, 8 * q, lane);
          mma::mma_bf16(acc[q], a, bf);
        }
      }
      float* db_g = p.db + static_cast<int64_t>(t.group) * (kSwiglu ? 2 * F : F) * r;
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // (tile column 16 w + g + 8 h; j = 8q + 2c, + 1)
        const int cc = 16 * warp + g + 8 * h, half = cc / kRegChunk, off = cc % kRegChunk;
        if (c0 + width_of(half, off) >= F) continue;
        float* out = db_g + (c0 + col_of(half, off)) * r;
#pragma unroll
        for (int q = 0; q < kNT; ++q) {
          const int j = 8 * q + 2 * c;
          if (j < r)
            atomicAdd(reinterpret_cast<float2*>(out + j),
                      make_float2(p.s * acc[q][2 * h], p.s * acc[q][2 * h + 1]));
        }
      }
    }
    if (kSwiglu && warp >= 4 && p.da != nullptr) {  // dA: the rank x columns 8 (w - 4) .. of h
      const int n0 = 8 * (warp - 4);
      float acc[kMT][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < kRbRows; k0 += 16) {
        uint32_t bf[2];
        mma::load_b_kn(bf, tcur + 2 * kRegChunk, kRbLdT, k0, n0, lane);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          uint32_t a[4];
          ldsm_a_km(a, rs, L::kLdR, 16 * mt, k0, lane);
          mma::mma_bf16(acc[mt], a, bf);
        }
      }
      float* da_g = p.da + static_cast<int64_t>(t.group) * r * F;
      const int64_t fc = c0 + n0 + 2 * c;  // F is a multiple of 8: fc + 1 < F too
      if (fc < F) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // (j = 16 mt + g + 8 h; fc, fc + 1)
            const int j = 16 * mt + g + 8 * h;
            if (j < r)
              atomicAdd(reinterpret_cast<float2*>(da_g + j * F + fc),
                        make_float2(acc[mt][2 * h], acc[mt][2 * h + 1]));
          }
      }
    }
    cur = next;
  }
#pragma unroll
  for (int q = 0; q < kNT; ++q) {
    const int j = 8 * q + 2 * c;
    if (j >= r) break;
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (ok[i]) st_pair(p.drg + row[i] * p.lddrg + j, p.s * dr[q][2 * i], p.s * dr[q][2 * i + 1]);
  }
}

// grouped_ffn_lora_pack's four copies as one launch (blockIdx.y: the job): job j moves a
// contiguous [E, R, C] factor (bf16 or f32) times `scale`, rounded once to bf16, into a strided
// bf16 destination, 8 columns (16 bytes out) per thread and step. Bound by HBM: E r (out + in)
// elements read and written per projection.
struct PackJob {
  const void* src;
  bool f32;
  float scale;
  int64_t rows, R, C;  // rows = E R
  bf16* dst;
  int64_t group_pitch, row_pitch;
};

struct PackJobs {
  PackJob job[4];
};

__global__ void lora_pack_kernel(const __grid_constant__ PackJobs jobs) {
  const PackJob& j = jobs.job[blockIdx.y];
  // 32-bit index arithmetic (the host checks n < 2^31): 64-bit divisions per 16 bytes cost the
  // kernel more than its memory traffic at shape B (1.3 TB/s, session 14's first version).
  const uint32_t per_row = static_cast<uint32_t>(j.C / 8), R = static_cast<uint32_t>(j.R);
  const uint32_t n = static_cast<uint32_t>(j.rows) * per_row;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const uint32_t row = i / per_row, c = (i - row * per_row) * 8;
    const uint32_t e = row / R, rr = row - e * R;
    float v[8];
    if (j.f32) {
      const float4* src =
          reinterpret_cast<const float4*>(static_cast<const float*>(j.src) + int64_t{i} * 8);
      const float4 lo = src[0], hi = src[1];
      v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
      v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    } else {
      const uint4 raw = ld16(static_cast<const bf16*>(j.src) + int64_t{i} * 8);
      const bf16* b = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = __bfloat162float(b[k]);
    }
    uint4 o;
    uint32_t* w = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = mma::pack_bf16(j.scale * v[2 * k], j.scale * v[2 * k + 1]);
    *reinterpret_cast<uint4*>(j.dst + int64_t{e} * j.group_pitch + int64_t{rr} * j.row_pitch + c) =
        o;
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// A row operand the kernels' 16-byte loads can read: bf16, 16-byte base, row pitch and width.
bool rows_ok(const Tensor& t) {
  return t.dtype() == DType::BF16 && aligned16(t.raw()) && t.stride(0) % 8 == 0 &&
         t.dim(1) % 8 == 0 && t.stride(1) == 1;
}

bool rank_ok(int64_t r) {
  return r > 0 && r <= kSkinnyMaxRank && r % 8 == 0;
}

// The non-empty groups of `off` in tiles of `tile_rows` rows; false when they are too many.
bool make_tiles(const int32_t* off, int64_t groups, int tile_rows, Tiles& t) {
  t.count = 0;
  t.tile_rows = tile_rows;
  int64_t tiles = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int32_t rows = off[g + 1] - off[g];
    if (rows == 0) continue;
    if (t.count == kMaxGroups) return false;
    t.group[t.count] = static_cast<int32_t>(g);
    t.row0[t.count] = off[g];
    t.rows[t.count] = rows;
    t.tile0[t.count] = static_cast<int32_t>(tiles);
    tiles += (rows + tile_rows - 1) / tile_rows;
    ++t.count;
  }
  t.tile0[t.count] = static_cast<int32_t>(tiles);
  return tiles <= INT32_MAX;
}

unsigned col_blocks(int64_t n) {
  return static_cast<unsigned>((n + kColTile - 1) / kColTile);
}

// Launches a ring kernel (128 threads) with `bytes` of dynamic shared memory, opting in past the
// default 48 KB.
template <typename Args>
void launch_ring(void (*kernel)(Tiles, Args), dim3 grid, int bytes, cudaStream_t st,
                 const Tiles& tiles, const Args& args) {
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  kernel<<<grid, kThreads, bytes, st>>>(tiles, args);
  MT_CUDA_LAUNCH_CHECK();
}

// The up kernels' blocks along n: kUpTilesPerBlock tiles of `tile` columns each.
unsigned up_col_blocks(int64_t n, int64_t tile) {
  const int64_t per_block = tile * kUpTilesPerBlock;
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

// swiglu_ha_regs_kernel for the rank args.r (a multiple of 8 up to 64), over 16-row tiles.
template <bool kSwiglu>
void launch_ha_regs(Context& ctx, const Tiles& tiles, const SwigluHaArgs& args) {
  const dim3 grid((tiles.tile0[tiles.count] + kRegWarps - 1) / kRegWarps);
  const auto run = [&](auto kernel) {
    kernel<<<grid, kRegWarps * 32, 0, stream(ctx)>>>(tiles, args);
    MT_CUDA_LAUNCH_CHECK();
  };
  switch (args.r / 8) {
    case 1:
      return run(swiglu_ha_regs_kernel<1, kSwiglu>);
    case 2:
      return run(swiglu_ha_regs_kernel<2, kSwiglu>);
    case 3:
      return run(swiglu_ha_regs_kernel<3, kSwiglu>);
    case 4:
      return run(swiglu_ha_regs_kernel<4, kSwiglu>);
    case 5:
      return run(swiglu_ha_regs_kernel<5, kSwiglu>);
    case 6:
      return run(swiglu_ha_regs_kernel<6, kSwiglu>);
    case 7:
      return run(swiglu_ha_regs_kernel<7, kSwiglu>);
    default:
      return run(swiglu_ha_regs_kernel<8, kSwiglu>);
  }
}

}  // namespace

bool skinny_grouped_matmul(Context& ctx, const GroupedMatmulParams& p, const Tensor& a,
                           const Tensor& offsets, const Tensor& b, Tensor& c) {
  if (!rows_ok(a) || a.dim(1) == 0 || b.numel() == 0 || c.numel() == 0) return false;
  const int32_t* off = offsets.i32();
  const int64_t groups = offsets.numel() - 1;
  cudaStream_t st = stream(ctx);
  // The table is ~16 KB: kept off the host stack (the launch copies it).
  thread_local Tiles tiles;
  if (p.form == GroupedForm::DytX) {
    // dW [G, out, in] += A^T B: A [rows, out], B [rows, in]; the rank is out (A skinny) or in.
    if (!rows_ok(b) || c.dtype() != DType::F32 || !c.is_contiguous()) return false;
    const int64_t out = c.dim(1), in = c.dim(2);
    const bool s_first = rank_ok(out);
    if (!s_first && !rank_ok(in)) return false;
    int tile_rows = kDwChunk;
    if (ctx.deterministic())  // a group's rows all in one block, summed in row order
      for (int64_t g = 0; g < groups; ++g) tile_rows = std::max(tile_rows, off[g + 1] - off[g]);
    if (!make_tiles(off, groups, tile_rows, tiles)) return false;
    const Tensor &s = s_first ? a : b, &pw = s_first ? b : a;
    if (p.beta != 1.f) {
      scale_groups_kernel<<<blocks_for(tiles.count * out * in, 256, 1024), 256, 0, st>>>(
          tiles, out * in, p.beta, ptr<float>(c));
      MT_CUDA_LAUNCH_CHECK();
    }
    const DwArgs args{ptr<bf16>(pw), pw.stride(0),         pw.dim(1),
                      ptr<bf16>(s),  s.stride(0),          static_cast<int>(s.dim(1)),
                      s_first,       !ctx.deterministic(), ptr<float>(c),
                      p.alpha};
    const int64_t ntiles = tiles.tile0[tiles.count];
    if (ntiles == 0) return true;  // no rows: dW is scaled only
    const dim3 grid(col_blocks(pw.dim(1)), static_cast<unsigned>(std::min<int64_t>(ntiles, 65535)));
    with_pairs(s.dim(1), [&](auto kp) {
      constexpr int kP = decltype(kp)::value;
      launch_ring(dw_kernel<kP>, grid, DwLayout<kP>::kBytes, st, tiles, args);
    });
    return true;
  }
  // XWt: C [rows, out] = A [rows, in] W_g^T with W [G, out, in]; DyW: C [rows, in] = A [rows, out]
  // W_g. Down when C's width is the rank, up when A's is.
  if (!rows_ok(c) || b.dtype() != DType::BF16 || !b.is_contiguous() || !aligned16(b.raw()))
    return false;
  const bool xwt = p.form == GroupedForm::XWt;
  const int64_t kdim = a.dim(1), ndim = c.dim(1);
  if (rank_ok(ndim) && p.beta == 0.f) {
    if (!make_tiles(off, groups, kRowTile, tiles)) return false;
    const DownArgs args{ptr<bf16>(a),           a.stride(0),  kdim,        ptr<bf16>(b), xwt,
                        static_cast<int>(ndim), ptr<bf16>(c), c.stride(0), p.alpha};
    if (tiles.tile0[tiles.count] == 0) return true;  // no rows
    with_pairs(ndim, [&](auto kp) {
      constexpr int kP = decltype(kp)::value;
      launch_ring(down_kernel<kP>, dim3(tiles.tile0[tiles.count]), DownLayout<kP>::kBytes, st,
                  tiles, args);
    });
    return true;
  }
  if (rank_ok(kdim)) {
    if (!make_tiles(off, groups, kRowTile, tiles)) return false;
    const UpArgs args{ptr<bf16>(a), a.stride(0), static_cast<int>(kdim), ptr<bf16>(b),
                      xwt,          ndim,        ptr<bf16>(c),           c.stride(0),
                      p.alpha,      p.beta};
    up_kernel<<<dim3(tiles.tile0[tiles.count], up_col_blocks(ndim, kColTile)), kThreads, 0, st>>>(
        tiles, args);
    MT_CUDA_LAUNCH_CHECK();
    return true;
  }
  return false;
}

bool skinny_lora_out_grads(Context& ctx, const Tensor& dout, const Tensor& offsets, const Tensor& b,
                           const Tensor& xa, float s, Tensor& dr, Tensor& db, bool s13, bool regs) {
  // dB's partial sums meet through atomics: a deterministic context keeps the separate kernels.
  if (ctx.deterministic() || !rows_ok(dout) || !rows_ok(xa) || !rows_ok(dr)) return false;
  const int64_t r = xa.dim(1), K = dout.dim(1), groups = offsets.numel() - 1;
  if (!rank_ok(r) || r > kFusedMaxRank || dr.dim(1) != r || b.dtype() != DType::BF16 ||
      !b.is_contiguous() || !aligned16(b.raw()) || b.dim(1) != K || b.dim(2) != r)
    return false;
  const bool with_db = db.defined() && db.numel() > 0;
  // dB's partial sums go in as float2 atomics: 8-byte aligned rows.
  if (with_db && (db.dtype() != DType::F32 || !db.is_contiguous() ||
                  reinterpret_cast<uintptr_t>(db.raw()) % 8 != 0))
    return false;
  // Blocks of one 128-row part through a 4-deep ring (session 13's form, s13 included): with each
  // thread's copy addresses formed once, 200 us at shape A against 245 for session 14's two 64-row
  // parts in a 3-deep ring (session 17, ncu at the running clocks; before, 238 against 257).
  regs = regs && !s13;
  const int64_t block_rows = regs ? kRbRows : kOgRows;
  thread_local Tiles tiles;
  if (!make_tiles(offsets.i32(), groups, static_cast<int>(block_rows), tiles)) return false;
  if (tiles.tile0[tiles.count] == 0) return true;  // no rows: dr is empty, dB gains nothing
  if (regs) {  // bwd_grads_regs_kernel without SwiGLU: dOut in the place of gate_up
    const SwigluBwdGradsArgs args{ptr<bf16>(dout),
                                  dout.stride(0),
                                  nullptr,
                                  0,
                                  nullptr,
                                  0,
                                  ptr<bf16>(xa),
                                  xa.stride(0),
                                  ptr<bf16>(b),
                                  K,
                                  static_cast<int>(r),
                                  nullptr,
                                  0,
                                  ptr<bf16>(dr),
                                  dr.stride(0),
                                  with_db ? ptr<float>(db) : nullptr,
                                  nullptr,
                                  s};
    const auto run = [&](auto kernel, int bytes) {
      MT_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      kernel<<<dim3(tiles.tile0[tiles.count]), kRbWarps * 32, bytes, stream(ctx)>>>(tiles, args);
      MT_CUDA_LAUNCH_CHECK();
    };
    if (r <= 16)
      run(bwd_grads_regs_kernel<1, false>, RbLayout<1>::kBytes);
    else
      run(bwd_grads_regs_kernel<2, false>, RbLayout<2>::kBytes);
    return true;
  }
  const OutGradArgs args{ptr<bf16>(dout),
                         dout.stride(0),
                         K,
                         ptr<bf16>(b),
                         ptr<bf16>(xa),
                         xa.stride(0),
                         static_cast<int>(r),
                         ptr<bf16>(dr),
                         dr.stride(0),
                         with_db ? ptr<float>(db) : nullptr,
                         s};
  const dim3 grid(tiles.tile0[tiles.count]);
  cudaStream_t st = stream(ctx);
  const auto run = [&](auto kernel, int bytes) {
    launch_ring(kernel, grid, bytes, st, tiles, args);
  };
  if (rank_pairs(r) == 1)
    run(out_grads_kernel<1>, OgLayout<1>::kBytes);
  else  // r <= kFusedMaxRank: two pairs
    run(out_grads_kernel<2>, OgLayout<2>::kBytes);
  return true;
}

bool skinny_lora_swiglu(Context& ctx, const Tensor& xa, const Tensor& offsets, const Tensor& b,
                        float s, const Tensor& gate_up, Tensor& h) {
  if (!rows_ok(xa) || !rows_ok(gate_up) || !rows_ok(h) || b.dtype() != DType::BF16 ||
      !b.is_contiguous() || !aligned16(b.raw()))
    return false;
  const int64_t r = xa.dim(1), F = h.dim(1), groups = offsets.numel() - 1;
  if (!rank_ok(r) || b.dim(1) != 2 * F || b.dim(2) != r || gate_up.dim(1) != 2 * F) return false;
  thread_local Tiles tiles;
  if (!make_tiles(offsets.i32(), groups, kRowTile, tiles)) return false;
  if (tiles.tile0[tiles.count] == 0) return true;  // no rows
  const SwigluArgs args{
      ptr<bf16>(xa),      xa.stride(0),      static_cast<int>(r), ptr<bf16>(b), F,
      ptr<bf16>(gate_up), gate_up.stride(0), ptr<bf16>(h),        h.stride(0),  s};
  const unsigned cols = up_col_blocks(F, kHalfTile);
  up_swiglu_kernel<<<dim3(tiles.tile0[tiles.count], cols), kThreads, 0, stream(ctx)>>>(tiles, args);
  MT_CUDA_LAUNCH_CHECK();
  return true;
}

bool skinny_lora_swiglu_backward(Context& ctx, const Tensor& gate_up, const Tensor& xa,
                                 const Tensor& offsets, const Tensor& b, const Tensor& dh,
                                 const Tensor& dr, const Tensor& a_down, float s,
                                 Tensor& dgate_up) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&gate_up, &xa, &dh, &dr, &dgate_up})
    if (!rows_ok(*t)) return false;
  for (const Tensor* w : {&b, &a_down})
    if (w->dtype() != DType::BF16 || !w->is_contiguous() || !aligned16(w->raw())) return false;
  const int64_t r = xa.dim(1), F = dh.dim(1), groups = offsets.numel() - 1;
  if (!rank_ok(r) || dr.dim(1) != r || b.dim(1) != 2 * F || b.dim(2) != r || a_down.dim(1) != r ||
      a_down.dim(2) != F || gate_up.dim(1) != 2 * F || dgate_up.dim(1) != 2 * F)
    return false;
  thread_local Tiles tiles;
  if (!make_tiles(offsets.i32(), groups, kRowTile, tiles)) return false;
  if (tiles.tile0[tiles.count] == 0) return true;  // no rows
  const SwigluBwdArgs args{ptr<bf16>(xa),
                           xa.stride(0),
                           ptr<bf16>(dr),
                           dr.stride(0),
                           static_cast<int>(r),
                           ptr<bf16>(b),
                           ptr<bf16>(a_down),
                           F,
                           ptr<bf16>(gate_up),
                           gate_up.stride(0),
                           ptr<bf16>(dh),
                           dh.stride(0),
                           ptr<bf16>(dgate_up),
                           dgate_up.stride(0),
                           s};
  MT_CUDA_CHECK(cudaFuncSetAttribute(up_swiglu_bwd_kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, kSwigluBwdSmem));
  up_swiglu_bwd_kernel<<<dim3(tiles.tile0[tiles.count], up_col_blocks(F, kHalfTile)), kThreads,
                         kSwigluBwdSmem, stream(ctx)>>>(tiles, args);
  MT_CUDA_LAUNCH_CHECK();
  return true;
}

bool skinny_lora_pack(Context& ctx, float s, const Tensor& a_gu, const Tensor& b_gu,
                      const Tensor& w_gu, const Tensor& a_d, const Tensor& b_d, const Tensor& w_d) {
  PackJobs jobs;
  int64_t most = 0;
  // Job 2 p: projection p's A into rows out.. of its buffer; job 2 p + 1: s B into columns in..
  const Tensor* f[2][3] = {{&a_gu, &b_gu, &w_gu}, {&a_d, &b_d, &w_d}};
  for (int proj = 0; proj < 2; ++proj) {
    const Tensor &a = *f[proj][0], &b = *f[proj][1], &w = *f[proj][2];
    if (w.dtype() != DType::BF16 || w.ndim() != 3 || w.stride(2) != 1) return false;
    const int64_t E = w.dim(0), out = w.dim(1), in = w.dim(2), r = a.dim(1);
    const int64_t gp = w.stride(0), rp = w.stride(1);
    if (gp % 8 != 0 || rp % 8 != 0 || in % 8 != 0 || r % 8 != 0 || !aligned16(w.raw()))
      return false;
    for (const Tensor* t : {&a, &b})
      if ((t->dtype() != DType::BF16 && t->dtype() != DType::F32) || !t->is_contiguous() ||
          !aligned16(t->raw()) || t->dim(0) != E)
        return false;
    if (a.dim(2) != in || b.dim(1) != out || b.dim(2) != r) return false;
    bf16* base = static_cast<bf16*>(w.raw());
    jobs.job[2 * proj] = {a.raw(), a.dtype() == DType::F32, 1.f, E * r, r,
                          in,      base + out * rp,         gp,  rp};
    jobs.job[2 * proj + 1] = {b.raw(), b.dtype() == DType::F32, s, E * out, out, r, base + in, gp,
                              rp};
    most = std::max({most, E * r * in / 8, E * out * r / 8});
  }
  if (most == 0) return true;
  if (most >= (int64_t{1} << 31)) return false;  // the kernel's 32-bit indices
  lora_pack_kernel<<<dim3(blocks_for(most, 256, 2048), 4), 256, 0, stream(ctx)>>>(jobs);
  MT_CUDA_LAUNCH_CHECK();
  return true;
}

bool skinny_lora_swiglu_bwd_grads(Context& ctx, const Tensor& gate_up, const Tensor& dh,
                                  const Tensor& offsets, const Tensor& dr_down, const Tensor& xa,
                                  const Tensor& b_gu, float s, Tensor& dgate_up, Tensor& dr_gu,
                                  Tensor& db_gu, Tensor& da_down, bool regs) {
  // dB and dA meet through atomics: a deterministic context keeps the separate kernels.
  if (ctx.deterministic()) return false;
  for (const Tensor* t :
       std::initializer_list<const Tensor*>{&gate_up, &dh, &dr_down, &xa, &dgate_up, &dr_gu})
    if (!rows_ok(*t)) return false;
  const int64_t r = xa.dim(1), F = dh.dim(1), groups = offsets.numel() - 1;
  if (!rank_ok(r) || r > kFusedMaxRank || dr_down.dim(1) != r || dr_gu.dim(1) != r ||
      gate_up.dim(1) != 2 * F || dgate_up.dim(1) != 2 * F || b_gu.dtype() != DType::BF16 ||
      !b_gu.is_contiguous() || !aligned16(b_gu.raw()) || b_gu.dim(1) != 2 * F || b_gu.dim(2) != r)
    return false;
  const auto f32_grad = [](const Tensor& g) {  // float2 atomics: 8-byte aligned, contiguous
    return g.defined() && g.numel() > 0 ? g.dtype() == DType::F32 && g.is_contiguous() &&
                                              reinterpret_cast<uintptr_t>(g.raw()) % 8 == 0
                                        : true;
  };
  if (!f32_grad(db_gu) || !f32_grad(da_down)) return false;
  if ((db_gu.defined() && db_gu.numel() > 0 && db_gu.numel() != b_gu.numel()) ||
      (da_down.defined() && da_down.numel() > 0 && da_down.numel() != b_gu.dim(0) * r * F))
    return false;
  const auto grad_ptr = [](Tensor& g) {
    return g.defined() && g.numel() > 0 ? ptr<float>(g) : nullptr;
  };
  thread_local Tiles tiles;
  if (!make_tiles(offsets.i32(), groups, regs ? kRbRows : kSbRows * kSbParts, tiles)) return false;
  if (tiles.tile0[tiles.count] == 0) return true;  // no rows
  const SwigluBwdGradsArgs args{ptr<bf16>(gate_up),  gate_up.stride(0),
                                ptr<bf16>(dh),       dh.stride(0),
                                ptr<bf16>(dr_down),  dr_down.stride(0),
                                ptr<bf16>(xa),       xa.stride(0),
                                ptr<bf16>(b_gu),     F,
                                static_cast<int>(r), ptr<bf16>(dgate_up),
                                dgate_up.stride(0),  ptr<bf16>(dr_gu),
                                dr_gu.stride(0),     grad_ptr(db_gu),
                                grad_ptr(da_down),   s};
  const dim3 grid(tiles.tile0[tiles.count]);
  if (regs) {
    const auto run = [&](auto kernel, int bytes) {
      MT_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      kernel<<<grid, kRbWarps * 32, bytes, stream(ctx)>>>(tiles, args);
      MT_CUDA_LAUNCH_CHECK();
    };
    if (r <= 16)
      run(bwd_grads_regs_kernel<1, true>, RbLayout<1>::kBytes);
    else
      run(bwd_grads_regs_kernel<2, true>, RbLayout<2>::kBytes);
    return true;
  }
  if (rank_pairs(r) == 1)
    launch_ring(swiglu_bwd_grads_kernel<1>, grid, SbLayout<1>::kBytes, stream(ctx), tiles, args);
  else
    launch_ring(swiglu_bwd_grads_kernel<2>, grid, SbLayout<2>::kBytes, stream(ctx), tiles, args);
  return true;
}

bool skinny_lora_swiglu_ha(Context& ctx, const Tensor& gate_up, const Tensor& offsets,
                           const Tensor& a_down, Tensor& h, Tensor& ha, bool regs) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&gate_up, &h, &ha})
    if (!rows_ok(*t)) return false;
  const int64_t r = ha.dim(1), F = h.dim(1), groups = offsets.numel() - 1;
  if (!rank_ok(r) || gate_up.dim(1) != 2 * F || a_down.dtype() != DType::BF16 ||
      !a_down.is_contiguous() || !aligned16(a_down.raw()) || a_down.dim(1) != r ||
      a_down.dim(2) != F)
    return false;
  thread_local Tiles tiles;
  if (!make_tiles(offsets.i32(), groups, regs ? kRegRows : kSbRows, tiles)) return false;
  if (tiles.tile0[tiles.count] == 0) return true;  // no rows
  const SwigluHaArgs args{ptr<bf16>(gate_up),  gate_up.stride(0), ptr<bf16>(a_down), F,
                          static_cast<int>(r), ptr<bf16>(h),      h.stride(0),       ptr<bf16>(ha),
                          ha.stride(0)};
  if (regs) {
    launch_ha_regs<true>(ctx, tiles, args);
    return true;
  }
  const dim3 grid(tiles.tile0[tiles.count]);
  with_pairs(r, [&](auto kp) {
    constexpr int kP = decltype(kp)::value;
    launch_ring(swiglu_ha_kernel<kP>, grid, HaLayout<kP>::kBytes, stream(ctx), tiles, args);
  });
  return true;
}

bool skinny_lora_xa(Context& ctx, const Tensor& x, const Tensor& offsets, const Tensor& a,
                    Tensor& xa) {
  if (!rows_ok(x) || !rows_ok(xa) || a.dtype() != DType::BF16 || !a.is_contiguous() ||
      !aligned16(a.raw()))
    return false;
  const int64_t r = xa.dim(1), K = x.dim(1), groups = offsets.numel() - 1;
  if (!rank_ok(r) || a.dim(1) != r || a.dim(2) != K) return false;
  thread_local Tiles tiles;
  if (!make_tiles(offsets.i32(), groups, kRegRows, tiles)) return false;
  if (tiles.tile0[tiles.count] == 0) return true;  // no rows
  const SwigluHaArgs args{
      ptr<bf16>(x), x.stride(0), ptr<bf16>(a),  K,           static_cast<int>(r),
      nullptr,      0,           ptr<bf16>(xa), xa.stride(0)};
  launch_ha_regs<false>(ctx, tiles, args);
  return true;
}

}  // namespace mt::ops::cuda
