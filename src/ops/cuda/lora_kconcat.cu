// The K-concatenation path's skinny kernels (ops/grouped_ffn.h, grouped_ffn_kconcat), entries in
// lora_grouped.h: the copy of the LoRA factors into the base weights' padded buffers
// (skinny_lora_pack), the SwiGLU passes joined with the adapter products beside them
// (skinny_lora_swiglu_bwd_grads, skinny_lora_swiglu_ha) and xa = X A^T (skinny_lora_xa). The
// SwiGLU entries pick between this file's staged kernels (LoraKernels::Staged) and the
// register-fragment kernels of lora_registers.cuh, which skinny_lora_xa runs alone. Shared pieces
// in lora_skinny.cuh.
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "ops/cuda/common.cuh"
#include "ops/cuda/lora_grouped.h"
#include "ops/cuda/lora_registers.cuh"
#include "ops/cuda/lora_skinny.cuh"
#include "ops/cuda/mma.cuh"

namespace mt::ops::cuda {

namespace {

using namespace skinny;

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

}  // namespace

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
