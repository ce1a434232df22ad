// The forward state pass of the chunked KDA on tensor cores (kda_state_tc_common.cuh describes
// the passes): fwd_state_tc_kernel, fwd_state_v2_kernel (the default for the bf16 layout) and its
// Follow form for the overlapped forward, and kda_state_tc.h's forward entries and state_tc_fits.
#include <cstdint>
#include <type_traits>

#include "core/cuda/resources.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/kda_state_tc.h"
#include "ops/cuda/kda_state_tc_common.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/kda_prep_path.h"

namespace mt::ops::cuda::kda_detail {

namespace {

using namespace state_tc;

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

// The forward state pass, leaner per chunk (KdaKernels::forward_state_v2, the default; the kernel
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
// Without a.dorder (KdaKernels::forward_longest_first = false): the grid's own order, documents
// fastest.
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

template <int NB, int K, bool Follow = false>
void launch_fwd_v2(Context& ctx, const Args& args, bf16* o) {
  Args a = args;
  if (!a.kernels.forward_longest_first) a.dorder = nullptr;  // the grid's order (state_item)
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

template <typename E>
void forward_state_as(Context& ctx, const Args& a, bf16* o) {
  const char* op = "kda_forward";
  const bool wide = wide_state(a);
  if constexpr (std::is_same_v<E, bf16>) {
    if (a.kernels.forward_state_v2 && (a.K == 64 || a.K == 128)) {
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

}  // namespace

int forward_overlap_blocks(Context& ctx, const Args& a) {
  // One state block of 32 columns per (document, head, column block), all resident beside the
  // prep's persistent grid where they are fewer than the SMs: 2 x SMs slots of 105 / 103 KB of
  // shared memory (29 K / 32 K registers), the prep taking those the state pass leaves. The prep
  // never waits for the state pass, so any split is deadlock-free (its blocks all start at once).
  const int sms = cuda_resources(ctx).multiprocessors;
  if (!(a.kernels.forward_overlap && a.kernels.forward_state_v2 && a.lay.half &&
        (a.K == 64 || a.K == 128) && a.V % (2 * kNB) == 0))
    return 0;
  const int64_t state = a.N * a.H * (a.V / (2 * kNB));
  if (state < sms) return static_cast<int>(2 * sms - state);
  // Waves (kda_forward_overlap_waves): the prep one block per SM, the state pass the other slot.
  return a.kernels.forward_overlap_waves ? sms : 0;
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

}  // namespace mt::ops::cuda::kda_detail
