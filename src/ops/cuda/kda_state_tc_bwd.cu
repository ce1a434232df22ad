// The backward state passes of the chunked KDA on tensor cores (kda_state_tc_common.cuh describes
// the passes): bwd_pre_tc_kernel (the products that do not depend on dS, every chunk in parallel),
// then the reverse pass, bwd_state_tc_kernel or bwd_state_v2_kernel (the default for the bf16
// layout), and kda_state_tc.h's backward entry.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kda_state_tc.h"
#include "ops/cuda/kda_state_tc_common.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/kda_prep_path.h"

namespace mt::ops::cuda::kda_detail {

namespace {

using namespace state_tc;

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

// The backward state pass, leaner per chunk (KdaKernels::backward_state_v2, the default;
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

dim3 chunk_grid(const Args& a, int jobs) {
  return dim3(static_cast<unsigned>(a.nchunks), static_cast<unsigned>(a.H),
              static_cast<unsigned>(jobs * ((a.V + kNO - 1) / kNO)));
}

template <int NB, int K>
void launch_bwd_v2(Context& ctx, const Args& a) {
  auto* kernel = bwd_state_v2_kernel<NB, K>;
  kernel<<<state_grid(a, NB), kThreads,
           smem_for(kernel, bwd_state_v2_smem<NB, K>(), "kda_backward"), stream(ctx)>>>(a);
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
    if (a.kernels.backward_state_v2 && (a.K == 64 || a.K == 128)) {
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

void backward_state_tc(Context& ctx, const Args& a, const bf16* dout) {
  if (a.lay.half) return backward_state_as<bf16>(ctx, a, dout);
  backward_state_as<float>(ctx, a, dout);
}

}  // namespace mt::ops::cuda::kda_detail
