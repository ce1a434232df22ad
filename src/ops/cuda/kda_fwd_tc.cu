// The chunked KDA's intra-chunk pass (prep) with bf16 tensor-core products, for bf16 tensors at
// chunk 64 and head dims 64 or 128 (kda_fwd_tc.h). It writes the quantities kda_chunk_prep.cu's
// CUDA-core prep writes, in the prepared block's layout (ops/kda_chunk_layout.h): normally the
// bf16 one, W, Qh, Kl, U and Kb rounded once to bf16 (computed in fp32: W and U from the fp32 Kb
// and beta v), Aqk, T, KK and gL fp32; with KdaKernels::bf16_prepared = false all fp32.
//
// One block of 8 warps per (chunk, head); G = the in-chunk cumsum of g (fp32), rows past the
// chunk's length L zero in q, k, v and beta (so G stays constant there):
//   (1) Aqk = scale q k^T e^(G_i - G_j) and KK = k k^T e^(G_i - G_j), per 16-row block p with the
//       reference R_p = G at row 16 p, as bf16 m16n8k16 MMAs of the operands q_i e^(G_i - R_p)
//       and k_j e^(R_p - G_j). G never rises along a chunk (g <= 0), so for columns j < 16 p both
//       factors are at most one: no exponential overflows however strong the decay. Inside the
//       diagonal block the column factor e^(R_p - G_j) rises up to e^range with range = max over
//       channels of R_p - G_(16 p + 15); where range <= kDiagRange (40) both factors stay normal
//       numbers in [e^-40, e^40] (no overflow, no subnormal loss; each is rounded to bf16, 2^-9
//       relative, as fla does) and the block is two more n-tiles of the same MMAs; where the decay
//       is stronger the warp sums those 136 pairs directly, one e^(G_i - G_j) <= 1 per pair and
//       channel (the form of the CUDA-core prep). A warp forms Aqk's and KK's tiles of a row
//       block together (the same exponentials), at most 3 of the 20 n-tiles.
//   (2) T = (I + diag(beta) KK)^-1: the four 16 x 16 diagonal blocks by forward substitution (a
//       warp each, a column per lane in registers), then the blocks below by the block inverse
//       of a lower triangular matrix: the corners T_10 and T_32 of the 32 x 32 halves, then
//       T_[23][01] = -T_[23][23] A_[23][01] T_[01][01] (A = diag(beta) KK); 16 x 8 column slices
//       of 16 x 16 x 16 products, fp32 on CUDA cores, a warp per slice (three barriers). The
//       diagonal blocks share a phase with the row products Qh, Kl, Kb, and beta v with T's
//       first step.
//   (3) W = T Kb and U = T (beta v): tf32 MMAs over fp32 tiles (tf32 rounds to 2^-11, below the
//       bf16 rounding of the inputs), T's zero upper blocks skipped.
// HBM per (chunk, head) at K = V = 128: reads q, k, v 48 KB (bf16) and g 32 KB (q, k and g by
// cp.async, all in flight at once); writes the prepared block, 132 KB (W, Qh, Kl, U, Kb 80 KB
// bf16, Aqk, T, KK 48 KB fp32, gL): ~212 KB, every access 4 to 16 bytes wide and coalesced into
// whole sectors.
// Shared memory: G (later Kb) 34 KB, q and k bf16 (later beta v fp32) 34 KB, KK 17 KB, T 17 KB:
// 103 KB at K = V = 128, two blocks (16 warps) per SM.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda/resources.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/kda_fwd_tc.h"
#include "ops/cuda/mma.cuh"
#include "ops/kda_chunk_layout.h"
#include "ops/kda_prep_path.h"

namespace mt::ops::cuda::kda_detail {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kC = 64;
constexpr int kThreads = 256;
constexpr int kBlockRows = 16;
constexpr float kDiagRange = 40.f;

// Shared layout (bytes) and row strides. Strides make the fragment loads conflict-free: G and
// Kb (fp32, K + 8: 8 banks per row, float2 fragment pairs), q and k (bf16, K + 8: 4 words per
// row), beta v (fp32, V + 8: tf32 B operands), KK and T (fp32, C + 4: tf32 A operands).
template <int K, int V>
struct Smem {
  static constexpr int LdG = K + 8, LdH = K + 8, LdV = V + 8, LdC = kC + 4;
  static constexpr size_t gam = 0;
  static constexpr size_t qk = gam + sizeof(float) * kC * LdG;
  static constexpr size_t kk = qk + std::max(2 * sizeof(bf16) * kC * LdH, sizeof(float) * kC * LdV);
  static constexpr size_t tm = kk + sizeof(float) * kC * LdC;
  static constexpr size_t beta = tm + sizeof(float) * kC * LdC;
  static constexpr size_t glast = beta + sizeof(float) * kC;
  static constexpr size_t bytes = glast + sizeof(float) * K;
  static_assert(qk % 16 == 0 && kk % 16 == 0 && tm % 16 == 0 && beta % 16 == 0 && glast % 16 == 0);
};

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float2 bf2(const bf16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

__device__ __forceinline__ float2& f2(float* p) {
  return *reinterpret_cast<float2*>(p);
}

__device__ __forceinline__ float4& f4(float* p) {
  return *reinterpret_cast<float4*>(p);
}

// e^x as __expf forms it (ex2 of x log2 e) where Normal, without __expf's handling of results
// below 2^-126 (it squares the ex2 of half the argument there; the ftz ex2 flushes them to zero):
// bit for bit __expf wherever x log2 e >= -126, which callers establish for a whole warp first
// (x >= kNormalArg), sparing three instructions of five per exponential.
constexpr float kNormalArg = -80.f;
template <bool Normal>
__device__ __forceinline__ float exp_(float x) {
  if constexpr (Normal) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
  } else {
    return __expf(x);
  }
}

// x rounded to tf32 as the tf32 MMAs' operand loads round it (mma::to_tf32), kept as a float:
// an operand stored so enters the MMA as its bits, without a conversion per load.
__device__ __forceinline__ float tf32_rounded(float x) {
  return __uint_as_float(mma::to_tf32(x));
}
__device__ __forceinline__ float4 tf32_rounded(const float4& v) {
  return make_float4(tf32_rounded(v.x), tf32_rounded(v.y), tf32_rounded(v.z), tf32_rounded(v.w));
}

// Eight bf16 (one 16-byte load) as floats.
__device__ __forceinline__ void unpack8(const uint4& u, float (&out)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[e]));
    out[2 * e] = f.x;
    out[2 * e + 1] = f.y;
  }
}

// Eight bf16 at p (a row's 8 elements): one 16-byte load where vec (the tensor 16-byte aligned),
// else one load each.
__device__ __forceinline__ uint4 load8(const bf16* p, bool vec) {
  if (vec) return *reinterpret_cast<const uint4*>(p);
  uint4 u;
  bf16* e = reinterpret_cast<bf16*>(&u);
#pragma unroll
  for (int j = 0; j < 8; ++j) e[j] = p[j];
  return u;
}

// Rows 0..63 of a [tokens, H, D] bf16 tensor for this chunk and head into a shared tile of row
// stride ld, zeros past L. Where vec, 16 bytes per cp.async (the caller commits and waits): every
// thread's loads are in flight at once, not one register round trip per unrolled group.
template <int D>
__device__ __forceinline__ void load_bf16_rows(const bf16* src, int64_t t0, int L, int64_t H,
                                               int64_t h, bf16* dst, int ld, bool vec) {
  constexpr int per = D / 8;
  static_assert(kC * per % kThreads == 0);
#pragma unroll
  for (int u = 0; u < kC * per / kThreads; ++u) {
    const int e = threadIdx.x + u * kThreads, i = e / per, x = (e - i * per) * 8;
    bf16* d = dst + i * ld + x;
    const bf16* s = src + ((t0 + i) * H + h) * D + x;
    if (i < L && vec)
      mma::cp_async16(d, s);
    else
      *reinterpret_cast<uint4*>(d) = i < L ? load8(s, false) : make_uint4(0, 0, 0, 0);
  }
}

// Four floats at p as the layout's element type: bf16 (8-byte aligned) or fp32 (16-byte).
__device__ __forceinline__ void store4(bf16* p, float a, float b, float c, float d) {
  *reinterpret_cast<uint2*>(p) = make_uint2(mma::pack_bf16(a, b), mma::pack_bf16(c, d));
}
__device__ __forceinline__ void store4(float* p, float a, float b, float c, float d) {
  *reinterpret_cast<float4*>(p) = make_float4(a, b, c, d);
}

// Two floats at p (4- or 8-byte aligned) as the layout's element type.
__device__ __forceinline__ void store2(bf16* p, float a, float b) {
  *reinterpret_cast<uint32_t*>(p) = mma::pack_bf16(a, b);
}
__device__ __forceinline__ void store2(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}

// Phase (1): row block p of Aqk (q rows; to global memory, scaled) and of KK (k rows; to shared
// memory), all 64 columns written (zeros above the diagonal). Both products take the same
// exponentials: the A fragments differ only in q_i or k_i times the same e^(G_i - R_p), and the
// B fragments k_j e^(R_p - G_j) are the same, so one warp forms both (half the exponentials of a
// warp per matrix). Block p has 2 p + 2 n-tiles of 8 columns with the diagonal block, 20 in all:
// warp w takes n-tiles [t0, t1) of block p, at most 3, and the warps that share a scheduler (w
// and w + 4) 5 between them. The warp that ends at the diagonal block (t1 = 2 p + 2) writes the
// zero tiles above it and, where the decay is too strong for the diagonal block's MMAs, sums its
// pairs directly. V2: where the block's exponents all stay above kNormalArg (the diagonal block's
// within kDiagRange, and R_p - G_j >= R_p - G_0 for the columns before it, G never rising), the
// exponentials skip __expf's subnormal handling (exp_), with the same results.
template <int K, int V, bool V2>
__device__ __forceinline__ void block_row_pairs(const Args& a, float* blk, const float* gam,
                                                const bf16* qs, const bf16* ks, float* kk) {
  using S = Smem<K, V>;
  constexpr int LdG = S::LdG, LdH = S::LdH, LdC = S::LdC, kMaxTiles = 3;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, gq = lane >> 2, cq = lane & 3;
  // w = 0..7: p 0 1 1 2 2 3 3 3, t0 0 0 2 0 3 0 3 6, t1 2 2 4 3 6 3 6 8 (a nibble per warp).
  const int p = (0x33322110u >> (4 * w)) & 15, t0 = (0x63030200u >> (4 * w)) & 15,
            t1 = (0x86363422u >> (4 * w)) & 15;
  const bool owner = t1 == 2 * p + 2;
  const float* R = gam + kBlockRows * p * LdG;
  float range = 0.f, reach = 0.f;  // reach: the largest G_0 - R_p (minus the smallest R_p - G_j)
  for (int x = lane; x < K; x += 32) {
    range = fmaxf(range, R[x] - gam[(kBlockRows * p + kBlockRows - 1) * LdG + x]);
    if constexpr (V2) reach = fmaxf(reach, gam[x] - R[x]);
  }
  const bool diag_mma = warp_max(range) <= kDiagRange;
  const int nts = 2 * p + (diag_mma ? 2 : 0);  // n-tiles below nts go through the MMAs
  const int i0 = kBlockRows * p + gq;
  float acc[2][kMaxTiles][4] = {};  // [q, k][the warp's n-tile]
  const auto products = [&](auto normal) {
    constexpr bool N = decltype(normal)::value;
    for (int k0 = 0; k0 < K; k0 += 16) {
      uint32_t aq[4], ak[4];
      float2 r[2];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int x = k0 + 2 * cq + 8 * hh;
        r[hh] = *reinterpret_cast<const float2*>(R + x);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int i = i0 + 8 * rr;
          const float2 gv = *reinterpret_cast<const float2*>(gam + i * LdG + x);
          const float e0 = exp_<N>(gv.x - r[hh].x), e1 = exp_<N>(gv.y - r[hh].y);
          const float2 qv = bf2(qs + i * LdH + x), kv = bf2(ks + i * LdH + x);
          aq[2 * hh + rr] = mma::pack_bf16(qv.x * e0, qv.y * e1);
          ak[2 * hh + rr] = mma::pack_bf16(kv.x * e0, kv.y * e1);
        }
      }
#pragma unroll
      for (int u = 0; u < kMaxTiles; ++u) {
        const int nt = t0 + u;
        if (nt < t1 && nt < nts) {
          const int j = 8 * nt + gq;
          uint32_t bfr[2];
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int x = k0 + 2 * cq + 8 * hh;
            const float2 gv = *reinterpret_cast<const float2*>(gam + j * LdG + x);
            const float2 kv = bf2(ks + j * LdH + x);
            bfr[hh] =
                mma::pack_bf16(kv.x * exp_<N>(r[hh].x - gv.x), kv.y * exp_<N>(r[hh].y - gv.y));
          }
          mma::mma_bf16(acc[0][u], aq, bfr);
          mma::mma_bf16(acc[1][u], ak, bfr);
        }
      }
    }
  };
  if (V2 && diag_mma && warp_max(reach) <= -kNormalArg)
    products(std::true_type{});
  else
    products(std::false_type{});
  float* aqk = blk + a.lay.Aqk();
#pragma unroll
  for (int u = 0; u < kMaxTiles; ++u) {
    const int nt = t0 + u;
    if (nt >= t1 || (nt >> 1 == p && !diag_mma)) continue;  // the direct sums write those
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int i = i0 + 8 * rr, j = 8 * nt + 2 * cq;
      const float* q = acc[0][u];
      const float* k = acc[1][u];
      f2(aqk + i * kC + j) = make_float2(j <= i ? a.scale * q[2 * rr] : 0.f,
                                         j + 1 <= i ? a.scale * q[2 * rr + 1] : 0.f);
      f2(kk + i * LdC + j) = make_float2(j < i ? k[2 * rr] : 0.f, j + 1 < i ? k[2 * rr + 1] : 0.f);
    }
  }
  if (!owner) return;
  for (int nt = t1; nt < kC / 8; ++nt)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int i = i0 + 8 * rr, j = 8 * nt + 2 * cq;
      f2(aqk + i * kC + j) = make_float2(0.f, 0.f);
      f2(kk + i * LdC + j) = make_float2(0.f, 0.f);
    }
  if (diag_mma) return;
  // Strong decay inside the block: each pair directly, lanes over channels.
  for (int which = 0; which < 2; ++which) {
    const bf16* src = which ? ks : qs;
    for (int il = 0; il < kBlockRows; ++il) {
      const int i = kBlockRows * p + il;
      for (int jl = 0; jl <= il; ++jl) {
        const int j = kBlockRows * p + jl;
        float s = 0.f;
        for (int x = lane; x < K; x += 32)
          s += __bfloat162float(src[i * LdH + x]) * __bfloat162float(ks[j * LdH + x]) *
               __expf(gam[i * LdG + x] - gam[j * LdG + x]);
        s = warp_sum(s);
        if (lane == 0) {
          if (which)
            kk[i * LdC + j] = jl < il ? s : 0.f;
          else
            aqk[i * kC + j] = a.scale * s;
        }
      }
      if (lane > il && lane < kBlockRows) {
        const int j = kBlockRows * p + lane;
        if (which)
          kk[i * LdC + j] = 0.f;
        else
          aqk[i * kC + j] = 0.f;
      }
    }
  }
}

// Phase (2), the diagonal block p of T = (I + diag(beta) KK)^-1 by forward substitution, lane c
// (and c + 16, which only repeats it) holding column c in registers: row i of the column needs
// rows < i only, so the 16 rows are a chain of one FMA and one multiply each, KK's rows broadcast
// as float4 loads (in place of a shuffle, a barrier and scalar loads per row).
__device__ __forceinline__ void diag_inverse(const float* kk, float* tm, const float* b, int p,
                                             int ld) {
  const int lane = threadIdx.x & 31, c = lane & 15;
  const float* kd = kk + kBlockRows * p * (ld + 1);
  float t[kBlockRows];
#pragma unroll
  for (int i = 0; i < kBlockRows; ++i) {
    float s = 0.f;  // t[l] is zero for l < c, so the sum may start at 0
#pragma unroll
    for (int l4 = 0; l4 < i; l4 += 4) {
      const float4 k4 = *reinterpret_cast<const float4*>(kd + i * ld + l4);
      const float kv[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (l4 + e < i) s += kv[e] * t[l4 + e];
    }
    t[i] = i == c ? 1.f : (i > c ? -b[kBlockRows * p + i] * s : 0.f);
  }
  if (lane < kBlockRows)
#pragma unroll
    for (int i = 0; i < kBlockRows; ++i) tm[(kBlockRows * p + i) * ld + kBlockRows * p + c] = t[i];
}

// acc[n] += sum_k A[r][k] B[k][c0 + n] over the 16 k of two 16 x 16 fp32 blocks in shared memory
// (row stride ld, 16-byte aligned rows), r = lane / 2, c0 = (lane & 1) NC, B pointing at the
// first of the warp's 2 NC columns: fp32 FMAs, so T keeps the precision of the substitution.
template <int NC>
__device__ __forceinline__ void mm16(float (&acc)[NC], const float* A, const float* B, int ld) {
  const int lane = threadIdx.x & 31, r = lane >> 1, c0 = (lane & 1) * NC;
#pragma unroll
  for (int k4 = 0; k4 < kBlockRows; k4 += 4) {
    const float4 a4 = *reinterpret_cast<const float4*>(A + r * ld + k4);
    const float av[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
    for (int kq = 0; kq < 4; ++kq)
#pragma unroll
      for (int n = 0; n < NC; n += 4) {
        const float4 b4 = *reinterpret_cast<const float4*>(B + (k4 + kq) * ld + c0 + n);
        acc[n] += av[kq] * b4.x;
        acc[n + 1] += av[kq] * b4.y;
        acc[n + 2] += av[kq] * b4.z;
        acc[n + 3] += av[kq] * b4.w;
      }
  }
}

// mm16's lane slice times s into D (the slice's first column).
template <int NC>
__device__ __forceinline__ void put16(float* D, int ld, const float (&v)[NC], float s) {
  const int lane = threadIdx.x & 31, r = lane >> 1, c0 = (lane & 1) * NC;
#pragma unroll
  for (int n = 0; n < NC; n += 4)
    *reinterpret_cast<float4*>(D + r * ld + c0 + n) =
        make_float4(s * v[n], s * v[n + 1], s * v[n + 2], s * v[n + 3]);
}

// mma::load_b_tf32's fragment, or where Rounded (B holds tf32_rounded values) its bits.
template <bool Rounded>
__device__ __forceinline__ void load_b(uint32_t (&b)[2], const float* B, int ldb, int k0, int n0,
                                       int lane) {
  if constexpr (Rounded) {
    const int g = lane >> 2, c = lane & 3;
    b[0] = __float_as_uint(B[(k0 + c) * ldb + n0 + g]);
    b[1] = __float_as_uint(B[(k0 + c + 4) * ldb + n0 + g]);
  } else {
    mma::load_b_tf32(b, B, ldb, k0, n0, lane);
  }
}

// A warp's 16 x 16 bf16 tile of accumulators (two m16n8 n-tiles, acc[nt][..]) to global memory
// at dst (row stride ld elements, 32-byte aligned) through the warp's 512 bytes of shared memory
// at st: one stmatrix .x4 (lanes 8 m .. 8 m + 7 address the rows of 8 x 8 block m: rows 8 (m & 1)
// + .., columns 8 (m >> 1) + ..), then each lane reads one row's 16-byte half back and stores it,
// so that every global store fills whole 32-byte sectors (the fragments' own 4-byte stores use
// half of each: 16 bytes of a row per n-tile). The halves of rows 4-7 of each 8 x 8 block swap
// places (16 bytes XOR row bit 2), so that both the stmatrix (8 rows of 32 bytes) and the read
// meet every bank once per 128 bytes. The caller separates uses of st by __syncwarp.
__device__ __forceinline__ void store_tile16_bf16(const float (&acc)[2][4], unsigned char* st,
                                                  bf16* dst, int ld) {
  const int lane = threadIdx.x & 31;
  {
    const int m = lane >> 3, row = (lane & 7) + 8 * (m & 1), half = (m >> 1) ^ ((row >> 2) & 1);
    const uint32_t addr =
        static_cast<uint32_t>(__cvta_generic_to_shared(st + 32 * row + 16 * half));
    asm volatile(
        "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
        "r"(mma::pack_bf16(acc[0][0], acc[0][1])), "r"(mma::pack_bf16(acc[0][2], acc[0][3])),
        "r"(mma::pack_bf16(acc[1][0], acc[1][1])), "r"(mma::pack_bf16(acc[1][2], acc[1][3]))
        : "memory");
  }
  __syncwarp();
  const int row = lane >> 1, half = lane & 1;
  *reinterpret_cast<uint4*>(dst + row * ld + 8 * half) =
      *reinterpret_cast<const uint4*>(st + 32 * row + 16 * (half ^ ((row >> 2) & 1)));
}

// Phase (3): W[16 mb + .., nw + ..] = T[16 mb + .., :] Kb and U[16 mb + .., nu + ..] = T[16 mb +
// .., :] (beta v) for the warp's NW and NU n-tiles, every row block, T's zero upper blocks
// skipped; each T fragment loaded once for both products, accumulated in fp32, stored as P (the
// layout's). The row blocks stay a loop: unrolled, they take the kernel past 128 registers.
// Where stage (prep v2, bf16, two n-tiles of each), the stores go through store_tile16_bf16 with
// the warp's 1 KB of shared memory at stage, W's tile in the first half, U's in the second: each
// half's reads come before the other half's __syncwarp, which comes before its next stmatrix.
// BRounded (prep v2): Kb and beta v hold tf32_rounded values, loaded as the B operands' bits (the
// same operands, two instructions fewer per element and load; T, which also goes out in fp32,
// is converted as it is loaded).
template <int NW, int NU, bool BRounded, typename P>
__device__ __forceinline__ void lower_times(const float* tm, int ldc, const float* kb, int ldk,
                                            int nw, P* wdst, int ldw, const float* bv, int ldv,
                                            int nu, P* udst, int ldu, unsigned char* stage) {
  const int lane = threadIdx.x & 31, gq = lane >> 2, cq = lane & 3;
  constexpr bool kStageable = std::is_same_v<P, bf16> && NW == 2 && NU == 2;
#pragma unroll 1
  for (int mb = 0; mb < kC / kBlockRows; ++mb) {
    float aw[NW][4] = {}, au[NU][4] = {};
#pragma unroll
    for (int k0 = 0; k0 < kBlockRows * (mb + 1); k0 += 8) {
      uint32_t af[4], bw[NW][2], bu[NU][2];
      mma::load_a_tf32<false>(af, tm, ldc, kBlockRows * mb, k0, lane);
#pragma unroll
      for (int nt = 0; nt < NW; ++nt) load_b<BRounded>(bw[nt], kb, ldk, k0, nw + 8 * nt, lane);
#pragma unroll
      for (int nt = 0; nt < NU; ++nt) load_b<BRounded>(bu[nt], bv, ldv, k0, nu + 8 * nt, lane);
#pragma unroll
      for (int nt = 0; nt < NW; ++nt) mma::mma_tf32(aw[nt], af, bw[nt]);
#pragma unroll
      for (int nt = 0; nt < NU; ++nt) mma::mma_tf32(au[nt], af, bu[nt]);
    }
    if constexpr (kStageable) {
      if (stage != nullptr) {
        store_tile16_bf16(aw, stage, wdst + kBlockRows * mb * ldw + nw, ldw);
        store_tile16_bf16(au, stage + 512, udst + kBlockRows * mb * ldu + nu, ldu);
        continue;
      }
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int i = kBlockRows * mb + gq + 8 * rr;
#pragma unroll
      for (int nt = 0; nt < NW; ++nt)
        store2(wdst + i * ldw + nw + 8 * nt + 2 * cq, aw[nt][2 * rr], aw[nt][2 * rr + 1]);
#pragma unroll
      for (int nt = 0; nt < NU; ++nt)
        store2(udst + i * ldu + nu + 8 * nt + 2 * cq, au[nt][2 * rr], au[nt][2 * rr + 1]);
    }
  }
}

// Prep v2 (KdaKernels::prep_v2): the inputs of block b (linear, chunks fastest) + `ahead` into L2,
// issued before this block's last phase (W and U). ahead is the number of blocks resident at once
// (two per SM), so that block is the one that starts about when this one ends: its load phase,
// 80 KB per block issued at once and waited for before any work, then meets L2 rather than HBM.
// Issued late so that the lines stay in L2 until then: a whole block's lifetime (~30 us at B2
// T8192) moves ~56 MB through L2, more than it holds. Each thread takes one row of q, k, v or g
// (rows of 256, 256, 256 and 512 bytes at K = V = 128: 2, 2, 2 and 4 lines).
template <int K, int V>
__device__ __forceinline__ void prefetch_block(const Args& a, const bf16* q, const bf16* k,
                                               const bf16* v, int64_t b) {
  static_assert(kThreads == 4 * kC, "a thread per (row, tensor)");
  if (b >= a.nchunks * a.H) return;
  // Launch order: chunk fastest, or head fastest in the overlapped forward (prep_tc_kernel).
  const int64_t c = a.ready ? a.corder[b / a.H] : b % a.nchunks,
                h = a.ready ? b % a.H : b / a.nchunks;
  const int i = threadIdx.x & (kC - 1), which = threadIdx.x / kC;
  if (i >= a.clen[c]) return;
  const int64_t row = (a.ct0[c] + i) * a.H + h;
  const char* p = which == 0   ? reinterpret_cast<const char*>(q + row * K)
                  : which == 1 ? reinterpret_cast<const char*>(k + row * K)
                  : which == 2 ? reinterpret_cast<const char*>(v + row * V)
                               : reinterpret_cast<const char*>(a.g + row * K);
  const int bytes = which == 3 ? 4 * K : which == 2 ? 2 * V : 2 * K;
  for (int o = 0; o < bytes; o += 128) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p + o));
}

// Backward's Delta = U - W S0 of the chunk (Args::fuse_delta, KdaKernels::fused_delta: the
// backward's prep on bf16 chunk states), at the end of its prep, in place of bwd_pre's job 0: the W
// and U the block has just stored (every thread's stores precede the barrier, so the copies find
// them, in L2) and the chunk's bf16 states, into the block's dead shared memory; bf16 m16n8k16 MMAs
// (W and S0 are both bf16: exact products, fp32 sums, as job 0's tf32 MMAs of the same values);
// warp w takes rows 16 (w mod 4) .. +15 and half of V. Delta rows past L are zero, as job 0's.
template <int K, int V>
__device__ __forceinline__ void delta_tail(const Args& a, int64_t c, int64_t h, int L,
                                           unsigned char* smem) {
  constexpr int kLdW = K + 8, kLdS = V + 8, NT = V / 16;
  static_assert(sizeof(bf16) * (kC * kLdW + K * kLdS) <= Smem<K, V>::bytes, "W and S0 fit");
  bf16* Ws = reinterpret_cast<bf16*>(smem);  // [kC][kLdW]
  bf16* Ss = Ws + kC * kLdW;                 // [K][kLdS]
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, cq = lane & 3;
  const float* blk = a.blk(c, h);
  const bf16* W = reinterpret_cast<const bf16*>(blk + a.lay.W());
  const bf16* U = reinterpret_cast<const bf16*>(blk + a.lay.U());
  const bf16* S0 = a.saved_h + (c * a.H + h) * K * V;
  __syncthreads();  // W and U stored by every thread; every shared tile dead
  for (int e = tid; e < kC * K / 8; e += kThreads) {
    const int i = e / (K / 8), x = (e - i * (K / 8)) * 8;
    mma::cp_async16(Ws + i * kLdW + x, W + i * K + x);
  }
  for (int e = tid; e < K * V / 8; e += kThreads) {
    const int x = e / (V / 8), y = (e - x * (V / 8)) * 8;
    mma::cp_async16(Ss + x * kLdS + y, S0 + x * V + y);
  }
  mma::cp_async_commit();
  const int m0 = 16 * (w & 3), n0 = (w >> 2) * (V / 2);
  float2 u[NT][2];  // the thread's U pairs, in flight under the copies
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = m0 + g + 8 * hf;
      u[nt][hf] = i < L ? bf2(U + i * V + n0 + 8 * nt + 2 * cq) : make_float2(0.f, 0.f);
    }
  mma::cp_async_wait<0>();
  __syncthreads();
  float acc[NT][4] = {};
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t af[4];
    mma::ldsm_a(af, Ws, kLdW, m0, k0, lane);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t bf[2];
      mma::load_b_kn(bf, Ss, kLdS, k0, n0 + 8 * nt, lane);
      mma::mma_bf16(acc[nt], af, bf);
    }
  }
  float* D = a.bblk(c, h) + a.lay.D();
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = m0 + g + 8 * hf, col = n0 + 8 * nt + 2 * cq;
      const float2 v = u[nt][hf];
      store2(D + i * V + col, i < L ? v.x - acc[nt][2 * hf] : 0.f,
             i < L ? v.y - acc[nt][2 * hf + 1] : 0.f);
    }
}

// Then bwd_pre's job 1 (Args::fuse_pre; after delta_tail): E = Aqk^T dO into dR's place and
// F = Qh^T dO into the chunk's dS slot, from the Aqk and Qh the block has stored (L2) and the
// chunk's dO rows (widened exactly, zero past L), with bwd_pre's tf32 MMAs over the same operands
// in the same k order (the same bits). E: warp w rows 16 (w mod 4) .., half w / 4 of V; F: tasks
// (16 rows of K, half of V), two per warp at K = 128.
template <int K, int V>
__device__ __forceinline__ void pre_tail(const Args& a, int64_t c, int64_t h, int L,
                                         unsigned char* smem) {
  constexpr int kLdA = kC + 8, kLdQ = K + 8, kLdO = V + 8, NT = V / 16;
  constexpr int kPer = kC * V / 8 / kThreads;
  static_assert(kC * V / 8 % kThreads == 0, "whole rounds of 16-byte dO loads");
  static_assert(
      sizeof(float) * (kC * kLdA + kC * kLdO) + sizeof(bf16) * kC * kLdQ <= Smem<K, V>::bytes,
      "Aqk, dO and Qh fit");
  float* As = reinterpret_cast<float*>(smem);           // [kC][kLdA]: Aqk, read transposed
  float* dOs = As + kC * kLdA;                          // [kC][kLdO]
  bf16* Qs = reinterpret_cast<bf16*>(dOs + kC * kLdO);  // [kC][kLdQ]: Qh, read transposed
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, cq = lane & 3;
  const float* blk = a.blk(c, h);
  const bf16* qh = reinterpret_cast<const bf16*>(blk + a.lay.Qh());
  __syncthreads();  // delta_tail's tiles consumed
  for (int e = tid; e < kC * kC / 4; e += kThreads) {
    const int i = e / (kC / 4), x = (e - i * (kC / 4)) * 4;
    mma::cp_async16(As + i * kLdA + x, blk + a.lay.Aqk() + i * kC + x);
  }
  for (int e = tid; e < kC * K / 8; e += kThreads) {
    const int i = e / (K / 8), x = (e - i * (K / 8)) * 8;
    mma::cp_async16(Qs + i * kLdQ + x, qh + i * K + x);
  }
  mma::cp_async_commit();
  const int64_t t0 = a.ct0[c];
  uint4 raw[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int e = tid + u * kThreads, i = e / (V / 8), y = (e - i * (V / 8)) * 8;
    raw[u] = i < L ? *reinterpret_cast<const uint4*>(a.dout + ((t0 + i) * a.H + h) * V + y)
                   : make_uint4(0u, 0u, 0u, 0u);
  }
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int e = tid + u * kThreads, i = e / (V / 8), y = (e - i * (V / 8)) * 8;
    float f[8];
    unpack8(raw[u], f);
    f4(dOs + i * kLdO + y) = make_float4(f[0], f[1], f[2], f[3]);
    f4(dOs + i * kLdO + y + 4) = make_float4(f[4], f[5], f[6], f[7]);
  }
  mma::cp_async_wait<0>();
  __syncthreads();
  const int kd = (L + 7) & ~7;
  {
    const int m0 = 16 * (w & 3), n0 = (w >> 2) * (V / 2);
    float e[NT][4] = {};
    mma::warp_mma_tf32<true, NT>(e, As, kLdA, m0, dOs, kLdO, n0, kd, lane);
    float* E = a.bblk(c, h) + a.lay.dR();
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        store2(E + (m0 + g + 8 * hf) * V + n0 + 8 * nt + 2 * cq, e[nt][2 * hf], e[nt][2 * hf + 1]);
  }
  float* F = a.dS + (c * a.H + h) * K * V;
#pragma unroll 1
  for (int t = w; t < K / 16 * 2; t += kThreads / 32) {
    const int x0 = 16 * (t >> 1), n0 = (t & 1) * (V / 2);
    float f[NT][4] = {};
    mma::warp_mma_tf32<true, NT>(f, Qs, kLdQ, x0, dOs, kLdO, n0, kd, lane);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        store2(F + (x0 + g + 8 * hf) * V + n0 + 8 * nt + 2 * cq, f[nt][2 * hf], f[nt][2 * hf + 1]);
  }
}

// Big: the element type of W, Qh, Kl, U, Kb in the layout (bf16 where half, else fp32).
// V2 (KdaKernels::prep_v2; bit for bit the same outputs): the L2 prefetch (ahead), W and U stored
// in whole sectors through shared memory, q and k read 8 bytes per lane in the row products, beta v
// stored without bank conflicts, T zeroed 16 bytes per store.
// Tail: bwd_pre's work may follow (delta_tail, pre_tail; the one-item v2 kernel only, so that the
// persistent and v1 kernels' registers stay as they were).
template <int K, int V, typename Big, bool V2, bool Tail>
__device__ __forceinline__ void prep_tc_body(const Args& a, const bf16* q, const bf16* k,
                                             const bf16* v, bool vec, int ahead, int64_t c,
                                             int64_t h, int64_t item) {
  using S = Smem<K, V>;
  constexpr int LdG = S::LdG, LdH = S::LdH, LdV = S::LdV, LdC = S::LdC;
  static_assert(K % 64 == 0 && V % 64 == 0 && K <= 128 && V <= 128, "8 warps x K/64 n-tiles");
  static_assert(S::tm - S::kk >= 1024 * kThreads / 32,
                "W and U staging: 1 KB per warp in KK's place");
  const int L = a.clen[c];
  if (L == 0) return;
  const int64_t t0 = a.ct0[c];
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  extern __shared__ __align__(16) unsigned char smem[];
  float* gam = reinterpret_cast<float*>(smem + S::gam);  // G, later Kb
  bf16* qs = reinterpret_cast<bf16*>(smem + S::qk);
  bf16* ks = qs + kC * LdH;
  float* vs = reinterpret_cast<float*>(smem + S::qk);  // beta v, once q and k are dead
  float* kk = reinterpret_cast<float*>(smem + S::kk);
  float* tm = reinterpret_cast<float*>(smem + S::tm);
  float* b = reinterpret_cast<float*>(smem + S::beta);
  float* glast = reinterpret_cast<float*>(smem + S::glast);
  float* blk = a.blk(c, h);
  const KdaChunkLayout& lay = a.lay;
  // The layout's slots of Big elements.
  const auto big_slot = [&](int64_t at) { return reinterpret_cast<Big*>(blk + at); };
  Big *const qh = big_slot(lay.Qh()), *const kl = big_slot(lay.Kl()),
             *const kbg = big_slot(lay.Kb());

  // Loads: q, k (bf16), g (fp32) by cp.async, v, beta; T starts at zero (its upper blocks stay
  // so).
  load_bf16_rows<K>(q, t0, L, a.H, h, qs, LdH, vec);
  load_bf16_rows<K>(k, t0, L, a.H, h, ks, LdH, vec);
  static_assert(kC * K / 4 % kThreads == 0);
#pragma unroll
  for (int u = 0; u < kC * K / 4 / kThreads; ++u) {
    const int e = tid + u * kThreads, i = e / (K / 4), x = (e - i * (K / 4)) * 4;
    const float* gp = a.g + ((t0 + i) * a.H + h) * K + x;
    if (i < L && vec)
      mma::cp_async16(gam + i * LdG + x, gp);
    else
      f4(gam + i * LdG + x) =
          i < L ? make_float4(gp[0], gp[1], gp[2], gp[3]) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  mma::cp_async_commit();
  // v into registers (beta v takes q's and k's place after the row products): issued with the
  // rest, its latency hides behind the cumsum and the pair products.
  constexpr int VG = kC * V / 8 / kThreads;
  uint4 vr[VG];
#pragma unroll
  for (int u = 0; u < VG; ++u) {
    const int e = tid + u * kThreads, i = e / (V / 8), x = (e - i * (V / 8)) * 8;
    vr[u] = make_uint4(0, 0, 0, 0);
    if (i < L) vr[u] = load8(v + ((t0 + i) * a.H + h) * V + x, vec);
  }
  if (tid < kC) b[tid] = tid < L ? a.beta[(t0 + tid) * a.H + h] : 0.f;
  if constexpr (V2) {
    static_assert(kC * kC / 4 % kThreads == 0);
#pragma unroll
    for (int u = 0; u < kC * kC / 4 / kThreads; ++u) {
      const int e = tid + u * kThreads;
      f4(tm + (e / (kC / 4)) * LdC + (e % (kC / 4)) * 4) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  } else {
    for (int e = tid; e < kC * kC; e += kThreads) tm[(e / kC) * LdC + e % kC] = 0.f;
  }
  mma::cp_async_wait<0>();
  __syncthreads();

  // G: parts of kC / P rows per (channel, part) summed in registers, then each part adds the
  // running total of the parts before it (the same additions in every thread, so the last row
  // of a part equals the next part's offset and G still never rises).
  {
    constexpr int P = kThreads / K, Rn = kC / P;
    const int x = tid % K, part = tid / K;
    float* col = gam + part * Rn * LdG + x;
    float vals[Rn];
    float run = 0.f;
#pragma unroll
    for (int r = 0; r < Rn; ++r) vals[r] = col[r * LdG];
#pragma unroll
    for (int r = 0; r < Rn; ++r) {
      run += vals[r];
      vals[r] = run;
      col[r * LdG] = run;
    }
    __syncthreads();
    float off = 0.f;
    for (int pp = 0; pp < part; ++pp) off += gam[((pp + 1) * Rn - 1) * LdG + x];
    __syncthreads();
    if (part > 0)
#pragma unroll
      for (int r = 0; r < Rn; ++r) col[r * LdG] = vals[r] + off;
  }
  __syncthreads();

  // V2: rows_normal where every G_L >= kNormalArg, so that the row products' exponents, G_i >=
  // G_L and G_L - G_i >= G_L (G never rises from G_0 = g_0 <= 0), need no subnormal handling.
  bool rows_normal = true;
  for (int x = tid; x < K; x += kThreads) {
    const float gl = gam[(L - 1) * LdG + x];
    glast[x] = gl;
    blk[lay.gL() + x] = __expf(gl);
    rows_normal = rows_normal && gl >= kNormalArg;
  }
  block_row_pairs<K, V, V2>(a, blk, gam, qs, ks, kk);
  if constexpr (V2)
    rows_normal = __syncthreads_and(rows_normal);
  else
    __syncthreads();

  // T's diagonal blocks (warps 0-3, one each) while warps 4-7 copy KK out, then the row
  // products Qh, Kl, Kb (Kb also replaces G in place for W), four channels per thread: the
  // substitution's FMA chains overlap the products' exponentials on the same schedulers (they
  // share no shared memory but beta, which both only read).
  if (w < 4) {
    diag_inverse(kk, tm, b, w, LdC);
  } else if (a.keep_block) {
    for (int e = tid - 128; e < kC * kC / 4; e += kThreads - 128) {
      const int i = e / (kC / 4), x = (e - i * (kC / 4)) * 4;
      f4(blk + lay.KK() + i * kC + x) = f4(kk + i * LdC + x);
    }
  }
  const auto row_products = [&](auto normal) {
    constexpr bool N = decltype(normal)::value;
    for (int e = tid; e < kC * K / 4; e += kThreads) {
      const int i = e / (K / 4), x = (e - i * (K / 4)) * 4;
      const float4 gv = f4(gam + i * LdG + x), gl = f4(glast + x);
      float2 q01, q23, k01, k23;
      if constexpr (V2) {
        // One 8-byte load each: two 4-byte loads at a lane stride of 8 bytes meet each bank twice.
        const uint2 qv = *reinterpret_cast<const uint2*>(qs + i * LdH + x),
                    kv = *reinterpret_cast<const uint2*>(ks + i * LdH + x);
        q01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&qv.x));
        q23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&qv.y));
        k01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&kv.x));
        k23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&kv.y));
      } else {
        q01 = bf2(qs + i * LdH + x);
        q23 = bf2(qs + i * LdH + x + 2);
        k01 = bf2(ks + i * LdH + x);
        k23 = bf2(ks + i * LdH + x + 2);
      }
      const float e0 = exp_<N>(gv.x), e1 = exp_<N>(gv.y), e2 = exp_<N>(gv.z), e3 = exp_<N>(gv.w);
      const float s = a.scale, bi = b[i];
      store4(qh + i * K + x, s * q01.x * e0, s * q01.y * e1, s * q23.x * e2, s * q23.y * e3);
      store4(kl + i * K + x, k01.x * exp_<N>(gl.x - gv.x), k01.y * exp_<N>(gl.y - gv.y),
             k23.x * exp_<N>(gl.z - gv.z), k23.y * exp_<N>(gl.w - gv.w));
      const float4 kb =
          make_float4(bi * k01.x * e0, bi * k01.y * e1, bi * k23.x * e2, bi * k23.y * e3);
      if (a.keep_block) store4(kbg + i * K + x, kb.x, kb.y, kb.z, kb.w);
      f4(gam + i * LdG + x) = V2 ? tf32_rounded(kb) : kb;  // V2: W's B operand, rounded once
    }
  };
  if (V2 && rows_normal)
    row_products(std::true_type{});
  else
    row_products(std::false_type{});
  __syncthreads();

  // T's blocks below the diagonal by the inverse of a block lower triangular matrix,
  // [[L1, 0], [B, L2]]^-1 = [[L1^-1, 0], [-L2^-1 B L1^-1, L2^-1]], with A = diag(beta) KK: first
  // the corners of the two 32 x 32 diagonal halves, T_10 = -T_11 A_10 T_00 and T_32 = -T_33 A_32
  // T_22, then Y = A_[23][01] T_[01][01] and T_[23][01] = -T_[23][23] Y. Each warp takes 8
  // columns of a 16 x 16 block, and a column slice of each product reads only the same columns
  // of the blocks it builds on, so a warp's consecutive steps need only __syncwarp: three barriers
  // after the diagonal blocks' (shared with the row products) in place of nine, and fp32 FMAs over
  // registers and broadcast float4 loads in place of dot products of two scalar shared loads each
  // (the same fp32 arithmetic, in another order).
  {
    constexpr int R = kBlockRows, NC = 4;
    const int hf = w & 1, r = lane >> 1;
    const auto slice = [&](int rb, int cb) { return tm + R * rb * LdC + R * cb + 8 * hf; };
    const auto tblk = [&](int rb, int cb) { return tm + R * rb * LdC + R * cb; };
    const auto kblk = [&](int rb, int cb) { return kk + R * rb * LdC + R * cb; };
    float part[NC] = {};
    if (w < 4) {
      // T_p,p-1 with p = 1 (warps 0, 1) or 3 (warps 2, 3); X = A_p,p-1 T_p-1,p-1 in its slot.
      const int p = w < 2 ? 1 : 3;
      float x[NC] = {}, t[NC] = {};
      mm16<NC>(x, kblk(p, p - 1), slice(p - 1, p - 1), LdC);
      put16<NC>(slice(p, p - 1), LdC, x, b[R * p + r]);
      __syncwarp();
      mm16<NC>(t, tblk(p, p), slice(p, p - 1), LdC);
      __syncwarp();
      put16<NC>(slice(p, p - 1), LdC, t, -1.f);
    } else {
      // Y_p1 = A_p1 T_11 whole, and KK_p0 T_00 of Y_p0 kept, p = 2 (warps 4, 5) or 3 (6, 7).
      const int p = w < 6 ? 2 : 3;
      float y[NC] = {};
      mm16<NC>(y, kblk(p, 1), slice(1, 1), LdC);
      put16<NC>(slice(p, 1), LdC, y, b[R * p + r]);
      mm16<NC>(part, kblk(p, 0), slice(0, 0), LdC);
    }
    // q and k are dead: beta v takes their place (the T steps touch neither).
#pragma unroll
    for (int u = 0; u < VG; ++u) {
      const int e = tid + u * kThreads, i = e / (V / 8), x = (e - i * (V / 8)) * 8;
      float f[8];
      unpack8(vr[u], f);
      const float bi = b[i];
      float4 lo = make_float4(bi * f[0], bi * f[1], bi * f[2], bi * f[3]),
             hi = make_float4(bi * f[4], bi * f[5], bi * f[6], bi * f[7]);
      if constexpr (V2) {
        // Lane l's halves start at banks 8 l and 8 l + 4 (mod 32), the next row's 8 further:
        // lower halves first, the warp's 32 float4 meet 4 of the 8 bank quads 8 times (8
        // wavefronts for 512 bytes); lanes with bit 2 set store their upper half first, so each
        // store meets every quad 4 times (4 wavefronts).
        // U's B operand, rounded once (lower_times).
        lo = tf32_rounded(lo);
        hi = tf32_rounded(hi);
        const bool swap = (tid >> 2) & 1;
        f4(vs + i * LdV + x + (swap ? 4 : 0)) = swap ? hi : lo;
        f4(vs + i * LdV + x + (swap ? 0 : 4)) = swap ? lo : hi;
      } else {
        f4(vs + i * LdV + x) = lo;
        f4(vs + i * LdV + x + 4) = hi;
      }
    }
    __syncthreads();
    if (w >= 4) {
      // Y_p0 = A_p0 T_00 + A_p1 T_10, T_10 final now.
      const int p = w < 6 ? 2 : 3;
      mm16<NC>(part, kblk(p, 1), slice(1, 0), LdC);
      put16<NC>(slice(p, 0), LdC, part, b[R * p + r]);
    } else if (a.keep_block) {
      // Meanwhile T's first 32 rows, final now, go out.
      for (int e = tid; e < kC * kC / 8; e += kThreads / 2) {
        const int i = e / (kC / 4), x = (e - i * (kC / 4)) * 4;
        f4(blk + lay.Tm() + i * kC + x) = f4(tm + i * LdC + x);
      }
    }
    __syncthreads();
    if (w < 4) {
      // T_2c = -T_22 Y_2c and T_3c = -(T_32 Y_2c + T_33 Y_3c), c = 0 (warps 0, 1) or 1 (2, 3),
      // written over the warp's own slices of Y once it has read them.
      const int cb = w >> 1;
      float t2[NC] = {}, t3[NC] = {};
      mm16<NC>(t2, tblk(2, 2), slice(2, cb), LdC);
      mm16<NC>(t3, tblk(3, 2), slice(2, cb), LdC);
      mm16<NC>(t3, tblk(3, 3), slice(3, cb), LdC);
      __syncwarp();
      put16<NC>(slice(2, cb), LdC, t2, -1.f);
      put16<NC>(slice(3, cb), LdC, t3, -1.f);
    }
    __syncthreads();
  }

  if (ahead > 0) prefetch_block<K, V>(a, q, k, v, item + ahead);
  // W = T Kb and U = T beta v (warp w: its n-tiles of both), T's last 32 rows out.
  // KK's shared copy is dead by now (its global copy went out with T's diagonal blocks): the
  // warps' staging for W and U.
  lower_times<K / 64, V / 64, V2>(tm, LdC, gam, LdG, w * K / 8, big_slot(lay.W()), K, vs, LdV,
                                  w * V / 8, big_slot(lay.U()), V,
                                  V2 ? smem + S::kk + 1024 * w : nullptr);
  if (!a.keep_block) return;
  for (int e = kC * kC / 8 + tid; e < kC * kC / 4; e += kThreads) {
    const int i = e / (kC / 4), x = (e - i * (kC / 4)) * 4;
    f4(blk + lay.Tm() + i * kC + x) = f4(tm + i * LdC + x);
  }
  if constexpr (Tail && V2 && std::is_same_v<Big, bf16>) {
    if (a.fuse_delta) delta_tail<K, V>(a, c, h, L, smem);
    if (a.fuse_pre) pre_tail<K, V>(a, c, h, L, smem);
  }
}

// A block per (chunk, head), blockIdx (x, y) = (chunk, head); or, in the overlapped forward
// (a.ready, kda_forward_overlap), a persistent grid that walks the (chunk, head) items in chunk
// order across all heads (item b: chunk corder[b / H], head b % H: the documents longest first,
// as the state pass takes them; a block takes b, b + gridDim.x, ...),
// the order in which the state pass launched after it waits for them, flagging each item done.
// Its blocks first let that state pass launch (griddepcontrol.launch_dependents: a programmatic
// dependent launch, which then takes the slots this grid leaves free). Nothing here waits for the
// state pass, so where the two cannot run at once (tools that serialise kernels) the prep simply
// finishes first. Every thread's stores precede the barrier, and thread 0's fence makes them
// visible at GPU scope before the flag (the state pass reads it with ld.acquire and issues its
// copies after a barrier of its own); the barrier also frees the shared memory for the next item.
// Persist: the overlapped forward's form (its own instantiation, so that the loop's registers do
// not touch the one-item kernel's allocation).
template <int K, int V, typename Big, bool V2, bool Persist = false>
__global__ void __launch_bounds__(kThreads, 2)
    prep_tc_kernel(Args a, const bf16* q, const bf16* k, const bf16* v, bool vec, int ahead) {
  if constexpr (!Persist) {
    prep_tc_body<K, V, Big, V2, true>(a, q, k, v, vec, ahead, blockIdx.x, blockIdx.y,
                                      blockIdx.x + a.nchunks * blockIdx.y);
  } else {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    for (int64_t b = blockIdx.x; b < a.nchunks * a.H; b += gridDim.x) {
      const int64_t c = a.corder[b / a.H], h = b % a.H;
      prep_tc_body<K, V, Big, V2, false>(a, q, k, v, vec, ahead, c, h, b);
      __syncthreads();
      if (threadIdx.x == 0)
        asm volatile(
            "fence.acq_rel.gpu;\n"
            "st.relaxed.gpu.global.b32 [%0], %1;\n" ::"l"(a.ready + h * a.nchunks + c),
            "r"(1)
            : "memory");
    }
  }
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

template <int K, int V>
void launch(Context& ctx, const Args& a, const bf16* q, const bf16* k, const bf16* v, int blocks) {
  const bool vec = aligned16(q) && aligned16(k) && aligned16(v) && aligned16(a.g);
  // Two blocks per SM (the launch bounds and 103 KB of shared memory at K = V = 128). The
  // overlapped forward's persistent grid: `blocks`, at most one per item.
  const dim3 grid = a.ready
                        ? dim3(static_cast<unsigned>(std::min<int64_t>(blocks, a.nchunks * a.H)))
                        : dim3(static_cast<unsigned>(a.nchunks), static_cast<unsigned>(a.H));
  const bool v2 = a.kernels.prep_v2;
  // The block that starts about when this one ends: two per SM later in launch order, or the
  // persistent block's own next item.
  const int ahead = !v2       ? 0
                    : a.ready ? static_cast<int>(grid.x)
                              : 2 * cuda_resources(ctx).multiprocessors;
  const auto go = [&](auto* kernel) {
    kernel<<<grid, kThreads, smem_for(kernel, Smem<K, V>::bytes, "kda_forward"), stream(ctx)>>>(
        a, q, k, v, vec, ahead);
  };
  MT_CHECK((!a.fuse_delta || (a.lay.half && a.saved_h && !a.ready && a.kernels.prep_v2)) &&
               (!a.fuse_pre || (a.fuse_delta && a.dout && aligned16(a.dout))),
           InternalError,
           "kda tensor-core prep: backward's Delta needs the bf16 layout and states, one item a "
           "block");
  if (a.ready) {
    MT_CHECK(a.lay.half, InternalError, "kda tensor-core prep: the overlap takes the bf16 layout");
    v2 ? go(prep_tc_kernel<K, V, bf16, true, true>) : go(prep_tc_kernel<K, V, bf16, false, true>);
  } else if (a.lay.half)
    v2 ? go(prep_tc_kernel<K, V, bf16, true>) : go(prep_tc_kernel<K, V, bf16, false>);
  else
    v2 ? go(prep_tc_kernel<K, V, float, true>) : go(prep_tc_kernel<K, V, float, false>);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace

void prep_tc(Context& ctx, const Args& a, const bf16* q, const bf16* k, const bf16* v, int blocks) {
  MT_CHECK(a.C == kC && aligned16(a.ws), ValueError,
           "kda tensor-core prep: chunk 64 with 16-byte aligned blocks (chunk ", a.C, ")");
  MT_CHECK(!a.ready || blocks > 0, InternalError,
           "kda tensor-core prep: the overlapped forward's grid is empty");
  if (a.K == 64 && a.V == 64) return launch<64, 64>(ctx, a, q, k, v, blocks);
  if (a.K == 64 && a.V == 128) return launch<64, 128>(ctx, a, q, k, v, blocks);
  if (a.K == 128 && a.V == 64) return launch<128, 64>(ctx, a, q, k, v, blocks);
  MT_CHECK(a.K == 128 && a.V == 128, ValueError, "kda tensor-core prep: head_k ", a.K, " head_v ",
           a.V, " (the tensor-core path admits 64 and 128)");
  launch<128, 128>(ctx, a, q, k, v, blocks);
}

}  // namespace mt::ops::cuda::kda_detail
