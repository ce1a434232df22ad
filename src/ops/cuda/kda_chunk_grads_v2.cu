// Step 5's second gradient kernel (kda_chunk.cu describes the algorithm), grads_v2_kernel: bf16,
// chunk 64, K 128 (KdaKernels::grads_v2, on by default), every pair sum on tensor cores and the
// owners in the warp that holds their sums (the comment above its constants says how); and its
// launch, grads_v2, which kda_chunk_grads.cu's grads calls. The load phase and the other pieces
// it shares with grads_kernel are in kda_chunk_grads.cuh.
#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kda_chunk_common.cuh"
#include "ops/cuda/kda_chunk_grads.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/kda_chunk_layout.h"

namespace mt::ops::cuda {

namespace {

using namespace kda_chunk;

// grads_v2_kernel (bf16, chunk 64, K 128; KdaKernels::grads_v2): every pair sum of grads_kernel on
// tensor cores, the pairs inside a 16-row block (masked j <= i) too, and the owners in the warp
// that holds their sums. With R_b = Gam at row 16 b (R_4 = Gam at row 63) the diagonal block b
// joins grads_block_pairs' sums as r = p = b with the inner factor e^(R_b - R_(b+1)) >= 1; where
// that factor's exponent exceeds kGradDiagMax on some channel of a 16-channel group (strong
// decay: the scaled operands could leave the normal range), that (block, group) keeps the direct
// loop over its pairs. A warp takes two (row block p, 16 channels) combos, each sQ and sK of
// rows 16 p (r <= p) and sC of the same rows as columns (p2 >= p): 5 16 x 16 pair blocks per
// combo on every warp; the accumulators' elements are then exactly the owners' (row, channel
// pairs), so no sum goes through shared memory and the owners' three global reads go out before
// the combo's MMAs. tq and tb are stored with a column XOR of ((i & 3) << 3 | (i & 4)), the
// scaled tiles with (i & 3) << 3: both conflict-free for the row-major and transposed tf32 A
// fragments and the B fragments. 115456 bytes of shared memory: two blocks per SM.
constexpr float kGradDiagMax = 57.7f;  // log2 units: e^40, prep_tc's diagonal bound
constexpr size_t kGradV2Bytes =
    sizeof(float) * (kMaxC * kHalf + kHalf + 2 * kMaxC * kMaxC + 2 * kMaxC + 3 * kMaxC * kHalf) +
    sizeof(__nv_bfloat16) * 2 * kMaxC * kHalf;

__device__ __forceinline__ int sw_pair(int i) {
  return ((i & 3) << 3) | (i & 4);
}
__device__ __forceinline__ int sw_tile(int i) {
  return (i & 3) << 3;
}
// q and k (bf16, rows of 64 = 128 bytes): 16-byte chunk c of row i at c ^ (i & 7), so that the
// owners' pair loads (8 rows, 4 lanes a row) and the column walks spread over the banks.
__device__ __forceinline__ int qk_at(int i, int x) {
  return i * kHalf + ((((x >> 3) ^ (i & 7)) << 3) | (x & 7));
}

// x as tf32 (hi) and, Split, the tf32 of what that leaves (lo): hi + lo holds x to ~2^-22, so
// the three products hi hi + hi lo + lo hi of two split operands are fp32-accurate (3xTF32).
template <bool Split>
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = mma::to_tf32(x);
  if constexpr (Split) lo = mma::to_tf32(x - __uint_as_float(hi));
}

// The tf32 A fragment of rows m0.. (k0..k0+7) of the swizzled [64][64] M: A(m, k) = M[m0 + m][k0
// + k] or, Trans, M[k0 + k][m0 + m]. Diag keeps only the pairs of a diagonal block (column <= row:
// j <= i, or Trans row >= column: i2 >= i) and splits them (lo).
template <bool Trans, bool Diag>
__device__ __forceinline__ void load_a_sw(uint32_t a[4], uint32_t lo[4], const float* M, int m0,
                                          int k0, int lane) {
  const int g = lane >> 2, c = lane & 3;
  const auto at = [&](int m, int k, uint32_t& hi, uint32_t& low) {
    const int row = Trans ? k0 + k : m0 + m, col = Trans ? m0 + m : k0 + k;
    const float v = M[row * kMaxC + (col ^ sw_pair(row))];
    const bool keep = !Diag || (Trans ? row >= col : col <= row);
    split_tf32<Diag>(keep ? v : 0.f, hi, low);
  };
  at(g, c, a[0], lo[0]);
  at(g + 8, c, a[1], lo[1]);
  at(g, c + 4, a[2], lo[2]);
  at(g + 8, c + 4, a[3], lo[3]);
}

// The B fragment (rows k0.., columns n0..n0+7) of a swizzled [64][64] tile.
template <bool Split>
__device__ __forceinline__ void load_b_sw(uint32_t b[2], uint32_t lo[2], const float* B, int k0,
                                          int n0, int lane) {
  const int g = lane >> 2, c = lane & 3, r0 = k0 + c, r1 = k0 + c + 4;
  split_tf32<Split>(B[r0 * kHalf + ((n0 + g) ^ sw_tile(r0))], b[0], lo[0]);
  split_tf32<Split>(B[r1 * kHalf + ((n0 + g) ^ sw_tile(r1))], b[1], lo[1]);
}

// c += a b, Split: in 3xTF32 (the small cross terms first).
template <bool Split>
__device__ __forceinline__ void mma_sp(float c[4], const uint32_t a[4], const uint32_t alo[4],
                                       const uint32_t b[2], const uint32_t blo[2]) {
  if constexpr (Split) {
    mma::mma_tf32(c, alo, b);
    mma::mma_tf32(c, a, blo);
  }
  mma::mma_tf32(c, a, b);
}

// scan_rows over [kMaxC][kHalf] with compile-time trips: a thread's 16 rows are loaded at once and
// kept in registers for the second pass (scan_rows' run-time bounds made each pass a chain of
// dependent shared loads). The same additions in the same order: bit-identical results. add joins
// row add_row's value first.
template <bool Reverse>
__device__ __forceinline__ void scan_64x64(float* arr, float* part, float scale = 1.f,
                                           int add_row = -1, float add = 0.f) {
  constexpr int N = kHalf, S = kGradThreads / N, R = kMaxC / S;
  static_assert(kGradThreads % N == 0 && kMaxC % S == 0);
  const int x = threadIdx.x % N, s = threadIdx.x / N;
  float v[R];
  float acc = 0.f;
#pragma unroll
  for (int m = 0; m < R; ++m) {
    v[m] = arr[(R * s + m) * N + x];
    if (R * s + m == add_row) v[m] += add;
  }
#pragma unroll
  for (int m = 0; m < R; ++m) acc += v[m];
  part[threadIdx.x] = acc;
  __syncthreads();
  acc = 0.f;
  if constexpr (Reverse) {
#pragma unroll
    for (int s2 = S - 1; s2 > 0; --s2)
      if (s2 > s) acc += part[s2 * N + x];
#pragma unroll
    for (int m = R - 1; m >= 0; --m) {
      acc += v[m];
      arr[(R * s + m) * N + x] = acc * scale;
    }
  } else {
#pragma unroll
    for (int s2 = 0; s2 < S - 1; ++s2)
      if (s2 < s) acc += part[s2 * N + x];
#pragma unroll
    for (int m = 0; m < R; ++m) {
      acc += v[m];
      arr[(R * s + m) * N + x] = acc * scale;
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kGradThreads, 2)
    grads_v2_kernel(Args a, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                    __nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv) {
  using T = __nv_bfloat16;
  constexpr int C = kMaxC, K = kMaxKV, KH = kHalf;
  static_assert(C == KH, "one index for [C][C] and [C][kHalf]");
  // Blocks in (chunk, head, half) order, the half fastest: the two halves of a (chunk, head) run
  // together, so the second's reads of Aqk and Tm (32 KB) find them in L2, and the blocks that
  // run at once cover every head of a few chunks, whose rows of q, k, g, dq, dk, dg and prepared
  // blocks are contiguous (in chunk-fastest order they were 256-byte pieces 16 KB apart).
  const int64_t ch = blockIdx.x >> 1, c = ch / a.H, h = ch % a.H;
  const int L = a.clen[c];
  const int64_t t0 = a.ct0[c];  // (with L: one round trip, not two)
  if (L == 0) return;
  const int V = a.V, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int z = static_cast<int>(blockIdx.x & 1), x0 = z * KH;  // the half
  extern __shared__ __align__(16) unsigned char smem[];
  float* gam = reinterpret_cast<float*>(smem);  // [C][KH] Gam (log2 units), later dGam
  float* dGamL = gam + C * KH;                  // [KH]
  float* tq = dGamL + KH;                       // [C][C] (swizzled)
  float* tb = tq + C * C;                       // [C][C] -dR Delta^T, row i times beta_i
  float* b = tb + C * C;                        // [C]
  float* tkk = b + C;                           // [C]
  float* kd = tkk + C;                          // [C][KH] tiles (swizzled); scan partials first
  float* qu = kd + C * KH;
  float* ku = qu + C * KH;
  T* qs = reinterpret_cast<T*>(ku + C * KH);  // [C][KH]
  T* ks = qs + C * KH;                        // [C][KH]
  float* part = kd;                           // scan partials: before the tiles, after the owners
  float* dbs = qu;                            // [C][4] dbeta shares per 16 channels, at the end
  float* glpart = ku;                         // [4][KH] dGam_L's sums per row block, at the end
  const KdaChunkLayout& lay = a.lay;
  float* blk = a.blk(c, h);
  const float* dds = a.dds(c, h);
  for (int i = tid; i < C; i += kGradThreads) b[i] = i < L ? a.beta[(t0 + i) * a.H + h] : 0.f;
  {
    // grads_kernel's load phase (TC), tq and tb stored swizzled.
    const auto [q8, k8, g4, aq4, tm4, kk4, be] = grad_loads(a, q, k, blk, t0, h, L, z, tid);
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int e = 8 * (tid + kGradThreads * m);
      *reinterpret_cast<uint4*>(qs + qk_at(e / KH, e % KH)) = q8[m];
      *reinterpret_cast<uint4*>(ks + qk_at(e / KH, e % KH)) = k8[m];
    }
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int e = 4 * (tid + kGradThreads * m), i = e / C, j = e % C;
      const int s = i * C + (j ^ sw_pair(i));  // 4 consecutive columns stay together
      *reinterpret_cast<float4*>(gam + e) = g4[m];
      *reinterpret_cast<float4*>(tq + s) = aq4[m];
      const float4 t = tm4[m];
      *reinterpret_cast<float4*>(tb + s) =
          make_float4(t.x * be[m], t.y * be[m], t.z * be[m], t.w * be[m]);
      const float4 kk = kk4[m];
      float pr = (j < i ? t.x * kk.x : 0.f) + (j + 1 < i ? t.y * kk.y : 0.f) +
                 (j + 2 < i ? t.z * kk.z : 0.f) + (j + 3 < i ? t.w * kk.w : 0.f);
      for (int o = 8; o > 0; o >>= 1) pr += __shfl_xor_sync(0xffffffffu, pr, o);
      if ((tid & 15) == 0 && (i & 1) == z) tkk[i] = pr;
    }
  }
  // The owners' global reads (dO S0^T, dR S0^T, Delta dS^T at their rows and channel pairs): the
  // first combo's go out here, the second's after the first's MMAs.
  const int g = lane >> 2, cq4 = lane & 3;
  float2 f[2][2][2][3];
  const auto fetch = [&](int s, float2(&fs)[2][2][3]) {
    const int ci = w + 8 * s, p = ci >> 2, n0 = 16 * (ci & 3);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * p + g + 8 * hf, x = n0 + 8 * nt + 2 * cq4;
        const int64_t at = i * K + x0 + x;
        const float2 zero2 = make_float2(0.f, 0.f);
        const bool in = i < L;
        fs[nt][hf][0] = in ? *reinterpret_cast<const float2*>(blk + lay.dOS0() + at) : zero2;
        fs[nt][hf][1] = in ? *reinterpret_cast<const float2*>(blk + lay.dRS0() + at) : zero2;
        fs[nt][hf][2] = in ? *reinterpret_cast<const float2*>(dds + at) : zero2;
      }
  };
  fetch(0, f[0]);
  const float gL = tid < KH ? blk[lay.gL() + x0 + tid] : 0.f;
  __syncthreads();
  scan_64x64<false>(gam, part, 1.4426950408889634f);             // log2 e Gam
  const auto rrow = [](int bb) { return min(16 * bb, C - 1); };  // R_b's row
  {
    // dGam_L = e^Gam_L (S0 . dS) + sum_i (Delta dS^T)_i k_i e^(Gam_L - Gam_i): the first term
    // here, the sum from the owners' terms (which hold each factor) at the end.
    if (tid < KH) dGamL[tid] = ex2(gam[(L - 1) * KH + tid]) * gL;
    // The scaled tiles: kd = k e^(R_(b+1) - Gam), qu = q e^(Gam - R_b), ku = k e^(Gam - R_b).
    for (int e = tid; e < C * KH; e += kGradThreads) {
      const int i = e / KH, x = e % KH, bb = i >> 4, s = i * KH + (x ^ sw_tile(i));
      const float gi = gam[e], rb = gam[16 * bb * KH + x], rn = gam[rrow(bb + 1) * KH + x];
      const float kv = ld(ks, qk_at(i, x)), eu = ex2(gi - rb);
      kd[s] = kv * ex2(rn - gi);
      qu[s] = ld(qs, qk_at(i, x)) * eu;
      ku[s] = kv * eu;
    }
  }
  __syncthreads();
  float dgam[2][2][2][2];   // [combo][n-tile][row half][channel]
  float dbp[2][2] = {};     // [combo][row half]: the row's dbeta share over the 16 channels
  float glp[2][2][2] = {};  // [combo][n-tile][channel]: dGam_L's sum over the lane's rows
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const int ci = w + 8 * s, p = ci >> 2, cg = ci & 3, n0 = 16 * cg;
    // The owners' global reads: dO S0^T, dR S0^T, Delta dS^T at (row, channel pair).
    // R_p and R_(p+1) of this lane's columns; the diagonal block on MMAs where the range allows.
    // (Read again where used: registers are the limit here.)
    const auto rp = [&](int nt, int u) { return gam[16 * p * KH + n0 + 8 * nt + 2 * cq4 + u]; };
    const auto rn = [&](int nt, int u) {
      return gam[rrow(p + 1) * KH + n0 + 8 * nt + 2 * cq4 + u];
    };
    float range = 0.f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int x = n0 + 8 * nt + 2 * cq4 + u;
        range = fmaxf(range, gam[16 * p * KH + x] - gam[rrow(p + 1) * KH + x]);
      }
    const bool diag = mma::quad_max(range) <= kGradDiagMax;  // the same on every lane
    float oq[2][4] = {}, ok[2][4] = {}, oc[2][4] = {};
    // Rows 16 p: sQ, sK over column blocks r <= p (B = kd rows 16 r); the diagonal block (r = p)
    // masked and in 3xTF32, as exact as the direct loop it replaces (dg's cancellations show
    // tf32's 2^-11 there).
    const auto sqk = [&](auto diag_tag, int r) {
      constexpr bool D = decltype(diag_tag)::value;
      float cq[2][4] = {}, ck[2][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < 16; k0 += 8) {
        if constexpr (D) {  // one split A fragment at a time (registers), B loaded for each
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            uint32_t a[4], al[4];
            load_a_sw<false, true>(a, al, t ? tb : tq, 16 * p, 16 * r + k0, lane);
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
              uint32_t bb[2], bl[2];
              load_b_sw<true>(bb, bl, kd, 16 * r + k0, n0 + 8 * nt, lane);
              mma_sp<true>(t ? ck[nt] : cq[nt], a, al, bb, bl);
            }
          }
        } else {
          uint32_t aq[4], ak[4], unused[4];
          load_a_sw<false, false>(aq, unused, tq, 16 * p, 16 * r + k0, lane);
          load_a_sw<false, false>(ak, unused, tb, 16 * p, 16 * r + k0, lane);
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            uint32_t bb[2], bl[2];
            load_b_sw<false>(bb, bl, kd, 16 * r + k0, n0 + 8 * nt, lane);
            mma::mma_tf32(cq[nt], aq, bb);
            mma::mma_tf32(ck[nt], ak, bb);
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int x = n0 + 8 * nt + 2 * cq4 + u;
          const float d = ex2(rp(nt, u) - gam[rrow(r + 1) * KH + x]);
          oq[nt][u] += d * cq[nt][u];
          oq[nt][2 + u] += d * cq[nt][2 + u];
          ok[nt][u] += d * ck[nt][u];
          ok[nt][2 + u] += d * ck[nt][2 + u];
        }
    };
    for (int r = 0; r < p; ++r) sqk(std::false_type{}, r);
    if (diag) sqk(std::true_type{}, p);
    // Rows 16 p as columns: sC over row blocks p2 >= p (A = tq, tb transposed; B = qu, ku).
    const auto sc = [&](auto diag_tag, int p2) {
      constexpr bool D = decltype(diag_tag)::value;
      float cc[2][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < 16; k0 += 8) {
        if constexpr (D) {  // tq with qu, then tb with ku: one split A fragment at a time
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            uint32_t a[4], al[4];
            load_a_sw<true, true>(a, al, t ? tb : tq, 16 * p, 16 * p2 + k0, lane);
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
              uint32_t bb[2], bl[2];
              load_b_sw<true>(bb, bl, t ? ku : qu, 16 * p2 + k0, n0 + 8 * nt, lane);
              mma_sp<true>(cc[nt], a, al, bb, bl);
            }
          }
        } else {
          uint32_t aq[4], ak[4], unused[4];
          load_a_sw<true, false>(aq, unused, tq, 16 * p, 16 * p2 + k0, lane);
          load_a_sw<true, false>(ak, unused, tb, 16 * p, 16 * p2 + k0, lane);
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            uint32_t bq[2], bk[2], bl[2];
            load_b_sw<false>(bq, bl, qu, 16 * p2 + k0, n0 + 8 * nt, lane);
            load_b_sw<false>(bk, bl, ku, 16 * p2 + k0, n0 + 8 * nt, lane);
            mma::mma_tf32(cc[nt], aq, bq);
            mma::mma_tf32(cc[nt], ak, bk);
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int x = n0 + 8 * nt + 2 * cq4 + u;
          const float d = ex2(gam[16 * p2 * KH + x] - rn(nt, u));
          oc[nt][u] += d * cc[nt][u];
          oc[nt][2 + u] += d * cc[nt][2 + u];
        }
    };
    if (diag) sc(std::true_type{}, p);
    for (int p2 = p + 1; p2 < 4; ++p2) sc(std::false_type{}, p2);
    if (s == 0) fetch(1, f[1]);
      // The owners: (row 16 p + g + 8 hf, channels n0 + 8 nt + 2 c + u) = accumulator element
      // [nt][2 hf + u]. (dbp and glp still add nt = 0 before 1 and hf = 0 before 1.)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * p + g + 8 * hf;
      uint32_t pq[2] = {}, pk[2] = {};  // dq and dk of channels n0 + 8 nt + 2 c + u, bf16 pairs
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int x = n0 + 8 * nt + 2 * cq4;
        dgam[s][nt][hf][0] = dgam[s][nt][hf][1] = 0.f;
        if (i >= L) continue;
        const float2 f0 = f[s][nt][hf][0], f1 = f[s][nt][hf][1], f2 = f[s][nt][hf][2];
        const float dqg[2] = {f0.x * a.scale, f0.y * a.scale}, dkb[2] = {-f1.x, -f1.y},
                    dkgl[2] = {f2.x, f2.y};
        float gi[2], gl[2], qi[2], ki[2];
        load_n<2>(gam + i * KH + x, gi);
        load_n<2>(gam + (L - 1) * KH + x, gl);
        load_n<2>(qs + qk_at(i, x), qi);
        load_n<2>(ks + qk_at(i, x), ki);
        const float bi = b[i];
        float sQ[2], sK[2], sC[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const float fo = ex2(gi[u] - rp(nt, u));
          sQ[u] = fo * oq[nt][2 * hf + u];
          sK[u] = fo * ok[nt][2 * hf + u];
          sC[u] = ex2(rn(nt, u) - gi[u]) * oc[nt][2 * hf + u];
        }
        if (!diag) {  // strong decay: this block's own pairs one by one
          for (int j = 16 * p; j <= i; ++j) {
            float gj[2], kj[2];
            load_n<2>(gam + j * KH + x, gj);
            load_n<2>(ks + qk_at(j, x), kj);
            const int at = i * C + (j ^ sw_pair(i));
            const float aq = tq[at], ak = tb[at];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
              const float ek = ex2(gi[u] - gj[u]) * kj[u];
              sQ[u] += aq * ek;
              sK[u] += ak * ek;
            }
          }
          for (int i2 = i; i2 < min(L, 16 * p + 16); ++i2) {
            float gj[2], qj[2], kj[2];
            load_n<2>(gam + i2 * KH + x, gj);
            load_n<2>(qs + qk_at(i2, x), qj);
            load_n<2>(ks + qk_at(i2, x), kj);
            const int at = i2 * C + (i ^ sw_pair(i2));
            const float aq = tq[at], ak = tb[at];
#pragma unroll
            for (int u = 0; u < 2; ++u) sC[u] += ex2(gj[u] - gi[u]) * (aq * qj[u] + ak * kj[u]);
          }
        }
        float dQ[2], dK[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const float eg = ex2(gi[u]), elg = ex2(gl[u] - gi[u]);
          dQ[u] = dqg[u] * eg + sQ[u];
          dK[u] = bi * eg * dkb[u] + dkgl[u] * elg + (sK[u] + sC[u]);
          float dG = dqg[u] * qi[u] * eg + dkb[u] * bi * ki[u] * eg - dkgl[u] * ki[u] * elg +
                     qi[u] * sQ[u] + ki[u] * (sK[u] - sC[u]);
          dbp[s][hf] += dkb[u] * ki[u] * eg;
          glp[s][nt][u] += dkgl[u] * ki[u] * elg;
          dgam[s][nt][hf][u] = dG;
        }
        pq[nt] = mma::pack_bf16(dQ[0], dQ[1]);
        pk[nt] = mma::pack_bf16(dK[0], dK[1]);
      }
      // The row's 16 channels (32 bytes, one sector) lie on the quad's lanes as pairs 2 c and
      // 8 + 2 c; 4-byte stores of them half-filled the sectors of each store (ncu: 22 of 32 bytes
      // a sector). Lanes c and c ^ 1 swap a pair so that each holds 4 consecutive channels (even
      // c: 2 c..2 c + 3, odd c: 8 + 2 c - 2..8 + 2 c + 1): one 8-byte store a lane, whole sectors.
      const bool odd = cq4 & 1;
      const uint32_t rq = __shfl_xor_sync(0xffffffffu, odd ? pq[0] : pq[1], 1);
      const uint32_t rk = __shfl_xor_sync(0xffffffffu, odd ? pk[0] : pk[1], 1);
      if (i < L) {
        const int64_t at = ((t0 + i) * a.H + h) * K + x0 + n0 + 8 * odd + 4 * (cq4 >> 1);
        *reinterpret_cast<uint2*>(dq + at) = odd ? make_uint2(rq, pq[1]) : make_uint2(pq[0], rq);
        *reinterpret_cast<uint2*>(dk + at) = odd ? make_uint2(rk, pk[1]) : make_uint2(pk[0], rk);
      }
    }
  }
  // dbeta's reads of dR and v for the rows of the half's parity, i = 2 (w + 8 m) + z, go out
  // now, to arrive during the reverse cumsum.
  constexpr int kDbRows = kMaxC / 2 / (kGradThreads / 32);
  float dr[kDbRows][4], vv[kDbRows][4];
#pragma unroll
  for (int m = 0; m < kDbRows; ++m) {
    const int i = 2 * (w + kGradThreads / 32 * m) + z;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int y = lane + 32 * n;
      const bool in = i < L && y < V;
      dr[m][n] = in ? a.bblk(c, h)[lay.dR() + i * V + y] : 0.f;
      vv[m][n] = in ? ld(v, ((t0 + i) * a.H + h) * V + y) : 0.f;
    }
  }
  float dbq[2][2];
#pragma unroll
  for (int s = 0; s < 2; ++s) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) dbq[s][hf] = mma::quad_sum(dbp[s][hf]);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int u = 0; u < 2; ++u)  // over the 8 row groups g, in a fixed order
#pragma unroll
        for (int o = 4; o < 32; o <<= 1)
          glp[s][nt][u] += __shfl_xor_sync(0xffffffffu, glp[s][nt][u], o);
  }
  __syncthreads();  // every warp is done with gam, qs, ks and the tiles
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const int ci = w + 8 * s, p = ci >> 2, cg = ci & 3;
    // As dq's stores: lanes c and c ^ 1 swap a pair, one 16-byte store of 4 consecutive
    // channels a lane (2 rows of a quarter warp on the same 16 banks: 2-way, where the two
    // 8-byte stores of 8 rows on the same 8 banks were 8-way each).
    const bool odd = cq4 & 1;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * p + g + 8 * hf;
      const float(&d0)[2] = dgam[s][0][hf], (&d1)[2] = dgam[s][1][hf];
      const float r0 = __shfl_xor_sync(0xffffffffu, odd ? d0[0] : d1[0], 1);
      const float r1 = __shfl_xor_sync(0xffffffffu, odd ? d0[1] : d1[1], 1);
      *reinterpret_cast<float4*>(gam + i * KH + 16 * cg + 8 * odd + 4 * (cq4 >> 1)) =
          odd ? make_float4(r0, r1, d1[0], d1[1]) : make_float4(d0[0], d0[1], r0, r1);
      if (cq4 == 0) dbs[i * 4 + cg] = dbq[s][hf];
    }
    if (g == 0)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
        *reinterpret_cast<float2*>(glpart + p * KH + 16 * cg + 8 * nt + 2 * cq4) =
            make_float2(glp[s][nt][0], glp[s][nt][1]);
  }
  __syncthreads();
  // dg = reverse cumsum of dGam (rows past L hold zero), dGam_L joining row L - 1's.
  {
    const int x = tid % KH;
    const float add =
        dGamL[x] + glpart[x] + glpart[KH + x] + glpart[2 * KH + x] + glpart[3 * KH + x];
    scan_64x64<true>(gam, part, 1.f, L - 1, add);
  }
  for (int e = tid; e < L * KH; e += kGradThreads) {
    const int i = e / KH, x = e % KH;
    a.dg[((t0 + i) * a.H + h) * K + x0 + x] = gam[e];
  }
  // As grads_kernel (TC): v . dR, dv and Tm . KK of the rows of the half's parity, every row's
  // channel shares, into the U rows of the prepared block (dbeta_sum_kernel adds the halves).
#pragma unroll
  for (int m = 0; m < kDbRows; ++m) {
    const int i1 = 2 * (w + kGradThreads / 32 * m) + z, i2 = i1 + 1 - 2 * z;
    if (i1 < L) {
      float s = 0.f;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int y = lane + 32 * n;
        if (y < V) {
          s += vv[m][n] * dr[m][n];
          st(dv, ((t0 + i1) * a.H + h) * V + y, b[i1] * dr[m][n]);
        }
      }
      if (lane == 0) s += tkk[i1];
      if (lane < 4) s += dbs[i1 * 4 + lane];
      s = warp_sum(s);
      if (lane == 0) blk[lay.dbeta_parts() + z * C + i1] = s;
    }
    if (i2 < L) {
      float s = lane < 4 ? dbs[i2 * 4 + lane] : 0.f;
      s = warp_sum(s);
      if (lane == 0) blk[lay.dbeta_parts() + z * C + i2] = s;
    }
  }
}

}  // namespace

namespace kda_chunk {

void grads_v2(Context& ctx, const Args& a, const Tensor& q, const Tensor& k, const Tensor& v,
              Tensor& dq, Tensor& dk, Tensor& dv) {
  using T = __nv_bfloat16;
  allow_smem(grads_v2_kernel, kGradV2Bytes);
  grads_v2_kernel<<<static_cast<unsigned>(kGradSplit * a.nchunks * a.H), kGradThreads, kGradV2Bytes,
                    stream(ctx)>>>(a, ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(dq), ptr<T>(dk),
                                   ptr<T>(dv));
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace kda_chunk

}  // namespace mt::ops::cuda
