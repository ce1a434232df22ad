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
//             (2) per (document, head, 16 or 32 columns), in reverse: dDelta = E + Kl dS,
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
#include <cstdint>
#include <type_traits>

#include "core/cuda/resources.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/index_lists.cuh"
#include "ops/cuda/kda_state_tc.h"
#include "ops/cuda/mma.cuh"
#include "ops/kda_prep_path.h"

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
    // S entering the chunk: kept for backward (fp32 or bf16), and the B operand of W S0 and Qh
    // S0.
    const int64_t sv = (c * H + h) * K * V + col0;
    for_state_pairs(s, K, lane, [&](int x, int col, float& s0, float& s1) {
      *at2(Ss + x * kLdB + col) = make_float2(s0, s1);
      if (a.keep) a.put_states(sv + x * V + col, s0, s1);
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

// Fragment helpers of the v2 state passes (fwd_state_v2_kernel, bwd_state_v2_kernel, below):
// bf16 A operands through ldmatrix, fp32 B operands stored transposed and already tf32 so that
// one 16-byte load gives both k8 steps of a 16-row block, compile-time cp.async loops and L2
// prefetch.

// Row stride (floats) of a transposed B operand over nk values of k: 16 mod 32, so that a
// quarter warp's 16-byte loads (two rows) cover the 32 banks once.
constexpr int bt_ld(int nk) {
  return nk + 16;
}

// rows x COLS elements of E from global rows gld apart into shared rows sld apart, 16 bytes per
// cp.async, trip counts known at compile time.
template <int ROWS, int COLS, typename E>
__device__ __forceinline__ void stage_ct(E* dst, int sld, const E* src, int64_t gld) {
  constexpr int kPer = 16 / sizeof(E), kRow = COLS / kPer, kN = ROWS * kRow;
  static_assert(COLS % kPer == 0, "rows of whole 16-byte pieces");
#pragma unroll
  for (int j = 0; j < (kN + kThreads - 1) / kThreads; ++j) {
    const int e = j * kThreads + static_cast<int>(threadIdx.x);
    if (kN % kThreads == 0 || e < kN) {
      const int r = e / kRow, q = (e % kRow) * kPer;
      mma::cp_async16(dst + r * sld + q, src + r * gld + q);
    }
  }
}

__device__ __forceinline__ float tf32_value(float x) {
  return __uint_as_float(mma::to_tf32(x));
}

// An accumulator tile (k rows x0 .. x0+15, n columns 8 nt + 2c, + 1) into a transposed B operand:
// row n, 16-byte chunk (x0 / 4 + g / 2) XOR 2 ((n / 2) mod 4), at 2 (g mod 2) in it the pair
// (k = x0 + g, x0 + g + 8): so that a 16-row block's lane c finds k = 2c, 2c+8, 2c+1, 2c+9 in its
// chunk c. Rounded to tf32 here, once. The XOR keeps both these 8-byte stores and bt_load's
// 16-byte loads conflict-free.
template <int NT>
__device__ __forceinline__ void bt_store(float* dst, int ld, const float (&v)[NT][4], int x0,
                                         int lane) {
  const int g = lane >> 2, c = lane & 3;
  // Rows n = 8 nt + 2c (+ 1): (n / 2) mod 4 = c.
  const int off = 4 * (((x0 >> 2) + (g >> 1)) ^ (2 * c)) + 2 * (g & 1);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float* row = dst + (8 * nt + 2 * c) * ld + off;
    *at2(row) = make_float2(tf32_value(v[nt][0]), tf32_value(v[nt][2]));
    *at2(row + ld) = make_float2(tf32_value(v[nt][1]), tf32_value(v[nt][3]));
  }
}

// The B fragments of both k8 steps of 16-row block kb, n-tiles 0 .. NT-1: lane (g, c) reads row
// 8 nt + g, chunk (4 kb + c) XOR 2 ((g / 2) mod 4) (bt_store's swizzle: it depends on g only).
template <int NT>
__device__ __forceinline__ void bt_load(float4 (&b)[NT], const float* src, int ld, int kb,
                                        int lane) {
  const int g = lane >> 2, c = lane & 3;
  const float* p = src + g * ld + 4 * ((4 * kb + c) ^ (2 * ((g >> 1) & 3)));
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) b[nt] = *reinterpret_cast<const float4*>(p + 8 * nt * ld);
}

// acc0 (step 0) + acc1 (step 1) += A B over a 16-row block of k: A an ldmatrix fragment of bf16
// pairs (step 0 takes the low halves, k = 2c and 2c+8; step 1 the high ones, k = 2c+1 and 2c+9),
// B from bt_load. Two accumulators (summed by the caller) give twice the independent chains to the
// products whose warp has only NT output tiles.
__device__ __forceinline__ void mma_k16_split(float (&acc0)[4], float (&acc1)[4],
                                              const uint32_t (&a)[4], float4 b) {
  const uint32_t lo[4] = {a[0] << 16, a[1] << 16, a[2] << 16, a[3] << 16};
  const uint32_t hi[4] = {a[0] & 0xffff0000u, a[1] & 0xffff0000u, a[2] & 0xffff0000u,
                          a[3] & 0xffff0000u};
  const uint32_t b0[2] = {__float_as_uint(b.x), __float_as_uint(b.y)};
  const uint32_t b1[2] = {__float_as_uint(b.z), __float_as_uint(b.w)};
  mma::mma_tf32(acc0, lo, b0);
  mma::mma_tf32(acc1, hi, b1);
}

// The same into one accumulator (both steps in turn).
__device__ __forceinline__ void mma_k16(float (&acc)[4], const uint32_t (&a)[4], float4 b) {
  mma_k16_split(acc, acc, a, b);
}

// The 128-byte lines of [p, p + bytes) whose index is `part` mod `parts` into L2, so that the
// blocks sharing a head (one part each) pull a later chunk's operands from HBM once and ahead of
// their cp.async.
__device__ __forceinline__ void prefetch_l2(const float* p, int64_t floats, int part, int parts) {
  const char* b = reinterpret_cast<const char*>(p);
  const int64_t bytes = floats * static_cast<int64_t>(sizeof(float));
  for (int64_t j = static_cast<int64_t>(threadIdx.x) * parts + part; j * 128 < bytes;
       j += static_cast<int64_t>(kThreads) * parts)
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(b + j * 128));
}

// The forward state pass, leaner per chunk (kda_set_forward_state_v2, the default; the kernel
// above stays selectable so that one benchmark times both). Same products, same operand values
// (S0 and Delta rounded to tf32 once where they are stored instead of at every fragment load: the
// bits the MMAs see are the same), the k index of each 16-row block permuted consistently between
// A and B, so the results differ from fwd_state_tc_kernel's by fp32 summation order only. Per
// chunk and warp, the old kernel spent ~60 instructions per m16n8k8 MMA on fragment loads (2-byte
// and 4-byte scalars, a cvt per B element, index math) and ran its products one after another,
// each a chain of 8 to 24 dependent MMAs, between four barriers. Here:
//  - A fragments (W, Qh, Kl^T: bf16) come from one ldmatrix.x4 per 16 x 16 tile: its bf16 pairs
//    (k = 2c, 2c+1) split lo / hi into the two k8 steps of the block (a bf16 is its tf32 with the
//    low half zero), so step 0 takes k = 2c, 2c+8 and step 1 k = 2c+1, 2c+9;
//  - B operands (S0, Delta) are stored transposed, already tf32, each 16-row block in the order
//    (2c, 2c+8, 2c+1, 2c+9) per lane: one 16-byte load gives both k8 steps' B fragments (bt_*);
//  - W S0 and Qh S0 run in one loop over k that shares the S0 fragments (8 independent
//    accumulator chains per warp), as do Kl^T Delta and Aqk Delta over the Delta fragments (12);
//  - two barriers per chunk: S0 published (the chunk's W, Qh, U landed; last chunk's Delta, Kl,
//    Aqk, gL free), Delta published (Kl, Aqk, gL landed; W, Qh, U free). Kl, Aqk, gL of the chunk
//    are staged after the first, W, Qh, U of the next after the second: each has half a chunk to
//    land (one buffer each: two blocks of 4 warps per SM, as before);
//  - the cp.async loops have compile-time trip counts (no division per 16 bytes), and each
//    chunk's lines are prefetched into L2 two chunks ahead (a quarter of them by each of a head's
//    column blocks), so that the half-step cp.async windows meet L2 latency, not HBM's.
// Bf16 prepared layout only (head dims 64 or 128, which the layout implies); the fp32 layout keeps
// fwd_state_tc_kernel.
constexpr int kLdAq = kC + 8;  // Aqk rows (floats): 8 mod 32, conflict-free 8-byte fragment loads

// Shared bytes of fwd_state_v2_kernel: W, Qh, Kl (bf16 rows of K + 8), U (NB + 8), Aqk (fp32 rows
// of kLdAq), gL, S0^T and Delta^T (bt_ld).
template <int NB, int K>
constexpr size_t fwd_state_v2_smem() {
  return sizeof(bf16) * (3 * kC * (K + 8) + kC * (NB + 8)) +
         sizeof(float) * (kC * kLdAq + K + NB * bt_ld(K) + NB * bt_ld(kC));
}

// The (document, head, column block) of a forward state block: in launch order (x fastest)
// the documents longest first (a.dorder), each document's heads and column blocks together (the
// column blocks of a head adjacent, so that they share its prefetched lines). Where the grid
// runs in waves (packed batches: 16 documents x 32 heads x 4 column blocks over 264 slots), a
// slot that frees takes the longest document left, so that no long document starts last and
// runs alone at the end (greedy longest-first).
struct StateItem {
  int64_t n, h;
  int z;
};
// Without a.dorder (kda_set_forward_longest_first(false)): the grid's own order, documents fastest.
__device__ __forceinline__ StateItem state_item(const Args& a) {
  if (!a.dorder) return {blockIdx.x, blockIdx.y, static_cast<int>(blockIdx.z)};
  const int64_t Z = gridDim.z, HZ = gridDim.y * Z;
  const int64_t i = blockIdx.x + static_cast<int64_t>(gridDim.x) *
                                     (blockIdx.y + static_cast<int64_t>(gridDim.y) * blockIdx.z);
  const int64_t r = i % HZ;
  return {a.dorder[i / HZ], r / Z, static_cast<int>(r % Z)};
}

// The overlapped forward (Follow, a.ready): warp 0 finds how many chunks from `ready` on the prep
// has flagged done for this head (a lane per chunk, ld.acquire; chunks past ce count as done), and
// waits until that reaches past `need`. Returns the first chunk not known to be done. A barrier
// after it orders the block's copies after the flags (the prep's fence before each flag makes its
// stores visible first). Polls once per 32 chunks while the prep runs ahead.
__device__ __forceinline__ int64_t await_prepared(const int* flags, int64_t need, int64_t ready,
                                                  int64_t ce, int lane) {
  // A flag that never comes (a prep that did not run: a bug) ends the kernel with an error after
  // 30 s instead of hanging the device; the prep of a whole call takes milliseconds. Timed by the
  // global clock, not by polls: a sleep's length varies, and a sanitizer slows the prep.
  uint64_t t0 = 0;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t0));
  for (;;) {
    const int64_t i = ready + lane;
    int f = 1;
    if (i < ce)
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(f) : "l"(flags + i) : "memory");
    const unsigned pending = __ballot_sync(0xffffffffu, f == 0);
    ready += pending ? __ffs(pending) - 1 : 32;
    if (ready > need) return ready;
    __nanosleep(128);
    uint64_t t = 0;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    if (t - t0 > 30'000'000'000ull) __trap();
  }
}

template <int NB, int K, bool Follow = false>
__global__ void __launch_bounds__(kThreads, 2) fwd_state_v2_kernel(Args a, bf16* o) {
  static_assert(NB % 8 == 0 && K % 64 == 0 && K <= kK, "NB / 8 n-tiles; K 64 or 128");
  constexpr int NT = NB / 8, kLdA = K + 8, kLdU = NB + 8, kLdS = bt_ld(K), kLdD = bt_ld(kC);
  constexpr int kMt = K / 64;  // the warp's state m-tiles: w, w + 4
  const StateItem item = state_item(a);
  const int64_t n = item.n, h = item.h, H = a.H;
  const int col0 = item.z * NB, V = a.V, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int g = lane >> 2, c4 = lane & 3;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Ws = reinterpret_cast<bf16*>(smem);              // [kC][kLdA]
  bf16* Qs = Ws + kC * kLdA;                             // [kC][kLdA]
  bf16* Kls = Qs + kC * kLdA;                            // [kC][kLdA], read transposed
  bf16* Us = Kls + kC * kLdA;                            // [kC][kLdU]
  float* As = reinterpret_cast<float*>(Us + kC * kLdU);  // [kC][kLdAq]
  float* gLs = As + kC * kLdAq;                          // [K]
  float* St = gLs + K;                                   // [NB][kLdS]: S0^T (bt_store)
  float* Dt = St + NB * kLdS;                            // [NB][kLdD]: Delta^T
  const KdaChunkLayout& lay = a.lay;
  float s[2][NT][4];
  state_io(s, a.h0 ? a.h0 + (n * H + h) * K * V + col0 : nullptr, nullptr, K, V);
  const int64_t cb = a.dchunk0[n], ce = a.dchunk0[n + 1];
  const auto stage_a = [&](int64_t c) {  // what W S0, Qh S0 and Delta read
    const float* blk = a.blk(c, h);
    stage_ct<kC, K>(Ws, kLdA, slot<bf16>(blk, lay.W()), K);
    stage_ct<kC, K>(Qs, kLdA, slot<bf16>(blk, lay.Qh()), K);
    stage_ct<kC, NB>(Us, kLdU, slot<bf16>(blk, lay.U()) + col0, V);
  };
  const auto stage_b = [&](int64_t c) {  // what the state update and Aqk Delta read
    const float* blk = a.blk(c, h);
    stage_ct<kC, K>(Kls, kLdA, slot<bf16>(blk, lay.Kl()), K);
    stage_ct<kC, kC>(As, kLdAq, blk + lay.Aqk(), kC);
    stage_ct<1, K>(gLs, 0, blk + lay.gL(), 0);
  };
  // What the pass reads of a chunk's block: W, Qh, Kl, U (contiguous), Aqk and gL; the head's
  // column blocks (gridDim.z) share the lines.
  const auto prefetch = [&](int64_t c) {
    const float* blk = a.blk(c, h);
    const int part = item.z, parts = static_cast<int>(gridDim.z);
    prefetch_l2(blk + lay.W(), lay.Kb() - lay.W(), part, parts);
    prefetch_l2(blk + lay.Aqk(), kC * kC, part, parts);
    prefetch_l2(blk + lay.gL(), K, part, parts);
  };
  // Follow: warp 0's count of this head's chunks known prepared (await_prepared).
  [[maybe_unused]] const int* flags = Follow ? a.ready + h * a.nchunks : nullptr;
  [[maybe_unused]] int64_t ready = cb;
  if constexpr (Follow) {
    if (w == 0 && cb < ce) ready = await_prepared(flags, cb, ready, ce, lane);
    __syncthreads();
  }
  if (cb + 1 < ce) prefetch(cb + 1);
  if (cb < ce) stage_a(cb);
  mma::cp_async_commit();
  for (int64_t c = cb; c < ce; ++c) {
    const int L = a.clen[c];
    const int64_t sv = (c * H + h) * K * V + col0;
    // Two chunks ahead: the HBM latency hides behind a whole chunk step (the cp.async of a chunk
    // has half a step to land, and then finds its lines in L2).
    if (c + 2 < ce) prefetch(c + 2);
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      bt_store(St, kLdS, s[mt], 16 * (w + 4 * mt), lane);
      if (a.keep)
        for_pairs(s[mt], 16 * (w + 4 * mt), lane, [&](int x, int col, float& s0, float& s1) {
          a.put_states(sv + x * V + col, s0, s1);
        });
    }
    mma::cp_async_wait<0>();  // W, Qh, U of this chunk
    __syncthreads();          // S0^T published; Delta^T, Kl, Aqk, gL free
    stage_b(c);
    mma::cp_async_commit();
    // Delta = U - W S0 and the output's Qh S0, rows 16 w .. 16 w + 15, sharing the S0 fragments.
    float d[NT][4] = {}, acc[NT][4] = {};
#pragma unroll
    for (int kb = 0; kb < K / 16; ++kb) {
      float4 b[NT];
      bt_load(b, St, kLdS, kb, lane);
      uint32_t aw[4], aq[4];
      mma::ldsm_a(aw, Ws, kLdA, 16 * w, 16 * kb, lane);
      mma::ldsm_a(aq, Qs, kLdA, 16 * w, 16 * kb, lane);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        mma_k16(d[nt], aw, b[nt]);
        mma_k16(acc[nt], aq, b[nt]);
      }
    }
    {
      const int i0 = 16 * w + g;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int col = 8 * nt + 2 * c4;
        const float2 u0 = ld2(Us + i0 * kLdU + col), u1 = ld2(Us + (i0 + 8) * kLdU + col);
        d[nt][0] = i0 < L ? u0.x - d[nt][0] : 0.f;
        d[nt][1] = i0 < L ? u0.y - d[nt][1] : 0.f;
        d[nt][2] = i0 + 8 < L ? u1.x - d[nt][2] : 0.f;
        d[nt][3] = i0 + 8 < L ? u1.y - d[nt][3] : 0.f;
      }
      bt_store(Dt, kLdD, d, 16 * w, lane);
    }
    if constexpr (Follow) {
      // The next chunk's block before the barrier that precedes its copies.
      if (w == 0 && c + 1 < ce && ready <= c + 1)
        ready = await_prepared(flags, c + 1, ready, ce, lane);
    }
    mma::cp_async_wait<0>();  // Kl, Aqk, gL of this chunk
    __syncthreads();          // Delta^T published; W, Qh, U free
    if (c + 1 < ce) stage_a(c + 1);
    mma::cp_async_commit();
    // S = diag(gL) S0 + Kl^T Delta and o += Aqk Delta, sharing the Delta fragments. All 64 rows
    // of the chunk: Delta is zero past L, and the prep leaves Kl and Aqk finite there (zero).
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      const int x0 = 16 * (w + 4 * mt);
      const float gl0 = gLs[x0 + g], gl1 = gLs[x0 + g + 8];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        s[mt][nt][0] *= gl0;
        s[mt][nt][1] *= gl0;
        s[mt][nt][2] *= gl1;
        s[mt][nt][3] *= gl1;
      }
    }
#pragma unroll
    for (int kb = 0; kb < kC / 16; ++kb) {
      float4 b[NT];
      bt_load(b, Dt, kLdD, kb, lane);
      uint32_t ak[kMt][4];
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt)
        mma::ldsm_a_trans(ak[mt], Kls, kLdA, 16 * (w + 4 * mt), 16 * kb, lane);
      // Aqk (fp32) with the same k order: step 0 k = 2c, 2c+8, step 1 k = 2c+1, 2c+9.
      const float* ar = As + (16 * w + g) * kLdAq + 16 * kb + 2 * c4;
      const float2 p0 = ld2(ar), p1 = ld2(ar + 8 * kLdAq), p2 = ld2(ar + 8),
                   p3 = ld2(ar + 8 * kLdAq + 8);
      const uint32_t aa0[4] = {mma::to_tf32(p0.x), mma::to_tf32(p1.x), mma::to_tf32(p2.x),
                               mma::to_tf32(p3.x)};
      const uint32_t aa1[4] = {mma::to_tf32(p0.y), mma::to_tf32(p1.y), mma::to_tf32(p2.y),
                               mma::to_tf32(p3.y)};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) mma_k16(s[mt][nt], ak[mt], b[nt]);
        const uint32_t b0[2] = {__float_as_uint(b[nt].x), __float_as_uint(b[nt].y)};
        const uint32_t b1[2] = {__float_as_uint(b[nt].z), __float_as_uint(b[nt].w)};
        mma::mma_tf32(acc[nt], aa0, b0);
        mma::mma_tf32(acc[nt], aa1, b1);
      }
    }
    const int64_t t0 = a.ct0[c];
    for_pairs(acc, 16 * w, lane, [&](int i, int col, float& o0, float& o1) {
      if (i < L)
        *reinterpret_cast<__nv_bfloat162*>(o + ((t0 + i) * H + h) * V + col0 + col) =
            __floats2bfloat162_rn(o0, o1);
    });
  }
  if (a.hT) state_io(s, nullptr, a.hT + (n * H + h) * K * V + col0, K, V);
  if constexpr (Follow) {
    // The last block to finish waits for the prep's grid to complete (its last items may be
    // unused chunk rows, flagged after this pass read its last flag), so that this kernel's end,
    // which the stream's next work waits for, implies the prep's.
    if (threadIdx.x == 0) {
      const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
      if (atomicAdd(reinterpret_cast<unsigned*>(a.ready + a.H * a.nchunks), 1u) == blocks - 1)
        asm volatile("griddepcontrol.wait;\n" ::: "memory");
    }
  }
}

// Chunk states [rows][cols] (cols a multiple of 8, at most kK x kNO of them) of the `saved` block
// whose element (0, 0) is e0 (rows V apart) into a shared fp32 tile of row stride sld: fp32 states
// through cp.async (complete at the caller's cp_async_wait), bf16 ones (Args::saved_h) by 16-byte
// loads, all of a thread's in flight before the first, widened exactly as they are stored.
__device__ __forceinline__ void stage_states(float* dst, int sld, const Args& a, int64_t e0,
                                             int rows, int cols) {
  if (!a.saved_h) return stage(dst, sld, a.saved + e0, a.V, rows, cols);
  constexpr int kMax = kK * kNO / 8 / kThreads;
  const int per = cols / 8, n = rows * per;
  uint4 v[kMax];
#pragma unroll
  for (int j = 0; j < kMax; ++j) {
    const int e = j * kThreads + static_cast<int>(threadIdx.x), r = e / per, q = (e - r * per) * 8;
    if (e < n) v[j] = *reinterpret_cast<const uint4*>(a.saved_h + e0 + r * a.V + q);
  }
#pragma unroll
  for (int j = 0; j < kMax; ++j) {
    const int e = j * kThreads + static_cast<int>(threadIdx.x), r = e / per, q = (e - r * per) * 8;
    if (e >= n) continue;
    const uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
    float4* d = reinterpret_cast<float4*>(dst + r * sld + q);
    d[0] = make_float4(__uint_as_float(w[0] << 16), __uint_as_float(w[0] & 0xffff0000u),
                       __uint_as_float(w[1] << 16), __uint_as_float(w[1] & 0xffff0000u));
    d[1] = make_float4(__uint_as_float(w[2] << 16), __uint_as_float(w[2] & 0xffff0000u),
                       __uint_as_float(w[3] << 16), __uint_as_float(w[3] & 0xffff0000u));
  }
}

template <typename E>
constexpr size_t pre_smem() {
  return std::max(sizeof(E) * kC * OpLd<E>::row + sizeof(float) * kK * kLdNO,
                  sizeof(float) * (kC * kLdTrC + kC * kLdNO) + sizeof(E) * kC * OpLd<E>::tr);
}

// Backward's products that do not depend on dS, per (chunk, head, 64 columns): job 0 (even z)
// Delta = U - W S0 into D; job 1 (odd z) E = Aqk^T dO into dR and F = Qh^T dO into the dS slot.
// jobs 1: job 1 alone (the backward's prep formed Delta: Args::fuse_delta; where Args::fuse_pre
// it did job 1 as well, and this kernel does not run).
template <typename E>
__global__ void __launch_bounds__(kThreads) bwd_pre_tc_kernel(Args a, const bf16* dout, int jobs) {
  const int64_t c = blockIdx.x, h = blockIdx.y, H = a.H;
  const int L = a.clen[c];
  if (L == 0) return;
  const int job = jobs == 2 ? static_cast<int>(blockIdx.z & 1) : 1,
            col0 = static_cast<int>(blockIdx.z) / jobs * kNO, K = a.K, V = a.V,
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
    mma::cp_async_commit();
    // The thread's U pairs, all in flight at once and under the cp.async wait (read one by one
    // after the MMAs, between the stores they feed, each was a round trip of its own).
    const E* U = slot<E>(blk, lay.U()) + col0;
    float2 u[kNO / 8][2];
#pragma unroll
    for (int nt = 0; nt < kNO / 8; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * w + (lane >> 2) + 8 * hf, col = 8 * nt + 2 * (lane & 3);
        u[nt][hf] = col < nc ? ld2(U + i * V + col) : make_float2(0.f, 0.f);
      }
    // S0 after U's loads are in flight (bf16 states are loaded, not copied: their stores wait).
    stage_states(S0s, kLdNO, a, (c * H + h) * K * V + col0, K, nc);
    mma::cp_async_commit();
    mma::cp_async_wait<0>();
    __syncthreads();
    float d[kNO / 8][4] = {};
    mma::warp_mma_tf32<false, kNO / 8>(d, Ws, kLdW, 16 * w, S0s, kLdNO, 0, K, lane);
#pragma unroll
    for (int nt = 0; nt < kNO / 8; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * w + (lane >> 2) + 8 * hf, col = 8 * nt + 2 * (lane & 3);
        const float2 v = u[nt][hf];
        keep(bb + lay.D() + col0, i, col, i < L ? v.x - d[nt][2 * hf] : 0.f,
             i < L ? v.y - d[nt][2 * hf + 1] : 0.f);
      }
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
  // dO's rows in pieces of 8 bf16, a thread's four loads all in flight before the first is used
  // (element by element, each load waited for its shared store: ~30 round trips per thread); 16
  // bytes each where dout is 16-byte aligned (V and col0 are multiples of 8). Zeros past L.
  {
    constexpr int kRow = kNO / 8, kPer = kC * kRow / kThreads;
    const bool vec = (reinterpret_cast<uintptr_t>(dout) & 15) == 0;
    uint4 raw[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int e = j * kThreads + static_cast<int>(threadIdx.x), i = e / kRow, y = e % kRow * 8;
      raw[j] = make_uint4(0u, 0u, 0u, 0u);
      if (i < L && y < nc) {
        const bf16* src = dout + ((t0 + i) * H + h) * V + col0 + y;
        if (vec) {
          raw[j] = *reinterpret_cast<const uint4*>(src);
        } else {
          uint32_t q[4];
#pragma unroll
          for (int m = 0; m < 4; ++m)
            q[m] = static_cast<uint32_t>(__bfloat16_as_ushort(src[2 * m])) |
                   static_cast<uint32_t>(__bfloat16_as_ushort(src[2 * m + 1])) << 16;
          raw[j] = make_uint4(q[0], q[1], q[2], q[3]);
        }
      }
    }
    // bf16 -> fp32 is exact: the low half of a pair shifted up, the high half masked.
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int e = j * kThreads + static_cast<int>(threadIdx.x), i = e / kRow, y = e % kRow * 8;
      const uint32_t q[4] = {raw[j].x, raw[j].y, raw[j].z, raw[j].w};
      float4* dst = reinterpret_cast<float4*>(dOs + i * kLdNO + y);
      dst[0] = make_float4(__uint_as_float(q[0] << 16), __uint_as_float(q[0] & 0xffff0000u),
                           __uint_as_float(q[1] << 16), __uint_as_float(q[1] & 0xffff0000u));
      dst[1] = make_float4(__uint_as_float(q[2] << 16), __uint_as_float(q[2] & 0xffff0000u),
                           __uint_as_float(q[3] << 16), __uint_as_float(q[3] & 0xffff0000u));
    }
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

// The backward state pass, leaner per chunk (kda_set_backward_state_v2, the default;
// bwd_state_tc_kernel above stays selectable so that one benchmark times both), built as
// fwd_state_v2_kernel is: the same products over the same operand values (dS, dDelta and -dR
// rounded to tf32 once where they are stored), k permuted consistently between A and B, so the
// results differ from bwd_state_tc_kernel's by fp32 summation order only. Per chunk:
//  - three products, each needing the whole of the one before (dS -> dDelta -> dR -> dS), so
//    three barriers (v1: six): dS^T published (Kl landed; the chunk after's Kb, gL, -dR^T free),
//    dDelta^T published (T landed; Kl free), -dR^T published (Kb, gL landed; T free). Kb and gL
//    are staged after the first, Kl of the chunk before after the second, its T after the third:
//    one buffer each, every cp.async group has two of the three phases to land, and each wait
//    leaves exactly the newest group in flight;
//  - Kl (dDelta = E + Kl dS) and Kb^T (dS -= Kb^T dR) through ldmatrix (.trans), T^T (fp32) by
//    scalar loads in the permuted k order from rows of kLdT floats (4 mod 32: the lanes' rows
//    2c .. 2c+9 and columns g fall in 32 distinct banks), B operands through bt_load;
//  - dDelta and dR, whose warp has only NT output tiles, keep the two k8 steps in separate
//    accumulators (2 NT independent chains), the state update has kMt NT;
//  - E (the chunk's dDelta start) is read from HBM one chunk ahead as before, F (its dS term) right
//    after the state update, a whole chunk before it is added; every operand is prefetched into L2
//    two chunks ahead, the head's column blocks sharing the lines.
// Bf16 prepared layout only (head dims 64 or 128); the fp32 layout keeps bwd_state_tc_kernel.
constexpr int kLdT = kC + 4;  // T rows (floats), read transposed

// Shared bytes of bwd_state_v2_kernel: Kl, Kb (bf16 rows of K + 8), T (kLdT), gL, dS^T (bt_ld(K)),
// dDelta^T and -dR^T (bt_ld(kC)).
template <int NB, int K>
constexpr size_t bwd_state_v2_smem() {
  return sizeof(bf16) * 2 * kC * (K + 8) +
         sizeof(float) * (kC * kLdT + K + NB * bt_ld(K) + 2 * NB * bt_ld(kC));
}

template <int NB, int K>
__global__ void __launch_bounds__(kThreads, 2) bwd_state_v2_kernel(Args a) {
  static_assert(NB % 8 == 0 && K % 64 == 0 && K <= kK, "NB / 8 n-tiles; K 64 or 128");
  constexpr int NT = NB / 8, kLdA = K + 8, kLdS = bt_ld(K), kLdD = bt_ld(kC);
  constexpr int kMt = K / 64;  // the warp's state m-tiles: w, w + 4
  const int64_t n = blockIdx.x, h = blockIdx.y, H = a.H;
  const int col0 = blockIdx.z * NB, V = a.V, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int g = lane >> 2, c4 = lane & 3;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Kls = reinterpret_cast<bf16*>(smem);              // [kC][kLdA]
  bf16* Kbs = Kls + kC * kLdA;                            // [kC][kLdA], read transposed
  float* Ts = reinterpret_cast<float*>(Kbs + kC * kLdA);  // [kC][kLdT], read transposed
  float* gLs = Ts + kC * kLdT;                            // [K]
  float* St = gLs + K;                                    // [NB][kLdS]: dS^T (bt_store)
  float* Dt = St + NB * kLdS;                             // [NB][kLdD]: dDelta^T
  float* Rt = Dt + NB * kLdD;                             // [NB][kLdD]: -dR^T
  const KdaChunkLayout& lay = a.lay;
  float s[2][NT][4];  // dS, rows as in the forward pass
  state_io(s, a.dhT ? a.dhT + (n * H + h) * K * V + col0 : nullptr, nullptr, K, V);
  const int64_t cb = a.dchunk0[n], ce = a.dchunk0[n + 1];
  const auto stage_kl = [&](int64_t c) {
    stage_ct<kC, K>(Kls, kLdA, slot<bf16>(a.blk(c, h), lay.Kl()), K);
  };
  const auto stage_t = [&](int64_t c) { stage_ct<kC, kC>(Ts, kLdT, a.blk(c, h) + lay.Tm(), kC); };
  const auto stage_kb = [&](int64_t c) {
    const float* blk = a.blk(c, h);
    stage_ct<kC, K>(Kbs, kLdA, slot<bf16>(blk, lay.Kb()), K);
    stage_ct<1, K>(gLs, 0, blk + lay.gL(), 0);
  };
  // F = Qh^T dO and E = Aqk^T dO, which the parallel pass left in the chunk's dS slot and in dR's
  // place; the slots then take the chunk's outgoing dS and dR (the same thread reads and writes
  // each element, the read first).
  const auto slot_of = [&](int64_t c) { return a.dS + (c * H + h) * K * V + col0; };
  const auto dR_of = [&](int64_t c) { return a.bblk(c, h) + lay.dR() + col0; };
  const auto prefetch = [&](int64_t c) {
    const float* blk = a.blk(c, h);
    const int part = static_cast<int>(blockIdx.z), parts = static_cast<int>(gridDim.z);
    prefetch_l2(blk + lay.Kl(), lay.big(kC * K), part, parts);
    prefetch_l2(blk + lay.Kb(), lay.big(kC * K), part, parts);
    prefetch_l2(blk + lay.Tm(), kC * kC, part, parts);
    prefetch_l2(blk + lay.gL(), K, part, parts);
    prefetch_l2(slot_of(c) - col0, static_cast<int64_t>(K) * V, part, parts);
    prefetch_l2(dR_of(c) - col0, static_cast<int64_t>(kC) * V, part, parts);
  };
  float f[2][NT][4] = {}, e[NT][4] = {};
  const auto load_f = [&](int64_t c) {
    const float* sl = slot_of(c);
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt)
      for_pairs(f[mt], 16 * (w + 4 * mt), lane, [&](int x, int col, float& f0, float& f1) {
        const float2 v = *at2(sl + x * V + col);
        f0 = v.x;
        f1 = v.y;
      });
  };
  const auto load_e = [&](int64_t c) {
    const float* Eg = dR_of(c);
    for_pairs(e, 16 * w, lane, [&](int i, int col, float& e0, float& e1) {
      const float2 v = *at2(Eg + i * V + col);
      e0 = v.x;
      e1 = v.y;
    });
  };
  if (cb + 1 < ce) prefetch(ce - 2);
  if (cb < ce) stage_kl(ce - 1);
  mma::cp_async_commit();
  if (cb < ce) stage_t(ce - 1);
  mma::cp_async_commit();
  if (cb < ce) {
    load_f(ce - 1);
    load_e(ce - 1);
  }
  for (int64_t c = ce - 1; c >= cb; --c) {
    const int L = a.clen[c];
    float* sl = slot_of(c);
    float* dRg = dR_of(c);
    if (c - 2 >= cb) prefetch(c - 2);
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      // The chunk's outgoing dS: into its slot (F already read), and as dS^T the B operand of
      // Kl dS.
      bt_store(St, kLdS, s[mt], 16 * (w + 4 * mt), lane);
      for_pairs(s[mt], 16 * (w + 4 * mt), lane, [&](int x, int col, float& s0, float& s1) {
        *at2(sl + x * V + col) = make_float2(s0, s1);
      });
    }
    // dDelta starts at E; the chunk before's E loads now, a chunk ahead of its use.
    float dd[NT][4], dd1[NT][4] = {};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int u = 0; u < 4; ++u) dd[nt][u] = e[nt][u];
    if (c > cb) load_e(c - 1);
    mma::cp_async_wait<1>();  // Kl of this chunk (its T may still be in flight)
    __syncthreads();          // dS^T published; Kb, gL, -dR^T of the chunk after free
    stage_kb(c);
    mma::cp_async_commit();
    // dDelta = E + Kl dS, rows 16 w .. 16 w + 15 (zero past L).
#pragma unroll
    for (int kb = 0; kb < K / 16; ++kb) {
      float4 b[NT];
      bt_load(b, St, kLdS, kb, lane);
      uint32_t ak[4];
      mma::ldsm_a(ak, Kls, kLdA, 16 * w, 16 * kb, lane);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_k16_split(dd[nt], dd1[nt], ak, b[nt]);
    }
    {
      const bool in0 = 16 * w + g < L, in1 = 16 * w + g + 8 < L;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        dd[nt][0] = in0 ? dd[nt][0] + dd1[nt][0] : 0.f;
        dd[nt][1] = in0 ? dd[nt][1] + dd1[nt][1] : 0.f;
        dd[nt][2] = in1 ? dd[nt][2] + dd1[nt][2] : 0.f;
        dd[nt][3] = in1 ? dd[nt][3] + dd1[nt][3] : 0.f;
      }
      bt_store(Dt, kLdD, dd, 16 * w, lane);
    }
    mma::cp_async_wait<1>();  // T of this chunk (Kb, gL may still be in flight)
    __syncthreads();          // dDelta^T published; Kl free
    if (c > cb) stage_kl(c - 1);
    mma::cp_async_commit();
    // dR = T^T dDelta, rows i = 16 w .. 16 w + 15: A(i, j) = T[j][i], k = j in bt_load's order
    // (step 0 j = 2c, 2c+8; step 1 2c+1, 2c+9). All 64 j: dDelta is zero past L, T finite there.
    {
      float r[NT][4] = {}, r1[NT][4] = {};
#pragma unroll
      for (int kb = 0; kb < kC / 16; ++kb) {
        float4 b[NT];
        bt_load(b, Dt, kLdD, kb, lane);
        const float* tp = Ts + (16 * kb + 2 * c4) * kLdT + 16 * w + g;
        const uint32_t a0[4] = {mma::to_tf32(tp[0]), mma::to_tf32(tp[8]),
                                mma::to_tf32(tp[8 * kLdT]), mma::to_tf32(tp[8 * kLdT + 8])};
        const float* tq = tp + kLdT;
        const uint32_t a1[4] = {mma::to_tf32(tq[0]), mma::to_tf32(tq[8]),
                                mma::to_tf32(tq[8 * kLdT]), mma::to_tf32(tq[8 * kLdT + 8])};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint32_t b0[2] = {__float_as_uint(b[nt].x), __float_as_uint(b[nt].y)};
          const uint32_t b1[2] = {__float_as_uint(b[nt].z), __float_as_uint(b[nt].w)};
          mma::mma_tf32(r[nt], a0, b0);
          mma::mma_tf32(r1[nt], a1, b1);
        }
      }
      const bool in0 = 16 * w + g < L, in1 = 16 * w + g + 8 < L;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        r[nt][0] = in0 ? r[nt][0] + r1[nt][0] : 0.f;
        r[nt][1] = in0 ? r[nt][1] + r1[nt][1] : 0.f;
        r[nt][2] = in1 ? r[nt][2] + r1[nt][2] : 0.f;
        r[nt][3] = in1 ? r[nt][3] + r1[nt][3] : 0.f;
      }
      for_pairs(r, 16 * w, lane, [&](int i, int col, float& r0, float& r1v) {
        *at2(dRg + i * V + col) = make_float2(r0, r1v);
        r0 = -r0;
        r1v = -r1v;
      });
      bt_store(Rt, kLdD, r, 16 * w, lane);
    }
    mma::cp_async_wait<1>();  // Kb, gL of this chunk (Kl of the chunk before may be in flight)
    __syncthreads();          // -dR^T published; T free
    if (c > cb) stage_t(c - 1);
    mma::cp_async_commit();
    // dS = diag(gL) dS + F - Kb^T dR over all 64 rows of the chunk (dR zero past L, Kb finite).
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      const int x0 = 16 * (w + 4 * mt);
      const float gl0 = gLs[x0 + g], gl1 = gLs[x0 + g + 8];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        s[mt][nt][0] = gl0 * s[mt][nt][0] + f[mt][nt][0];
        s[mt][nt][1] = gl0 * s[mt][nt][1] + f[mt][nt][1];
        s[mt][nt][2] = gl1 * s[mt][nt][2] + f[mt][nt][2];
        s[mt][nt][3] = gl1 * s[mt][nt][3] + f[mt][nt][3];
      }
    }
#pragma unroll
    for (int kb = 0; kb < kC / 16; ++kb) {
      float4 b[NT];
      bt_load(b, Rt, kLdD, kb, lane);
      uint32_t ak[kMt][4];
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt)
        mma::ldsm_a_trans(ak[mt], Kbs, kLdA, 16 * (w + 4 * mt), 16 * kb, lane);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) mma_k16(s[mt][nt], ak[mt], b[nt]);
    }
    // The chunk before's F, a whole chunk ahead of its use.
    if (c > cb) load_f(c - 1);
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

template <int NB, int K, bool Follow = false>
void launch_fwd_v2(Context& ctx, const Args& args, bf16* o) {
  Args a = args;
  if (!kda_forward_longest_first()) a.dorder = nullptr;  // the grid's order (state_item)
  auto* kernel = fwd_state_v2_kernel<NB, K, Follow>;
  const size_t smem = smem_for(kernel, fwd_state_v2_smem<NB, K>(), "kda_forward");
  if constexpr (!Follow) {
    kernel<<<state_grid(a, NB), kThreads, smem, stream(ctx)>>>(a, o);
  } else {
    // The overlapped forward: a programmatic dependent of the prep launched just before, so that
    // it starts as soon as every prep block has (their griddepcontrol.launch_dependents); it
    // waits for the prep's flags, not for the prep's end, and only its last block to finish calls
    // griddepcontrol.wait (so that the stream's next work also follows the prep's end).
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = state_grid(a, NB);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream(ctx);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    MT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a, o));
  }
  MT_CUDA_LAUNCH_CHECK();
}

template <int NB, int K>
void launch_bwd_v2(Context& ctx, const Args& a) {
  auto* kernel = bwd_state_v2_kernel<NB, K>;
  kernel<<<state_grid(a, NB), kThreads,
           smem_for(kernel, bwd_state_v2_smem<NB, K>(), "kda_backward"), stream(ctx)>>>(a);
  MT_CUDA_LAUNCH_CHECK();
}

// Two blocks per SM: where kNB-column blocks would need a second wave, 2 kNB columns each.
bool wide_state(const Args& a) {
  int dev = 0, sms = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  MT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return a.N * a.H * (a.V / kNB) > 2 * static_cast<int64_t>(sms) && a.V % (2 * kNB) == 0;
}

template <typename E>
void forward_state_as(Context& ctx, const Args& a, bf16* o) {
  const char* op = "kda_forward";
  const bool wide = wide_state(a);
  if constexpr (std::is_same_v<E, bf16>) {
    if (kda_forward_state_v2() && (a.K == 64 || a.K == 128)) {
      if (a.K == 128)
        return wide ? launch_fwd_v2<2 * kNB, 128>(ctx, a, o) : launch_fwd_v2<kNB, 128>(ctx, a, o);
      return wide ? launch_fwd_v2<2 * kNB, 64>(ctx, a, o) : launch_fwd_v2<kNB, 64>(ctx, a, o);
    }
  }
  if (wide) {
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
  // What the prep left (kda_fwd_tc.cu's delta_tail, pre_tail): job 0 where Args::fuse_delta,
  // both where Args::fuse_pre.
  if (!a.fuse_pre) {
    auto* pre = bwd_pre_tc_kernel<E>;
    const int jobs = a.fuse_delta ? 1 : 2;
    pre<<<chunk_grid(a, jobs), kThreads, smem_for(pre, pre_smem<E>(), op), stream(ctx)>>>(a, dout,
                                                                                          jobs);
    MT_CUDA_LAUNCH_CHECK();
  }
  if constexpr (std::is_same_v<E, bf16>) {
    if (kda_backward_state_v2() && (a.K == 64 || a.K == 128)) {
      const bool wide = wide_state(a);
      if (a.K == 128)
        return wide ? launch_bwd_v2<2 * kNB, 128>(ctx, a) : launch_bwd_v2<kNB, 128>(ctx, a);
      return wide ? launch_bwd_v2<2 * kNB, 64>(ctx, a) : launch_bwd_v2<kNB, 64>(ctx, a);
    }
  }
  auto* state = bwd_state_tc_kernel<E>;
  state<<<state_grid(a), kThreads, smem_for(state, bwd_state_smem<E>(), op), stream(ctx)>>>(a);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace

int forward_overlap_blocks(Context& ctx, const Args& a) {
  // One state block of 32 columns per (document, head, column block), all resident beside the
  // prep's persistent grid where they are fewer than the SMs: 2 x SMs slots of 105 / 103 KB of
  // shared memory (29 K / 32 K registers), the prep taking those the state pass leaves. The prep
  // never waits for the state pass, so any split is deadlock-free (its blocks all start at once).
  const int sms = cuda_resources(ctx).multiprocessors;
  if (!(kda_forward_overlap() && kda_forward_state_v2() && a.lay.half &&
        (a.K == 64 || a.K == 128) && a.V % (2 * kNB) == 0))
    return 0;
  const int64_t state = a.N * a.H * (a.V / (2 * kNB));
  if (state < sms) return static_cast<int>(2 * sms - state);
  // Waves (kda_forward_overlap_waves): the prep one block per SM, the state pass the other slot.
  return kda_forward_overlap_waves() ? sms : 0;
}

void forward_state_tc_follow(Context& ctx, const Args& a, bf16* o) {
  MT_CHECK(a.ready, InternalError, "kda_forward: the overlapped state pass without ready flags");
  if (a.K == 128) return launch_fwd_v2<2 * kNB, 128, true>(ctx, a, o);
  launch_fwd_v2<2 * kNB, 64, true>(ctx, a, o);
}

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
