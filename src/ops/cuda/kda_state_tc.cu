// The chunked KDA's state passes on tensor cores, for bf16 tensors (kda_state_tc.h). The
// algorithm and the prepared blocks are kda_chunk.cu's; only the state passes change.
//
// What is sequential is the recurrence alone; everything that does not depend on the carried
// state leaves the sequential kernels:
//   forward:  per (document, head, 16 or 32 columns), chunk after chunk: Delta = U - W S0 and
//             S = diag(gL) S0 + Kl^T Delta; S0 goes to `saved`; the chunk's output columns
//             o = Qh S0 + Aqk Delta are formed in the same step from the S0 and Delta tiles the
//             block holds anyway (independent of the recurrence, their MMAs interleave with the
//             state update's; no Delta round trip through HBM, no second pass re-reading S0).
//   backward: (1) per (chunk, head, 64 columns), in parallel: Delta = U - W S0 into D,
//             E = Aqk^T dO into dR's place and F = Qh^T dO into the chunk's dS slot;
//             (2) per (document, head, 16 columns), in reverse: dDelta = E + Kl dS,
//             dR = T^T dDelta, dS = diag(gL) dS + F - Kb^T dR; each chunk's outgoing dS replaces
//             F in its slot, dR replaces E.
// Every product is a warp-level tf32 MMA (mma.cuh) over tiles in shared memory: tf32's rounding
// (2^-11) stays below the bf16 rounding of every input and output (2^-9). W, Qh, Kl, U and Kb are
// fp32 or, with the prepared block's bf16 layout (ops/kda_chunk_layout.h), bf16 (E below; exact
// in tf32, and half the bytes to stage); T, Aqk, the states, Delta, dR and dO stay fp32. The state
// is carried in the MMA accumulators (fp32) of the warp that owns its rows, and copied to shared
// memory once per chunk as the B operand of W S0 / Kl dS. The sequential kernels stage the next
// chunk's W, Kl, T, Kb through cp.async as soon as the current chunk is done with each (one buffer
// each: two blocks of 4 warps then fit per SM, and 16-column blocks give 8 per head: the grid fills
// the GPU with one document of 32 heads).
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/index_lists.cuh"
#include "ops/cuda/kda_state_tc.h"
#include "ops/cuda/mma.cuh"

namespace mt::ops::cuda::kda_detail {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kC = 64;   // chunk
constexpr int kK = 128;  // largest head_k, head_v
constexpr int kNB = 16;  // state columns per block of the sequential passes
constexpr int kNO = 64;  // columns per block of the parallel passes
constexpr int kThreads = 128;
// Shared row strides (floats) that make mma.cuh's fragment loads conflict-free and keep rows
// 16-byte aligned for cp.async: row-major A operands over C columns, transposed A operands whose
// rows run over C, and B operands of kNB or kNO columns (the prepared operands over K: OpLd).
constexpr int kLdRowC = kC + 4, kLdTrC = kC + 8;
constexpr int kLdNB = kNB + 8, kLdNO = kNO + 8;

// rows x cols elements (fp32 or bf16; cols a multiple of 16 bytes, rows of the source gld apart)
// into a shared tile of row stride sld, 16 bytes per cp.async (complete at the caller's
// cp_async_wait).
template <typename E>
__device__ __forceinline__ void stage(E* dst, int sld, const E* src, int64_t gld, int rows,
                                      int cols) {
  constexpr int kPer16 = 16 / sizeof(E);
  const int per = cols / kPer16;
  for (int e = threadIdx.x; e < rows * per; e += kThreads) {
    const int r = e / per, q = (e - r * per) * kPer16;
    mma::cp_async16(dst + r * sld + q, src + r * gld + q);
  }
}

// Shared row strides (elements) of the prepared operands W, Qh, Kl, Kb (fp32 or bf16 E):
// row-major A operands and transposed ones (mma.cuh's conflict-free conditions; rows 16-byte
// aligned for cp.async).
template <typename E>
struct OpLd {
  static constexpr int row = sizeof(E) == 4 ? kK + 4 : kK + 8;
  static constexpr int tr = kK + 8;
};

// A prepared operand of the block (its layout's slot at `at`) as E.
template <typename E>
__device__ __forceinline__ const E* slot(const float* blk, int64_t at) {
  return reinterpret_cast<const E*>(blk + at);
}

__device__ __forceinline__ float2 ld2(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}
__device__ __forceinline__ float2 ld2(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

// The accumulator tile acc[NT][4] of rows m0 .. m0+15: f(row, col, acc element pair) for its
// two rows, columns 8 nt + 2c (and + 1).
template <int NT, typename F>
__device__ __forceinline__ void for_pairs(float (&acc)[NT][4], int m0, int lane, F f) {
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    f(m0 + g, 8 * nt + 2 * c, acc[nt][0], acc[nt][1]);
    f(m0 + g + 8, 8 * nt + 2 * c, acc[nt][2], acc[nt][3]);
  }
}

// for_pairs over the warp's state m-tiles that lie below K (rows 16 (w + 4 mt) + ...).
template <int NT, typename F>
__device__ __forceinline__ void for_state_pairs(float (&s)[2][NT][4], int K, int lane, F f) {
  const int w = threadIdx.x >> 5;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
    if (16 * (w + 4 * mt) < K) for_pairs(s[mt], 16 * (w + 4 * mt), lane, f);
}

__device__ __forceinline__ float2* at2(float* p) {
  return reinterpret_cast<float2*>(p);
}
__device__ __forceinline__ const float2* at2(const float* p) {
  return reinterpret_cast<const float2*>(p);
}

// The state tile a warp of the sequential passes carries (rows 16 (w + 4 mt) + ..., kNB columns)
// to dst, or else from src (zeros where src is null), [K][V] states whose column block starts
// there.
template <int NT>
__device__ __forceinline__ void state_io(float (&s)[2][NT][4], const float* src, float* dst, int K,
                                         int V) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const int x0 = 16 * (w + 4 * mt);
    for_pairs(s[mt], x0, lane, [&](int x, int col, float& s0, float& s1) {
      if (dst) {
        if (x0 < K) *at2(dst + x * V + col) = make_float2(s0, s1);
        return;
      }
      const float2 v = src && x0 < K ? *at2(src + x * V + col) : make_float2(0.f, 0.f);
      s0 = v.x;
      s1 = v.y;
    });
  }
}

// Shared bytes of the forward state pass: W, Kl and Qh (E), U's NB columns (E), then Aqk, gL,
// S0 and Delta (fp32).
template <int NB, typename E>
constexpr size_t fwd_state_smem() {
  return sizeof(E) * (kC * OpLd<E>::row + 2 * kC * OpLd<E>::tr + kC * NB) +
         sizeof(float) * (kC * kLdRowC + kK + (kK + kC) * (NB + 8));
}

// NB = kNB state columns per block, or twice that where kNB-column blocks would not all fit on
// the GPU at once (forward_state_tc): each step of the chain then does twice the MMAs but the
// chain runs in one wave instead of two, and reads W, Kl and Qh half as often. E: the prepared
// operands' type (the layout's). Two cp.async groups per chunk: W and U (free once Delta is
// formed), then Kl, gL, Qh and Aqk (free once the state and the output are).
template <int NB, typename E>
__global__ void __launch_bounds__(kThreads, 2) fwd_state_tc_kernel(Args a, bf16* o) {
  static_assert(NB % 8 == 0 && (NB + 8) % 32 % 16 == 8, "B operands of NB / 8 n-tiles");
  constexpr int NT = NB / 8, kLdB = NB + 8, kLdW = OpLd<E>::row, kLdKl = OpLd<E>::tr,
                kLdQ = OpLd<E>::row;
  const int64_t n = blockIdx.x, h = blockIdx.y, H = a.H;
  const int col0 = blockIdx.z * NB, K = a.K, V = a.V, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  extern __shared__ __align__(16) unsigned char smem[];
  E* Ws = reinterpret_cast<E*>(smem);                  // [kC][kLdW]
  E* Kls = Ws + kC * kLdW;                             // [kC][kLdKl]
  E* Qs = Kls + kC * kLdKl;                            // [kC][kLdQ]
  E* Us = Qs + kC * kLdQ;                              // [kC][NB]
  float* As = reinterpret_cast<float*>(Us + kC * NB);  // [kC][kLdRowC]
  float* gLs = As + kC * kLdRowC;                      // [kK]
  float* Ss = gLs + kK;                                // [kK][kLdB]
  float* Ds = Ss + kK * kLdB;                          // [kC][kLdB]
  const KdaChunkLayout& lay = a.lay;
  // The warp's state rows: m-tiles w and w + 4 (those below K).
  float s[2][NT][4];
  state_io(s, a.h0 ? a.h0 + (n * H + h) * K * V + col0 : nullptr, nullptr, K, V);
  const int64_t cb = a.dchunk0[n], ce = a.dchunk0[n + 1];
  const auto stage_w = [&](int64_t c) {
    const float* blk = a.blk(c, h);
    stage(Ws, kLdW, slot<E>(blk, lay.W()), K, kC, K);
    stage(Us, NB, slot<E>(blk, lay.U()) + col0, V, kC, NB);
  };
  const auto stage_kl = [&](int64_t c) {
    const float* blk = a.blk(c, h);
    stage(Kls, kLdKl, slot<E>(blk, lay.Kl()), K, kC, K);
    stage(gLs, 0, blk + lay.gL(), 0, 1, K);
    stage(Qs, kLdQ, slot<E>(blk, lay.Qh()), K, kC, K);
    stage(As, kLdRowC, blk + lay.Aqk(), kC, kC, kC);
  };
  if (cb < ce) stage_w(cb);
  mma::cp_async_commit();
  if (cb < ce) stage_kl(cb);
  mma::cp_async_commit();
  for (int64_t c = cb; c < ce; ++c) {
    const int L = a.clen[c], kd = (L + 7) & ~7;
    // S entering the chunk: kept for backward, and the B operand of W S0 and Qh S0.
    float* sv = a.saved + (c * H + h) * K * V + col0;
    for_state_pairs(s, K, lane, [&](int x, int col, float& s0, float& s1) {
      *at2(Ss + x * kLdB + col) = make_float2(s0, s1);
      if (a.keep) *at2(sv + x * V + col) = make_float2(s0, s1);
    });
    mma::cp_async_wait<1>();  // W, U of this chunk
    __syncthreads();
    // Delta = U - W S0, rows 16 w .. 16 w + 15 (zero past L).
    float d[NT][4] = {};
    mma::warp_mma_tf32<false, NT>(d, Ws, kLdW, 16 * w, Ss, kLdB, 0, K, lane);
    for_pairs(d, 16 * w, lane, [&](int i, int col, float& d0, float& d1) {
      const float2 u = ld2(Us + i * NB + col);
      *at2(Ds + i * kLdB + col) = i < L ? make_float2(u.x - d0, u.y - d1) : make_float2(0.f, 0.f);
    });
    __syncthreads();  // Delta complete; W and U free
    if (c + 1 < ce) stage_w(c + 1);
    mma::cp_async_commit();
    mma::cp_async_wait<1>();  // Kl, gL, Qh, Aqk of this chunk
    __syncthreads();
    // S = diag(gL) S0 + Kl^T Delta.
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int x0 = 16 * (w + 4 * mt);
      if (x0 >= K) continue;
      for_pairs(s[mt], x0, lane, [&](int x, int, float& s0, float& s1) {
        s0 *= gLs[x];
        s1 *= gLs[x];
      });
      mma::warp_mma_tf32<true, NT>(s[mt], Kls, kLdKl, x0, Ds, kLdB, 0, kd, lane);
    }
    // o = Qh S0 + Aqk Delta, rows 16 w .. 16 w + 15 of the block's columns (Ss still holds S0).
    {
      float acc[NT][4] = {};
      mma::warp_mma_tf32<false, NT>(acc, Qs, kLdQ, 16 * w, Ss, kLdB, 0, K, lane);
      mma::warp_mma_tf32<false, NT>(acc, As, kLdRowC, 16 * w, Ds, kLdB, 0, kd, lane);
      const int64_t t0 = a.ct0[c];
      for_pairs(acc, 16 * w, lane, [&](int i, int col, float& o0, float& o1) {
        if (i < L)
          *reinterpret_cast<__nv_bfloat162*>(o + ((t0 + i) * H + h) * V + col0 + col) =
              __floats2bfloat162_rn(o0, o1);
      });
    }
    __syncthreads();  // Kl, gL, Qh, Aqk, S0 and Delta free
    if (c + 1 < ce) stage_kl(c + 1);
    mma::cp_async_commit();
  }
  if (a.hT) state_io(s, nullptr, a.hT + (n * H + h) * K * V + col0, K, V);
}

template <typename E>
constexpr size_t pre_smem() {
  return std::max(sizeof(E) * kC * OpLd<E>::row + sizeof(float) * kK * kLdNO,
                  sizeof(float) * (kC * kLdTrC + kC * kLdNO) + sizeof(E) * kC * OpLd<E>::tr);
}

// Backward's products that do not depend on dS, per (chunk, head, 64 columns): job 0 (even z)
// Delta = U - W S0 into D; job 1 (odd z) E = Aqk^T dO into dR and F = Qh^T dO into the dS slot.
template <typename E>
__global__ void __launch_bounds__(kThreads) bwd_pre_tc_kernel(Args a, const bf16* dout) {
  const int64_t c = blockIdx.x, h = blockIdx.y, H = a.H;
  const int L = a.clen[c];
  if (L == 0) return;
  const int job = blockIdx.z & 1, col0 = (blockIdx.z >> 1) * kNO, K = a.K, V = a.V,
            lane = threadIdx.x & 31, w = threadIdx.x >> 5, nc = V - col0 < kNO ? V - col0 : kNO;
  extern __shared__ __align__(16) unsigned char smem[];
  float* base = reinterpret_cast<float*>(smem);
  const KdaChunkLayout& lay = a.lay;
  const float* blk = a.blk(c, h);
  float* bb = a.bblk(c, h);
  const auto keep = [&](float* dst, int i, int col, float v0, float v1) {
    if (col < nc) *at2(dst + static_cast<int64_t>(i) * V + col) = make_float2(v0, v1);
  };
  if (job == 0) {
    constexpr int kLdW = OpLd<E>::row;
    float* S0s = base;                               // [kK][kLdNO]
    E* Ws = reinterpret_cast<E*>(S0s + kK * kLdNO);  // [kC][kLdW]
    stage(Ws, kLdW, slot<E>(blk, lay.W()), K, kC, K);
    stage(S0s, kLdNO, a.saved + (c * H + h) * K * V + col0, V, K, nc);
    mma::cp_async_commit();
    mma::cp_async_wait<0>();
    __syncthreads();
    float d[kNO / 8][4] = {};
    mma::warp_mma_tf32<false, kNO / 8>(d, Ws, kLdW, 16 * w, S0s, kLdNO, 0, K, lane);
    const E* U = slot<E>(blk, lay.U()) + col0;
    for_pairs(d, 16 * w, lane, [&](int i, int col, float& d0, float& d1) {
      if (col >= nc) return;
      const float2 u = ld2(U + i * V + col);
      keep(bb + lay.D() + col0, i, col, i < L ? u.x - d0 : 0.f, i < L ? u.y - d1 : 0.f);
    });
    return;
  }
  constexpr int kLdQ = OpLd<E>::tr;
  float* As = base;                                // [kC][kLdTrC]: Aqk, read transposed
  float* dOs = As + kC * kLdTrC;                   // [kC][kLdNO]
  E* Qs = reinterpret_cast<E*>(dOs + kC * kLdNO);  // [kC][kLdQ]: Qh, read transposed
  stage(As, kLdTrC, blk + lay.Aqk(), kC, kC, kC);
  stage(Qs, kLdQ, slot<E>(blk, lay.Qh()), K, kC, K);
  mma::cp_async_commit();
  const int64_t t0 = a.ct0[c];
  for (int e = threadIdx.x; e < kC * kNO; e += kThreads) {
    const int i = e / kNO, y = e % kNO;
    dOs[i * kLdNO + y] = i < L && y < nc ? ld(dout, ((t0 + i) * H + h) * V + col0 + y) : 0.f;
  }
  mma::cp_async_wait<0>();
  __syncthreads();
  const int kd = (L + 7) & ~7;
  {
    float e[kNO / 8][4] = {};
    mma::warp_mma_tf32<true, kNO / 8>(e, As, kLdTrC, 16 * w, dOs, kLdNO, 0, kd, lane);
    for_pairs(e, 16 * w, lane, [&](int i, int col, float& e0, float& e1) {
      keep(bb + lay.dR() + col0, i, col, e0, e1);
    });
  }
  float* F = a.dS + (c * H + h) * K * V + col0;
#pragma unroll 1
  for (int mt = 0; mt < 2; ++mt) {
    const int x0 = 16 * (w + 4 * mt);
    if (x0 >= K) break;
    float f[kNO / 8][4] = {};
    mma::warp_mma_tf32<true, kNO / 8>(f, Qs, kLdQ, x0, dOs, kLdNO, 0, kd, lane);
    for_pairs(f, x0, lane, [&](int x, int col, float& f0, float& f1) { keep(F, x, col, f0, f1); });
  }
}

template <typename E>
constexpr size_t bwd_state_smem() {
  return sizeof(float) * (kC * kLdTrC + kK + kK * kLdNB + 2 * kC * kLdNB) +
         sizeof(E) * (kC * OpLd<E>::row + kC * OpLd<E>::tr);
}

template <typename E>
__global__ void __launch_bounds__(kThreads, 2) bwd_state_tc_kernel(Args a) {
  const int64_t n = blockIdx.x, h = blockIdx.y, H = a.H;
  const int col0 = blockIdx.z * kNB, K = a.K, V = a.V, lane = threadIdx.x & 31,
            w = threadIdx.x >> 5;
  constexpr int kLdKl = OpLd<E>::row, kLdKb = OpLd<E>::tr;
  extern __shared__ __align__(16) unsigned char smem[];
  float* Ts = reinterpret_cast<float*>(smem);       // [kC][kLdTrC]: T, read transposed
  float* gLs = Ts + kC * kLdTrC;                    // [kK]
  float* dSs = gLs + kK;                            // [kK][kLdNB]
  float* dDs = dSs + kK * kLdNB;                    // [kC][kLdNB]
  float* nRs = dDs + kC * kLdNB;                    // [kC][kLdNB]: -dR
  E* Kls = reinterpret_cast<E*>(nRs + kC * kLdNB);  // [kC][kLdKl]
  E* Kbs = Kls + kC * kLdKl;                        // [kC][kLdKb]: Kb, read transposed
  const KdaChunkLayout& lay = a.lay;
  float s[2][2][4];  // dS, rows as in the forward pass
  state_io(s, a.dhT ? a.dhT + (n * H + h) * K * V + col0 : nullptr, nullptr, K, V);
  const int64_t cb = a.dchunk0[n], ce = a.dchunk0[n + 1];
  const auto stage_kl = [&](int64_t c) {
    stage(Kls, kLdKl, slot<E>(a.blk(c, h), lay.Kl()), K, kC, K);
  };
  const auto stage_t = [&](int64_t c) { stage(Ts, kLdTrC, a.blk(c, h) + lay.Tm(), kC, kC, kC); };
  const auto stage_kb = [&](int64_t c) {
    stage(Kbs, kLdKb, slot<E>(a.blk(c, h), lay.Kb()), K, kC, K);
    stage(gLs, 0, a.blk(c, h) + lay.gL(), 0, 1, K);
  };
  if (cb < ce) stage_kl(ce - 1);
  mma::cp_async_commit();
  if (cb < ce) stage_t(ce - 1);
  mma::cp_async_commit();
  if (cb < ce) stage_kb(ce - 1);
  mma::cp_async_commit();
  // F = Qh^T dO and E = Aqk^T dO of a chunk, which the parallel pass left in its dS slot and in
  // dR's place: read one chunk ahead, so that their latency hides behind the chunk before. The
  // slots then take the chunk's outgoing dS and dR (the same thread reads and writes each
  // element).
  const auto slot_of = [&](int64_t c) { return a.dS + (c * H + h) * K * V + col0; };
  const auto dR_of = [&](int64_t c) { return a.bblk(c, h) + lay.dR() + col0; };
  float f[2][2][4] = {}, e[2][4] = {};
  const auto load_fe = [&](int64_t c) {
    const float* slot = slot_of(c);
    for_state_pairs(f, K, lane, [&](int x, int col, float& f0, float& f1) {
      const float2 v = *at2(slot + x * V + col);
      f0 = v.x;
      f1 = v.y;
    });
    const float* Eg = dR_of(c);  // E = Aqk^T dO
    for_pairs(e, 16 * w, lane, [&](int i, int col, float& e0, float& e1) {
      const float2 v = *at2(Eg + i * V + col);
      e0 = v.x;
      e1 = v.y;
    });
  };
  if (cb < ce) load_fe(ce - 1);
  for (int64_t c = ce - 1; c >= cb; --c) {
    const int L = a.clen[c], kd = (L + 7) & ~7;
    float* slot = slot_of(c);
    float* dRg = dR_of(c);
    for_state_pairs(s, K, lane, [&](int x, int col, float& s0, float& s1) {
      *at2(dSs + x * kLdNB + col) = make_float2(s0, s1);
      *at2(slot + x * V + col) = make_float2(s0, s1);
    });
    // dDelta = E + Kl dS.
    float dd[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int u = 0; u < 4; ++u) dd[nt][u] = e[nt][u];
    float fc[2][2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int u = 0; u < 4; ++u) fc[mt][nt][u] = f[mt][nt][u];
    if (c > cb) load_fe(c - 1);
    mma::cp_async_wait<2>();  // Kl of this chunk
    __syncthreads();
    mma::warp_mma_tf32<false, 2>(dd, Kls, kLdKl, 16 * w, dSs, kLdNB, 0, K, lane);
    for_pairs(dd, 16 * w, lane, [&](int i, int col, float& d0, float& d1) {
      *at2(dDs + i * kLdNB + col) = i < L ? make_float2(d0, d1) : make_float2(0.f, 0.f);
    });
    __syncthreads();  // dDelta complete; Kl free
    if (c > cb) stage_kl(c - 1);
    mma::cp_async_commit();
    mma::cp_async_wait<2>();  // T of this chunk
    __syncthreads();
    // dR = T^T dDelta.
    float r[2][4] = {};
    mma::warp_mma_tf32<true, 2>(r, Ts, kLdTrC, 16 * w, dDs, kLdNB, 0, kd, lane);
    for_pairs(r, 16 * w, lane, [&](int i, int col, float& r0, float& r1) {
      const float2 v = i < L ? make_float2(r0, r1) : make_float2(0.f, 0.f);
      *at2(dRg + i * V + col) = v;
      *at2(nRs + i * kLdNB + col) = make_float2(-v.x, -v.y);
    });
    __syncthreads();  // -dR complete; T free
    if (c > cb) stage_t(c - 1);
    mma::cp_async_commit();
    mma::cp_async_wait<2>();  // Kb, gL of this chunk
    __syncthreads();
    // dS = diag(gL) dS + F - Kb^T dR.
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int x0 = 16 * (w + 4 * mt);
      if (x0 >= K) continue;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int u = 0; u < 4; ++u)
          s[mt][nt][u] = gLs[x0 + (lane >> 2) + (u >> 1) * 8] * s[mt][nt][u] + fc[mt][nt][u];
      mma::warp_mma_tf32<true, 2>(s[mt], Kbs, kLdKb, x0, nRs, kLdNB, 0, kd, lane);
    }
    __syncthreads();  // Kb, gL and -dR free
    if (c > cb) stage_kb(c - 1);
    mma::cp_async_commit();
  }
  if (a.dh0) state_io(s, nullptr, a.dh0 + (n * H + h) * K * V + col0, K, V);
}

dim3 state_grid(const Args& a, int nb = kNB) {
  return dim3(static_cast<unsigned>(a.N), static_cast<unsigned>(a.H),
              static_cast<unsigned>(a.V / nb));
}

dim3 chunk_grid(const Args& a, int jobs) {
  return dim3(static_cast<unsigned>(a.nchunks), static_cast<unsigned>(a.H),
              static_cast<unsigned>(jobs * ((a.V + kNO - 1) / kNO)));
}

template <typename E>
void forward_state_as(Context& ctx, const Args& a, bf16* o) {
  const char* op = "kda_forward";
  // Two blocks per SM: where kNB-column blocks would need a second wave, 2 kNB columns each.
  int dev = 0, sms = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  MT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (a.N * a.H * (a.V / kNB) > 2 * static_cast<int64_t>(sms) && a.V % (2 * kNB) == 0) {
    auto* kernel = fwd_state_tc_kernel<2 * kNB, E>;
    kernel<<<state_grid(a, 2 * kNB), kThreads, smem_for(kernel, fwd_state_smem<2 * kNB, E>(), op),
             stream(ctx)>>>(a, o);
  } else {
    auto* kernel = fwd_state_tc_kernel<kNB, E>;
    kernel<<<state_grid(a), kThreads, smem_for(kernel, fwd_state_smem<kNB, E>(), op),
             stream(ctx)>>>(a, o);
  }
  MT_CUDA_LAUNCH_CHECK();
}

template <typename E>
void backward_state_as(Context& ctx, const Args& a, const bf16* dout) {
  const char* op = "kda_backward";
  auto* pre = bwd_pre_tc_kernel<E>;
  pre<<<chunk_grid(a, 2), kThreads, smem_for(pre, pre_smem<E>(), op), stream(ctx)>>>(a, dout);
  MT_CUDA_LAUNCH_CHECK();
  auto* state = bwd_state_tc_kernel<E>;
  state<<<state_grid(a), kThreads, smem_for(state, bwd_state_smem<E>(), op), stream(ctx)>>>(a);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool state_tc_fits(const Args& a) {
  return a.C == kC && a.K % 16 == 0 && a.V % 16 == 0 && a.K <= kK && a.V <= kK;
}

void forward_state_tc(Context& ctx, const Args& a, bf16* o) {
  if (a.lay.half) return forward_state_as<bf16>(ctx, a, o);
  forward_state_as<float>(ctx, a, o);
}

void backward_state_tc(Context& ctx, const Args& a, const bf16* dout) {
  if (a.lay.half) return backward_state_as<bf16>(ctx, a, dout);
  backward_state_as<float>(ctx, a, dout);
}

}  // namespace mt::ops::cuda::kda_detail
