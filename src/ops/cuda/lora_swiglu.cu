// The gate/up projection's adapter term joined with SwiGLU, forward and backward
// (skinny_lora_swiglu, skinny_lora_swiglu_backward in lora_grouped.h): the separate-pass form of
// expert LoRA, where the base GEMM writes gate_up without the adapter. Its kernels are up products
// (lora_products.cu's up_kernel) with SwiGLU on their output tiles; the pieces they share with it
// are in lora_skinny.cuh. The K-concatenation path's SwiGLU kernels are in lora_kconcat.cu.
#include <cstdint>
#include <initializer_list>

#include "ops/cuda/common.cuh"
#include "ops/cuda/lora_grouped.h"
#include "ops/cuda/lora_skinny.cuh"
#include "ops/cuda/mma.cuh"

namespace mt::ops::cuda {

namespace {

using namespace skinny;

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

}  // namespace

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

}  // namespace mt::ops::cuda
