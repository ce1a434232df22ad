// Step 5 of the chunked KDA core (kda_chunk.cu describes the algorithm): the gradient kernel,
// per (chunk, head) or, for bf16 at chunk 64 and K 128, per (chunk, head, channel half) with the
// pairs across 16-row blocks on tensor cores, dbeta_sum_kernel then adding the halves' dbeta
// shares; and the launcher, grads, which runs grads_v2_kernel (kda_chunk_grads_v2.cu) in
// grads_kernel's place where a.kernels.grads_v2 says so. What the two kernels share is in
// kda_chunk_grads.cuh.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kda_chunk_common.cuh"
#include "ops/cuda/kda_chunk_grads.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/kda_chunk_layout.h"
#include "ops/kda_prep_path.h"

namespace mt::ops::cuda {

namespace {

using namespace kda_chunk;

// Shared memory of the gradient kernel over KB channels: [Gam, later dGam (Wide)] [dGam_L (Wide)]
// [scan partials (Wide)] [tq] [tb] [beta] [Tm.KK row halves] (TC: [the three block-pair tiles])
// [q, later (with k) the dbeta shares in fp32] [k]. q and k keep the tensors' dtype: bf16 rows
// are exact in bf16 and take half the room of fp32.
template <typename T>
size_t grads_smem(int C, int KB) {
  return sizeof(Wide<T>) * (C * KB + KB + kGradThreads) + sizeof(float) * (2 * C * C + 3 * C) +
         sizeof(T) * 2 * C * KB;
}

// TC: three fp32 tiles of the 48 rows of three 16-row blocks, with rows of 72 floats (8 mod 32:
// conflict-free B fragments).
constexpr int kTileLd = kHalf + 8;
constexpr size_t kGradTileFloats = 48 * kTileLd;
constexpr size_t kGradTileBytes = 3 * sizeof(float) * kGradTileFloats;

// In-place inclusive cumsum of the rows of a [C][n] shared array (Reverse: from the last row
// up), over all kGradThreads threads instead of one per column: thread t takes segment t / n of
// column t % n, sums it, then starts from the totals of the segments before it (summed in
// segment order: bit-repeatable) and rewrites its rows, times `scale`. part holds kGradThreads
// values; n <= kGradThreads. Ends with a barrier; expects one before (a's rows complete).
template <bool Reverse, typename W>
__device__ void scan_rows(W* arr, int C, int n, W* part, W scale = 1) {
  const int nseg = kGradThreads / n, rows = (C + nseg - 1) / nseg;
  const int x = threadIdx.x % n, s = threadIdx.x / n;
  const bool mine = s < nseg;
  const int lo = mine ? min(C, s * rows) : 0, hi = mine ? min(C, lo + rows) : 0;
  W acc = 0;
  for (int i = lo; i < hi; ++i) acc += arr[i * n + x];
  if (mine) part[threadIdx.x] = acc;  // = part[s * n + x]
  __syncthreads();
  if (mine) {
    acc = 0;
    if constexpr (Reverse) {
      for (int s2 = nseg - 1; s2 > s; --s2) acc += part[s2 * n + x];
      for (int i = hi - 1; i >= lo; --i) {
        acc += arr[i * n + x];
        arr[i * n + x] = acc * scale;
      }
    } else {
      for (int s2 = 0; s2 < s; ++s2) acc += part[s2 * n + x];
      for (int i = lo; i < hi; ++i) {
        acc += arr[i * n + x];
        arr[i * n + x] = acc * scale;
      }
    }
  }
  __syncthreads();
}

// TC: the pair sums of grads_kernel whose two rows lie in different 16-row blocks, on tensor
// cores, with the bounded factors of prep_block_pairs (R_b = Gam at row 16 b; Gam only falls):
//   sQ_i = sum_(j in r < p) tq_ij e^(G_i - G_j) k_j
//        = e^(G_i - R_p) sum_r e^(R_p - R_(r+1)) sum_j tq_ij [k_j e^(R_(r+1) - G_j)]   (i in p),
//   sC_i = sum_(i2 in p > r) e^(G_i2 - G_i) (tq_i2i q_i2 + tb_i2i k_i2)
//        = e^(R_(r+1) - G_i) sum_p e^(R_p - R_(r+1)) sum_i2 (tq_i2i [q_i2 e^(G_i2 - R_p)]
//          + tb_i2i [k_i2 e^(G_i2 - R_p)])                                           (i in r),
// sK as sQ with tb. Every factor is at most one. In: kd = the bracketed k of blocks 0-2, qu and
// ku = the bracketed q and k of blocks 1-3 (rows 16 (p - 1) ..), over the block's kHalf
// channels. Out, in the same tiles: qu = sQ's and ku = sK's sums over r for blocks 1-3, kd =
// sC's sum over p for blocks 0-2, all before the outer factor (the owners apply it). gam in log2
// units (Gam log2 e). A warp per (block, 16 columns) item, three items per warp: 12 items of sQ/sK
// (sharing kd), 12 of sC.
__device__ __forceinline__ void grads_block_pairs(const float* gam, const float* tq,
                                                  const float* tb, float* kd, float* qu,
                                                  float* ku) {
  constexpr int C = kMaxC, K = kHalf, LD = kTileLd, NW = kGradThreads / 32, NCG = K / 16;
  static_assert(6 * NCG == 3 * NW, "three items per warp");
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, c = lane & 3;
  const auto ref = [&](int b, int x) { return gam[16 * b * K + x]; };  // R_b
  float out[3][2][2][4] = {};  // [item][sQ or sC, sK][n-tile][fragment]
#pragma unroll
  for (int u = 0; u < 3; ++u) {
    const int item = w + NW * u, cg = item % NCG, n0 = 16 * cg;
    if (item < 3 * NCG) {
      const int p = 1 + item / NCG;
      for (int r = 0; r < p; ++r) {
        float cq[2][4] = {}, ck[2][4] = {};
#pragma unroll
        for (int k0 = 16 * r; k0 < 16 * r + 16; k0 += 8) {
          uint32_t aq[4], ak[4];
          mma::load_a_tf32<false>(aq, tq, C, 16 * p, k0, lane);
          mma::load_a_tf32<false>(ak, tb, C, 16 * p, k0, lane);
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            uint32_t b[2];
            mma::load_b_tf32(b, kd, LD, k0, n0 + 8 * nt, lane);
            mma::mma_tf32(cq[nt], aq, b);
            mma::mma_tf32(ck[nt], ak, b);
          }
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int x = n0 + 8 * nt + 2 * c + (e & 1);
            const float d = ex2(ref(p, x) - ref(r + 1, x));
            out[u][0][nt][e] += d * cq[nt][e];
            out[u][1][nt][e] += d * ck[nt][e];
          }
      }
    } else {
      const int r = (item - 3 * NCG) / NCG;
      for (int p = r + 1; p < 4; ++p) {
        float cc[2][4] = {};
        // A(m, k) = tq[(16 p + k) C + 16 r + m]: block (p, r) transposed; B rows 16 (p - 1) on.
        const float* tqp = tq + 16 * p * C;
        const float* tbp = tb + 16 * p * C;
        const float* qup = qu + 16 * (p - 1) * LD;
        const float* kup = ku + 16 * (p - 1) * LD;
#pragma unroll
        for (int k0 = 0; k0 < 16; k0 += 8) {
          uint32_t aq[4], ak[4];
          mma::load_a_tf32<true>(aq, tqp, C, 16 * r, k0, lane);
          mma::load_a_tf32<true>(ak, tbp, C, 16 * r, k0, lane);
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            uint32_t bq[2], bk[2];
            mma::load_b_tf32(bq, qup, LD, k0, n0 + 8 * nt, lane);
            mma::load_b_tf32(bk, kup, LD, k0, n0 + 8 * nt, lane);
            mma::mma_tf32(cc[nt], aq, bq);
            mma::mma_tf32(cc[nt], ak, bk);
          }
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int x = n0 + 8 * nt + 2 * c + (e & 1);
            out[u][0][nt][e] += ex2(ref(p, x) - ref(r + 1, x)) * cc[nt][e];
          }
      }
    }
  }
  __syncthreads();  // every warp is done reading kd, qu, ku
  const int g = lane >> 2;
#pragma unroll
  for (int u = 0; u < 3; ++u) {
    const int item = w + NW * u, cg = item % NCG;
    const bool rows_of_i = item < 3 * NCG;  // sQ/sK of block p: rows 16 (p - 1) of qu, ku
    const int row0 = rows_of_i ? 16 * (item / NCG) : 16 * ((item - 3 * NCG) / NCG);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int at = (row0 + g + 8 * (e >> 1)) * LD + 16 * cg + 8 * nt + 2 * c + (e & 1);
        if (rows_of_i) {
          qu[at] = out[u][0][nt][e];
          ku[at] = out[u][1][nt][e];
        } else {
          kd[at] = out[u][0][nt][e];
        }
      }
  }
  __syncthreads();
}

// One thread per (token i, channel x) of the block's channels: its dq, dk, dGam, and its share of
// dbeta. The pair terms of row i and of column i are summed first (sQ, sK, sC) and scaled by the
// owner's q and k once: dQ gets sQ, dGam q sQ, and so on, instead of three products per pair.
// TC (bf16, chunk 64, K 128): a block per half of the channels (blockIdx.z; kGradSplit), the
// pairs across 16-row blocks on tensor cores (grads_block_pairs), the direct loops only over
// the pairs inside the owner's block; the halves' dbeta shares go to the U rows of the prepared
// block (dead in backward) and dbeta_sum_kernel adds them. Otherwise one block per (chunk, head)
// writes dbeta itself.
template <typename T, bool TC>
__global__ void __launch_bounds__(kGradThreads, TC ? 2 : 1)
    grads_kernel(Args a, const T* q, const T* k, const T* v, T* dq, T* dk, T* dv) {
  using W = Wide<T>;
  const int64_t c = blockIdx.x, h = blockIdx.y;
  const int L = a.clen[c];
  if (L == 0) return;
  const int64_t t0 = a.ct0[c];
  const int C = TC ? kMaxC : a.C, K = TC ? kMaxKV : a.K, V = a.V, tid = threadIdx.x;
  const int z = TC ? static_cast<int>(blockIdx.z) : 0, KB = TC ? kHalf : K, x0 = z * KB;
  extern __shared__ __align__(16) unsigned char smem[];
  W* gam = reinterpret_cast<W*>(smem);                        // [C][KB], later dGam
  W* dGamL = gam + C * KB;                                    // [KB]
  W* part = dGamL + KB;                                       // [kGradThreads]
  float* tq = reinterpret_cast<float*>(part + kGradThreads);  // [C][C]
  float* tb = tq + C * C;  // [C][C] -dR Delta^T, row i scaled by beta_i
  float* b = tb + C * C;
  float* tkk = b + C;       // TC: [C] the rows of Tm . KK (of the half's parity)
  float* kd = tkk + 2 * C;  // TC: the block-pair tiles (grads_block_pairs)
  float* qu = kd + kGradTileFloats;
  float* ku = qu + kGradTileFloats;
  T* qs = reinterpret_cast<T*>(TC ? ku + kGradTileFloats : kd);  // [C][KB]
  T* ks = qs + C * KB;                                           // [C][KB]
  const KdaChunkLayout& lay = a.lay;
  float* blk = a.blk(c, h);
  const float* dds = a.dds(c, h);  // backward's products (ops/kda_chunk_layout.h)
  // e^(difference of Gam): TC keeps Gam in log2 units (scan below), so one ex2 each.
  const auto expg = [](W d) {
    if constexpr (TC)
      return ex2(d);
    else
      return __expf(static_cast<float>(d));
  };
  for (int i = tid; i < C; i += kGradThreads) b[i] = i < L ? a.beta[(t0 + i) * a.H + h] : 0.f;
  if constexpr (TC) {
    const auto [q8, k8, g4, aq4, tm4, kk4, be] = grad_loads(a, q, k, blk, t0, h, L, z, tid);
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int e = 8 * (tid + kGradThreads * m);
      *reinterpret_cast<uint4*>(qs + e) = q8[m];
      *reinterpret_cast<uint4*>(ks + e) = k8[m];
    }
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int e = 4 * (tid + kGradThreads * m), i = e / kMaxC, j = e % kMaxC;
      *reinterpret_cast<float4*>(gam + e) = g4[m];
      *reinterpret_cast<float4*>(tq + e) = aq4[m];
      const float4 t = tm4[m];
      *reinterpret_cast<float4*>(tb + e) =
          make_float4(t.x * be[m], t.y * be[m], t.z * be[m], t.w * be[m]);
      // Row i's Tm . KK: 16 lanes hold its 64 columns (xor 8 .. 1 stays in them), fixed order.
      const float4 kk = kk4[m];
      float pr = (j < i ? t.x * kk.x : 0.f) + (j + 1 < i ? t.y * kk.y : 0.f) +
                 (j + 2 < i ? t.z * kk.z : 0.f) + (j + 3 < i ? t.w * kk.w : 0.f);
      for (int o = 8; o > 0; o >>= 1) pr += __shfl_xor_sync(0xffffffffu, pr, o);
      if ((tid & 15) == 0 && (i & 1) == z) tkk[i] = pr;
    }
    __syncthreads();
  } else {
    for (int e = tid; e < C * KB; e += kGradThreads) {
      const int i = e / KB, x = e % KB;
      const int64_t src = ((t0 + i) * a.H + h) * K + x0 + x;
      if (i < L) {
        qs[e] = q[src];
        ks[e] = k[src];
      } else {
        st(qs, e, 0.f);
        st(ks, e, 0.f);
      }
      gam[e] = i < L ? static_cast<W>(a.g[src]) : W(0);
    }
    for (int e = tid; e < C * C; e += kGradThreads) {
      tq[e] = blk[lay.Aqk() + e];
      tb[e] = blk[lay.Tm() + e];
    }
    __syncthreads();
    for (int e = tid; e < C * C; e += kGradThreads) tb[e] *= b[e / C];
  }
  scan_rows<false>(gam, C, KB, part, TC ? W(1.4426950408889634) : W(1));  // Gam (TC: log2 e Gam)
  // dGam_L[x] = sum_i (Delta dS^T)[i][x] kl[i][x] + e^Gam_L (S0 . dS)[x]: the block's threads
  // split a channel's rows (rows s, s + nseg, ..., coalesced global loads), summed per channel in
  // segment order below (bit-repeatable).
  {
    const int nseg = kGradThreads / KB, x = tid % KB, s = tid / KB;
    W acc = 0;
    if (s < nseg) {
      const W gl = gam[(L - 1) * KB + x];
      if constexpr (TC) {
        constexpr int NS = kGradThreads / kHalf, R = kMaxC / NS;  // TC: all reads at once
        float kl[R];
#pragma unroll
        for (int m = 0; m < R; ++m) {
          const int i = s + NS * m;
          kl[m] = i < L ? dds[i * K + x0 + x] : 0.f;
        }
#pragma unroll
        for (int m = 0; m < R; ++m) {
          const int i = s + NS * m;
          acc += kl[m] * ld(ks, i * KB + x) * expg(gl - gam[i * KB + x]);
        }
      } else {
        for (int i = s; i < L; i += nseg)
          acc += dds[i * K + x0 + x] * ld(ks, i * KB + x) * expg(gl - gam[i * KB + x]);
      }
      part[tid] = acc;
    }
  }
  if constexpr (TC) {
    static_assert(std::is_same_v<W, float>);
    constexpr int KH = kHalf, LD = kTileLd;
    for (int e = tid; e < 48 * KH; e += kGradThreads) {
      const int i = e / KH, x = e % KH, bi = i >> 4;  // kd: row i (blocks 0-2); qu, ku: i + 16
      const float gd = gam[i * KH + x], gu = gam[(i + 16) * KH + x];
      const float rr = gam[16 * (bi + 1) * KH + x];
      kd[i * LD + x] = ld(ks, i * KH + x) * expg(rr - gd);
      const float eu = expg(gu - rr);
      qu[i * LD + x] = ld(qs, (i + 16) * KH + x) * eu;
      ku[i * LD + x] = ld(ks, (i + 16) * KH + x) * eu;
    }
  }
  __syncthreads();
  if (tid < KB) {
    const int nseg = kGradThreads / KB;
    W s = 0;
    for (int s2 = 0; s2 < nseg; ++s2) s += part[s2 * KB + tid];
    dGamL[tid] = expg(gam[(L - 1) * KB + tid]) * blk[lay.gL() + x0 + tid] + s;
  }
  if constexpr (TC)
    grads_block_pairs(gam, tq, tb, kd, qu, ku);  // (its barriers publish dGam_L too)
  else
    __syncthreads();
  // The owners: TC gives each thread two adjacent channels of a row (8-byte shared loads, and
  // the broadcast tq/tb loads serve both), elsewhere one. The three global reads go out one
  // owner ahead (they were the loop's latency).
  constexpr int NCH = TC ? 2 : 1;
  const int per_row = KB / NCH, owners = (C * per_row + kGradThreads - 1) / kGradThreads;
  const auto lw = [](const auto* p, auto& o) { load_n<NCH>(p, o); };
  const auto lt = [](const T* p, float(&o)[NCH]) { load_n<NCH>(p, o); };
  const auto fetch = [&](int r, float(&f)[3][NCH]) {
    const int o = tid + r * kGradThreads, i = o / per_row, x = NCH * (o % per_row);
    if (r < owners && o < C * per_row && i < L) {
      const int64_t at = i * K + x0 + x;
      lw(blk + lay.dOS0() + at, f[0]);
      lw(blk + lay.dRS0() + at, f[1]);
      lw(dds + at, f[2]);
    }
  };
  W dgam[kOwnersMax];
  float dbx[kOwnersMax];
  float nxt[3][NCH] = {};
  fetch(0, nxt);
#pragma unroll 1
  for (int r = 0; r < owners; ++r) {
    const int o = tid + r * kGradThreads, i = o / per_row, x = NCH * (o % per_row);
    float dqg[NCH], dkb[NCH], dkgl[NCH];
#pragma unroll
    for (int u = 0; u < NCH; ++u) {
      dqg[u] = nxt[0][u] * a.scale;
      dkb[u] = -nxt[1][u];
      dkgl[u] = nxt[2][u];
      dgam[NCH * r + u] = 0;
      dbx[NCH * r + u] = 0.f;
    }
    fetch(r + 1, nxt);
    if (i >= L || o >= C * per_row) continue;
    W gi[NCH], gl[NCH];
    float qi[NCH], ki[NCH], eg[NCH], elg[NCH];
    lw(gam + i * KB + x, gi);
    lw(gam + (L - 1) * KB + x, gl);
    lt(qs + i * KB + x, qi);
    lt(ks + i * KB + x, ki);
    const float bi = b[i];
#pragma unroll
    for (int u = 0; u < NCH; ++u) {
      eg[u] = expg(gi[u]);
      elg[u] = expg(gl[u] - gi[u]);
    }
    // As row i of the pairs (j <= i): sQ = sum tq_ij e_ij k_j, sK = sum tb_ij e_ij k_j.
    // TC: j and i2 within i's 16-row block here, the other blocks' sums from the tiles.
    const int ib = i >> 4, blk0 = TC ? 16 * ib : 0, blk_end = TC ? min(L, 16 * ib + 16) : L;
    W sQ[NCH] = {}, sK[NCH] = {}, sC[NCH] = {};
    for (int j = blk0; j <= i; ++j) {
      W gj[NCH];
      float kj[NCH];
      lw(gam + j * KB + x, gj);
      lt(ks + j * KB + x, kj);
      const float aq = tq[i * C + j], ak = tb[i * C + j];
#pragma unroll
      for (int u = 0; u < NCH; ++u) {
        const float ek = expg(gi[u] - gj[u]) * kj[u];
        sQ[u] += aq * ek;
        sK[u] += ak * ek;
      }
    }
    // As column i (rows i2 >= i): sC = sum e_i2i (tq_i2i q_i2 + tb_i2i k_i2).
    for (int i2 = i; i2 < blk_end; ++i2) {
      W gj[NCH];
      float qj[NCH], kj[NCH];
      lw(gam + i2 * KB + x, gj);
      lt(qs + i2 * KB + x, qj);
      lt(ks + i2 * KB + x, kj);
      const float aq = tq[i2 * C + i], ak = tb[i2 * C + i];
#pragma unroll
      for (int u = 0; u < NCH; ++u) sC[u] += expg(gj[u] - gi[u]) * (aq * qj[u] + ak * kj[u]);
    }
    if constexpr (TC) {
      if (ib > 0) {
        float tu[NCH], tk[NCH], gr[NCH];
        lw(qu + (i - 16) * kTileLd + x, tu);
        lw(ku + (i - 16) * kTileLd + x, tk);
        lw(gam + 16 * ib * KB + x, gr);
#pragma unroll
        for (int u = 0; u < NCH; ++u) {
          const float f = expg(gi[u] - gr[u]);
          sQ[u] += f * tu[u];
          sK[u] += f * tk[u];
        }
      }
      if (ib < 3) {
        float td[NCH], gr[NCH];
        lw(kd + i * kTileLd + x, td);
        lw(gam + 16 * (ib + 1) * KB + x, gr);
#pragma unroll
        for (int u = 0; u < NCH; ++u) sC[u] += expg(gr[u] - gi[u]) * td[u];
      }
    }
    float dQ[NCH], dK[NCH];
#pragma unroll
    for (int u = 0; u < NCH; ++u) {
      dQ[u] = dqg[u] * eg[u] + static_cast<float>(sQ[u]);
      dK[u] = bi * eg[u] * dkb[u] + dkgl[u] * elg[u] + static_cast<float>(sK[u] + sC[u]);
      W dG = static_cast<W>(dqg[u]) * qi[u] * eg[u] + static_cast<W>(dkb[u]) * bi * ki[u] * eg[u] -
             static_cast<W>(dkgl[u]) * ki[u] * elg[u] + qi[u] * sQ[u] + ki[u] * (sK[u] - sC[u]);
      dbx[NCH * r + u] = dkb[u] * ki[u] * eg[u];
      if (i == L - 1) dG += dGamL[x + u];
      dgam[NCH * r + u] = dG;
    }
    const int64_t at = ((t0 + i) * a.H + h) * K + x0 + x;
    if constexpr (NCH == 2) {
      *reinterpret_cast<__nv_bfloat162*>(dq + at) = __floats2bfloat162_rn(dQ[0], dQ[1]);
      *reinterpret_cast<__nv_bfloat162*>(dk + at) = __floats2bfloat162_rn(dK[0], dK[1]);
    } else {
      st(dq, at, dQ[0]);
      st(dk, at, dK[0]);
    }
  }
  // TC: dbeta's reads of dR and v for the rows of the half's parity, i = 2 (w + 8 m) + z, go out
  // now, to arrive during the reverse cumsum.
  constexpr int kDbRows = kMaxC / 2 / (kGradThreads / 32);
  float dr[kDbRows][4], vv[kDbRows][4];
  if constexpr (TC) {
    const int lane = tid & 31, w = tid >> 5;
#pragma unroll
    for (int m = 0; m < kDbRows; ++m) {
      const int i = 2 * (w + kGradThreads / 32 * m) + z;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int y = lane + 32 * n;
        const bool ok = i < L && y < V;
        dr[m][n] = ok ? a.bblk(c, h)[lay.dR() + i * V + y] : 0.f;
        vv[m][n] = ok ? ld(v, ((t0 + i) * a.H + h) * V + y) : 0.f;
      }
    }
  }
  __syncthreads();  // every thread is done reading gam, qs and ks
  // The dbeta shares in fp32 over q and k (together at least C KB floats: sizeof(T) >= 2).
  float* dbs = reinterpret_cast<float*>(qs);
#pragma unroll 1
  for (int r = 0; r < owners; ++r) {
    const int o = tid + r * kGradThreads;
    if (o < C * per_row)
#pragma unroll
      for (int u = 0; u < NCH; ++u) {
        gam[NCH * o + u] = dgam[NCH * r + u];
        dbs[NCH * o + u] = dbx[NCH * r + u];
      }
  }
  __syncthreads();
  // dg = reverse cumsum of dGam over the chunk, per channel (rows past L hold zero).
  scan_rows<true>(gam, C, KB, part);
  for (int e = tid; e < L * KB; e += kGradThreads) {
    const int i = e / KB, x = e % KB;
    a.dg[((t0 + i) * a.H + h) * K + x0 + x] = static_cast<float>(gam[e]);
  }
  // dbeta_i = v_i . dR_i + sum_x (its channel shares) + sum_j ta_ij KK_ij; dv = beta dR.
  if constexpr (TC) {
    // The half z: v . dR, dv and Tm . KK of the rows of its parity (i1), every row's share of
    // its channels (i1 and the other parity's i2), into the U rows of the prepared block.
    const int lane = tid & 31, w = tid >> 5;
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
        for (int x = lane; x < KB; x += 32) s += dbs[i1 * KB + x];
        s = warp_sum(s);
        if (lane == 0) blk[lay.dbeta_parts() + z * C + i1] = s;
      }
      if (i2 < L) {
        float s = 0.f;
        for (int x = lane; x < KB; x += 32) s += dbs[i2 * KB + x];
        s = warp_sum(s);
        if (lane == 0) blk[lay.dbeta_parts() + z * C + i2] = s;
      }
    }
  } else {
    for (int i = tid >> 5; i < L; i += kGradThreads / 32) {
      const int lane = tid & 31;
      float s = 0.f;
      for (int y = lane; y < V; y += 32) {
        const int64_t at = ((t0 + i) * a.H + h) * V + y;
        const float r = a.bblk(c, h)[lay.dR() + i * V + y];
        s += ld(v, at) * r;
        st(dv, at, b[i] * r);
      }
      for (int j = lane; j < i; j += 32) s += blk[lay.Tm() + i * C + j] * blk[lay.KK() + i * C + j];
      for (int x = lane; x < KB; x += 32) s += dbs[i * KB + x];
      s = warp_sum(s);
      if (lane == 0) a.dbeta[(t0 + i) * a.H + h] = s;
    }
  }
}

// TC: dbeta_i = the channel halves' shares (grads_kernel, in the U rows of the prepared block),
// added in the order of the halves: bit-repeatable, no atomics. A thread per row of the chunk.
__global__ void dbeta_sum_kernel(Args a) {
  const int64_t c = blockIdx.x, h = blockIdx.y;
  const int i = threadIdx.x;
  if (i >= a.clen[c]) return;
  const float* u = a.blk(c, h) + a.lay.dbeta_parts();
  float s = u[i];
  for (int z = 1; z < kGradSplit; ++z) s += u[z * a.C + i];
  a.dbeta[(a.ct0[c] + i) * a.H + h] = s;
}

}  // namespace

namespace kda_chunk {

template <typename T>
void grads(Context& ctx, const Args& a, const Tensor& q, const Tensor& k, const Tensor& v,
           Tensor& dq, Tensor& dk, Tensor& dv) {
  size_t sm = grads_smem<T>(a.C, a.K);
  unsigned split = 1;
  bool v2 = false;  // grads_v2_kernel (bf16 only)
  // The block pairs on tensor cores and the channel halves under prep's condition, where q, k
  // and g take the 16-byte loads of TC's load phase (and dq, dk its pair stores).
  auto* kernel = grads_kernel<T, false>;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (a.C == kMaxC && a.K == kMaxKV && aligned(q.raw()) && aligned(k.raw()) && aligned(a.g) &&
        aligned(dq.raw()) && aligned(dk.raw())) {
      kernel = grads_kernel<T, true>;
      sm = grads_smem<T>(kMaxC, kHalf) + kGradTileBytes;
      split = kGradSplit;
      v2 = a.kernels.grads_v2;
    }
  }
  const dim3 chunks(static_cast<unsigned>(a.nchunks), static_cast<unsigned>(a.H));
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (v2) grads_v2(ctx, a, q, k, v, dq, dk, dv);
  }
  if (!v2) {
    allow_smem(kernel, sm);
    kernel<<<dim3(chunks.x, chunks.y, split), kGradThreads, sm, stream(ctx)>>>(
        a, ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(dq), ptr<T>(dk), ptr<T>(dv));
    MT_CUDA_LAUNCH_CHECK();
  }
  if (split > 1) {
    dbeta_sum_kernel<<<chunks, kMaxC, 0, stream(ctx)>>>(a);
    MT_CUDA_LAUNCH_CHECK();
  }
}

template void grads<float>(Context&, const Args&, const Tensor&, const Tensor&, const Tensor&,
                           Tensor&, Tensor&, Tensor&);
template void grads<__nv_bfloat16>(Context&, const Args&, const Tensor&, const Tensor&,
                                   const Tensor&, Tensor&, Tensor&, Tensor&);

}  // namespace kda_chunk

}  // namespace mt::ops::cuda
