// The down, up and dW products of skinny_grouped_matmul (lora_grouped.h): the grouped_matmul calls
// of expert LoRA whose one dimension is the rank. The conventions they share with the other skinny
// kernels, and the pieces of them, are in lora_skinny.cuh.
#include <algorithm>
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/lora_grouped.h"
#include "ops/cuda/lora_skinny.cuh"
#include "ops/cuda/mma.cuh"

namespace mt::ops::cuda {

namespace {

using namespace skinny;

constexpr int kDwRows = 32;    // rows per shared-memory stage of the dW product
constexpr int kDwChunk = 512;  // rows of a group per dW block outside deterministic mode

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

unsigned col_blocks(int64_t n) {
  return static_cast<unsigned>((n + kColTile - 1) / kColTile);
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

}  // namespace mt::ops::cuda
