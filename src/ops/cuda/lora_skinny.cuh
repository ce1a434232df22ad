// The skinny grouped products of expert LoRA (lora_grouped.h). Every kernel runs 128 threads (4
// warps) on bf16 tiles in shared memory fed by 16-byte loads, zero-filled past the group's rows,
// the widths and the rank, so the MMAs need no bounds of their own; results are stored only
// where they exist. The rank is padded to a multiple of 16 in shared memory (zeros), which makes
// it one or more whole mma k-steps (up) or n-tile pairs (down, dW).
//
// Blocks find their tile of rows from a table of the non-empty groups passed by value
// (__grid_constant__, read in place: a dynamically indexed by-value parameter would otherwise be
// copied to local memory), by binary search over the groups' first tiles: no host-to-device copy.
//
// This header holds what the kernels of more than one file use: lora_products.cu (down, up, dW:
// skinny_grouped_matmul), lora_out_grads.cu, lora_swiglu.cu and lora_kconcat.cu, and
// lora_registers.cuh's register-fragment kernels. Device code is compiled without -rdc, each
// .cu a whole program of its own, so the helpers its kernels share are defined here, in namespace
// skinny; each .cu keeps its kernels in an anonymous namespace.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cutlass/grouped_gemm_sm90.h"
#include "ops/cuda/lora_grouped.h"
#include "ops/cuda/mma.cuh"

namespace mt::ops::cuda::skinny {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 128;
constexpr int kRowTile = 64;   // rows of a down / up block: 4 warps x 16
constexpr int kKStage = 64;    // k per shared-memory stage of the down product
constexpr int kColTile = 128;  // output columns of an up block, wide columns of a dW block
constexpr int kLd = kSkinnyMaxRank + 8;  // a 64-wide tile's row pitch: 144 bytes, so the 8 rows
                                         // an ldmatrix reads fall in distinct banks
constexpr int kLdWide = kColTile + 8;    // a 128-wide tile's pitch (272 bytes), likewise

// The widest rank of skinny_lora_out_grads and skinny_lora_swiglu_bwd_grads, whose kernels hold
// at most two n-tile pairs.
constexpr int kFusedMaxRank = 32;  // out_grads_kernel<1> and <2>

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

inline __device__ Tile find_tile(const Tiles& t, int b) {
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
inline int rank_pairs(int64_t r) {
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

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// A row operand the kernels' 16-byte loads can read: bf16, 16-byte base, row pitch and width.
inline bool rows_ok(const Tensor& t) {
  return t.dtype() == DType::BF16 && aligned16(t.raw()) && t.stride(0) % 8 == 0 &&
         t.dim(1) % 8 == 0 && t.stride(1) == 1;
}

inline bool rank_ok(int64_t r) {
  return r > 0 && r <= kSkinnyMaxRank && r % 8 == 0;
}

// The non-empty groups of `off` in tiles of `tile_rows` rows; false when they are too many.
inline bool make_tiles(const int32_t* off, int64_t groups, int tile_rows, Tiles& t) {
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
inline unsigned up_col_blocks(int64_t n, int64_t tile) {
  const int64_t per_block = tile * kUpTilesPerBlock;
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

}  // namespace mt::ops::cuda::skinny
