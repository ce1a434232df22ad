// The register-fragment kernels of the skinny LoRA products (LoraKernels::Registers; shared pieces
// in lora_skinny.cuh): swiglu_ha_regs_kernel and bwd_grads_regs_kernel, and the argument blocks
// they share with the staged kernels. They are in a header because the entries that run them pick
// between them and a staged kernel of their own file: skinny_lora_out_grads (lora_out_grads.cu)
// runs bwd_grads_regs_kernel without SwiGLU, skinny_lora_swiglu_bwd_grads, skinny_lora_swiglu_ha
// and skinny_lora_xa (lora_kconcat.cu) the rest. Each file instantiates the kernels it launches;
// the kernels are static so that each file's instantiations stay its own (two files launching one
// instantiation of an external kernel would share one host stub, registered by both modules).
#pragma once

#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/lora_skinny.cuh"
#include "ops/cuda/mma.cuh"

namespace mt::ops::cuda::skinny {

// swiglu_bwd_grads_kernel's arguments (lora_kconcat.cu), also bwd_grads_regs_kernel's below.
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

// swiglu_ha_kernel's arguments (lora_kconcat.cu), also swiglu_ha_regs_kernel's below.
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
static __global__ void __launch_bounds__(kRegWarps * 32, kNT <= 2 ? 3 : 1)
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
static __global__ void __launch_bounds__(kRbWarps * 32, kSwiglu || kMT > 1 ? 2 : 3)
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

// swiglu_ha_regs_kernel for the rank args.r (a multiple of 8 up to 64), over 16-row tiles.
template <bool kSwiglu>
static void launch_ha_regs(Context& ctx, const Tiles& tiles, const SwigluHaArgs& args) {
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

}  // namespace mt::ops::cuda::skinny
