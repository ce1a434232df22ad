// skinny_lora_out_grads (lora_grouped.h): expert LoRA's two backward products that read the output
// gradient dOut, in one pass over it. The entry picks between this file's staged kernel and the
// register-fragment one (bwd_grads_regs_kernel without SwiGLU), which it takes from
// lora_registers.cuh since lora_kconcat.cu runs it too. Shared pieces in lora_skinny.cuh.
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/lora_grouped.h"
#include "ops/cuda/lora_registers.cuh"
#include "ops/cuda/lora_skinny.cuh"
#include "ops/cuda/mma.cuh"

namespace mt::ops::cuda {

namespace {

using namespace skinny;

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

}  // namespace

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

}  // namespace mt::ops::cuda
