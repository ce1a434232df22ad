// The lightning indexer's scores on the slots of an index table, and their gradients, on tensor
// cores (bf16; heads <= 64; head dim 64 or 128). The KL loss reads the scores only at the
// query's selected slots (2048 per query in the real models), so the work per query is a small
// dense product of its heads' q rows with its gathered keys:
// - forward: one block of four warps per query, every head's q row in shared memory (padded to
//   16-row groups with zero rows); the listed keys are gathered 64 slots at a time (cp.async,
//   16 bytes, double buffered, unused slots zero-filled), each warp takes 16 of them: per group
//   of 16 heads S = q k^T on m16n8k16 bf16 products with fp32 accumulators, then the weighted
//   ReLU sum over the heads in registers, summed across the fragment's rows by shuffles; scale
//   last.
// - dq and dw: one block per (query, group of 16 heads) over the same gathered tiles. S is
//   recomputed, dw = scale sum_j g_j ReLU(S) in registers, and G = g_j 1[S > 0] (rows heads,
//   columns slots) goes straight from the accumulators into the A fragment of dQ = G K, split
//   into a bf16 high and low part (two products) so that the gradient keeps about 16 bits of g,
//   not the 8 of one bf16 rounding. scale w[t, h] is applied per row at the end; the four warps'
//   partial dq meet in shared memory in a fixed order. It also writes, per slot and group of 16
//   heads, the bits of the heads with S > 0 (2 bytes a slot up to 16 heads, workspace).
// - dk: one block per key through the transposed index table (index_lists.cuh), as the direct
//   kernel, but with 16-byte loads: DP / 8 lanes share one (query, head) row of q, so a warp
//   reads 512 contiguous bytes of a query's heads per load, and only the rows whose bit says
//   q . k > 0 (no dot product recomputed; the same indicator as dq's), adding w g q. Every output
//   has one writer and a fixed summation order (bit-repeatable, no float atomics). Its cost is
//   the q rows it reads (positive (entry, head) pairs x head dim x 2 bytes, from L2 at 8K: q is
//   8 MB).
#include <algorithm>

#include "ops/cuda/index_lists.cuh"
#include "ops/cuda/indexer_tc.h"
#include "ops/cuda/mma.cuh"

namespace mt::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kSlots = 16 * kWarps;  // slots per gathered tile: 16 per warp
constexpr int kPad = 8;              // bf16 per shared row past DP: conflict-free ldmatrix

// The query's listed keys j0 .. j0 + kSlots - 1 into Ks[kSlots][DP + kPad]; slots past K or
// unused are zero rows (scores 0, ReLU 0, no gradient).
template <int DP>
__device__ __forceinline__ void gather_keys(bf16* Ks, const bf16* k, const int32_t* row, int64_t j0,
                                            int64_t K, int64_t tokens) {
  constexpr int LD = DP + kPad, chunks = DP / 8;
  for (int i = threadIdx.x; i < kSlots * chunks; i += kThreads) {
    const int r = i / chunks, c8 = (i % chunks) * 8;
    const int64_t j = j0 + r;
    const int32_t s = j < K ? row[j] : -1;
    bf16* d = Ks + r * LD + c8;
    if (valid_slot(s, tokens))
      mma::cp_async16(d, k + static_cast<int64_t>(s) * DP + c8);
    else
      *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
  }
}

// Heads h0 .. h0 + n - 1 of one query's q rows (qt: head 0) into Qs[n][DP + kPad], zero past H.
template <int DP>
__device__ __forceinline__ void stage_heads(bf16* Qs, const bf16* qt, int h0, int n, int H) {
  constexpr int LD = DP + kPad, chunks = DP / 8;
  for (int i = threadIdx.x; i < n * chunks; i += kThreads) {
    const int r = i / chunks, c8 = (i % chunks) * 8;
    bf16* d = Qs + r * LD + c8;
    if (h0 + r < H)
      mma::cp_async16(d, qt + static_cast<int64_t>(h0 + r) * DP + c8);
    else
      *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
  }
}

// Whether any of this warp's 16 slots j0 .. j0 + 15 is used (warp-uniform): the upper triangle of
// a causal candidate table (the composite selection's) skips its products.
__device__ __forceinline__ bool warp_slots_used(const int32_t* row, int64_t j0, int64_t K,
                                                int64_t tokens, int lane) {
  const int64_t j = j0 + (lane & 15);
  return __any_sync(0xffffffffu, j < K && valid_slot(row[j], tokens));
}

// S (16 heads of rows r0.. of Qs x this warp's 16 slots of Ks) into two C tiles: s[j] holds slots
// 16 wp + 8 j .. + 7.
template <int DP>
__device__ __forceinline__ void head_slot_product(float (&s)[2][4], const bf16* Qs, int r0,
                                                  const bf16* Ks, int wp, int lane) {
  constexpr int LD = DP + kPad;
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < DP / 16; ++kk) {
    uint32_t a[4], b0[2], b1[2];
    mma::ldsm_a(a, Qs, LD, r0, 16 * kk, lane);
    mma::ldsm_b_nk2(b0, b1, Ks, LD, 16 * wp, 16 * kk, lane);
    mma::mma_bf16(s[0], a, b0);
    mma::mma_bf16(s[1], a, b1);
  }
}

// The KL of one row from its scores in shared memory, as indexer.cu's kl_fwd_kernel and
// kl_bwd_kernel compute it (double softmax sums, the same roundings), so that the fused and the
// composite paths agree but for the scores' summation order.
__device__ void row_kl(int64_t t, int64_t tokens, int64_t K, const float* Sr, const int32_t* row,
                       const float* trow, double c, float* dsrow, double* kl_out) {
  float m = -INFINITY;
  double ts = 0;
  for (int64_t j = threadIdx.x; j < K; j += kThreads) {
    if (!valid_slot(row[j], tokens)) continue;
    m = fmaxf(m, Sr[j]);
    ts += trow[j];
  }
  m = block_max(m);
  const double tsum = block_sum(ts);
  if (m == -INFINITY) {
    if (dsrow)
      for (int64_t j = threadIdx.x; j < K; j += kThreads) dsrow[j] = 0.f;
    if (threadIdx.x == 0) kl_out[t] = 0;
    return;
  }
  double z = 0;
  for (int64_t j = threadIdx.x; j < K; j += kThreads)
    if (valid_slot(row[j], tokens)) z += exp(static_cast<double>(Sr[j] - m));
  const double logz = m + log(block_sum(z));
  double kl = 0;
  for (int64_t j = threadIdx.x; j < K; j += kThreads) {
    const bool v = valid_slot(row[j], tokens);
    float g = 0.f;
    if (v) {
      const double logq = Sr[j] - logz;
      const float sm = static_cast<float>(exp(logq));
      if (tsum > 0 && trow[j] > 0) {
        const double pj = trow[j] / tsum;
        kl += pj * (log(pj) - logq);
      }
      // A zero target contributes no loss, hence no gradient.
      if (tsum > 0) g = static_cast<float>(c * (sm - trow[j] / tsum));
    }
    if (dsrow) dsrow[j] = g;
  }
  kl = block_sum(kl);
  if (threadIdx.x == 0) kl_out[t] = kl;
}

// Scores of one query's slots; with KL the row stays in shared memory and the block finishes the
// KL loss (row_kl) instead of writing it.
template <int DP, bool KL>
__global__ void __launch_bounds__(kThreads)
    scores_fwd_tc_kernel(int64_t tokens, int H, int64_t K, float scale, const bf16* q,
                         const bf16* k, const bf16* w, const int32_t* idx, float* scores,
                         const float* target, double dcoef, double* kl_rows) {
  constexpr int LD = DP + kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  const int HP = (H + 15) & ~15;
  bf16* Qs = reinterpret_cast<bf16*>(smem);                    // [HP][LD]
  bf16* Kb = Qs + HP * LD;                                     // [2][kSlots][LD]
  float* Ws = reinterpret_cast<float*>(Kb + 2 * kSlots * LD);  // [HP]
  float* Sr = Ws + HP;                                         // KL: [K], the row's scores
  const int64_t t = blockIdx.x;
  const int32_t* row = idx + t * K;
  float* srow = KL ? Sr : scores + t * K;
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  stage_heads<DP>(Qs, q + t * H * DP, 0, HP, H);
  for (int h = threadIdx.x; h < HP; h += kThreads)
    Ws[h] = h < H ? __bfloat162float(w[t * H + h]) : 0.f;
  const int64_t tiles = (K + kSlots - 1) / kSlots;
  gather_keys<DP>(Kb, k, row, 0, K, tokens);
  mma::cp_async_commit();
  for (int64_t it = 0; it < tiles; ++it) {
    if (it + 1 < tiles)
      gather_keys<DP>(Kb + ((it + 1) & 1) * kSlots * LD, k, row, (it + 1) * kSlots, K, tokens);
    mma::cp_async_commit();
    mma::cp_async_wait<1>();
    __syncthreads();  // tile it (and, first, the q rows and weights) landed for every thread
    const bf16* Ks = Kb + (it & 1) * kSlots * LD;
    float acc[2][2] = {};
    const bool used = warp_slots_used(row, it * kSlots + 16 * wp, K, tokens, lane);
    for (int hg = 0; used && hg < HP; hg += 16) {
      float s[2][4];
      head_slot_product<DP>(s, Qs, hg, Ks, wp, lane);
      const float w0 = Ws[hg + g], w1 = Ws[hg + g + 8];
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          acc[j][e] += w0 * fmaxf(s[j][e], 0.f) + w1 * fmaxf(s[j][e + 2], 0.f);
    }
    // The heads are the fragment's rows: lanes 4 g + c for the 8 values of g.
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        for (int o = 4; o < 32; o <<= 1) acc[j][e] += __shfl_xor_sync(0xffffffffu, acc[j][e], o);
    if (g == 0)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t jj = it * kSlots + 16 * wp + 8 * j + 2 * c + e;
          if (jj < K) srow[jj] = valid_slot(row[jj], tokens) ? scale * acc[j][e] : 0.f;
        }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  if constexpr (KL)
    row_kl(t, tokens, K, Sr, row, target + t * K, dcoef, scores ? scores + t * K : nullptr,
           kl_rows);
}

// The rows' losses added in a fixed order by one block, then divided by T (indexer.cu's order).
__global__ void kl_total_kernel(int64_t n, const double* v, double* total) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *total = s / static_cast<double>(n);
}

// dq[t, h] = scale w[t, h] sum_j g_j 1[S_hj > 0] k_j and dw[t, h] = scale sum_j g_j ReLU(S_hj) for
// the block's 16 heads (blockIdx.y).
template <int DP>
__global__ void __launch_bounds__(kThreads)
    scores_bwd_dq_tc_kernel(int64_t tokens, int H, int64_t K, float scale, const bf16* q,
                            const bf16* k, const bf16* w, const int32_t* idx, const float* dscores,
                            bf16* dq, bf16* dw, uint16_t* pos) {
  constexpr int LD = DP + kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);   // [16][LD]
  bf16* Kb = Qs + 16 * LD;                    // [2][kSlots][LD]; after the loop, the warps' dq
  float* red = reinterpret_cast<float*>(Kb);  // [kWarps][16][DP]
  __shared__ float dwp[kWarps][16];
  const int64_t t = blockIdx.x;
  const int h0 = 16 * static_cast<int>(blockIdx.y);
  const int32_t* row = idx + t * K;
  const float* grow = dscores + t * K;
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  stage_heads<DP>(Qs, q + t * H * DP, h0, 16, H);
  const int64_t tiles = (K + kSlots - 1) / kSlots;
  gather_keys<DP>(Kb, k, row, 0, K, tokens);
  mma::cp_async_commit();
  float dqa[DP / 8][4] = {};
  float dwa[2] = {0.f, 0.f};
  for (int64_t it = 0; it < tiles; ++it) {
    if (it + 1 < tiles)
      gather_keys<DP>(Kb + ((it + 1) & 1) * kSlots * LD, k, row, (it + 1) * kSlots, K, tokens);
    mma::cp_async_commit();
    // The slots' score gradients while the tile lands (0 past K and on unused slots).
    float gk[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t jj = it * kSlots + 16 * wp + 8 * j + 2 * c + e;
        gk[j][e] = jj < K && valid_slot(row[jj], tokens) ? grow[jj] : 0.f;
      }
    mma::cp_async_wait<1>();
    __syncthreads();
    const bf16* Ks = Kb + (it & 1) * kSlots * LD;
    if (warp_slots_used(row, it * kSlots + 16 * wp, K, tokens, lane)) {
      float s[2][4];
      head_slot_product<DP>(s, Qs, 0, Ks, wp, lane);
      // Which of the 16 heads have q . k > 0, per slot: the dk kernel's indicator, so that it
      // neither recomputes q . k nor reads the q rows of the others.
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          uint32_t bits = (s[j][e] > 0.f ? 1u << g : 0u) | (s[j][e + 2] > 0.f ? 1u << (g + 8) : 0u);
          for (int o = 4; o < 32; o <<= 1) bits |= __shfl_xor_sync(0xffffffffu, bits, o);
          const int64_t jj = it * kSlots + 16 * wp + 8 * j + 2 * c + e;
          if (g == 0 && jj < K) pos[(t * K + jj) * gridDim.y + blockIdx.y] = bits;
        }
      // G (rows heads g, g + 8; columns this lane's slots) and its bf16 high / low parts.
      float hi[2][4], lo[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float gv = gk[j][e & 1];
          dwa[e >> 1] += gv * fmaxf(s[j][e], 0.f);
          const float G = s[j][e] > 0.f ? gv : 0.f;
          hi[j][e] = __bfloat162float(__float2bfloat16(G));
          lo[j][e] = G - hi[j][e];
        }
      uint32_t ah[4], al[4];
      mma::c_to_a(ah, hi[0], hi[1]);
      mma::c_to_a(al, lo[0], lo[1]);
#pragma unroll
      for (int nt = 0; nt < DP / 8; ++nt) {
        uint32_t b[2];
        mma::load_b_kn(b, Ks, LD, 16 * wp, 8 * nt, lane);
        mma::mma_bf16(dqa[nt], ah, b);
        mma::mma_bf16(dqa[nt], al, b);
      }
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  mma::cp_async_wait<0>();
  __syncthreads();  // the key buffers become the warps' dq partials
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    dwa[e] += __shfl_xor_sync(0xffffffffu, dwa[e], 1);
    dwa[e] += __shfl_xor_sync(0xffffffffu, dwa[e], 2);
  }
  if (c == 0) {
    dwp[wp][g] = dwa[0];
    dwp[wp][g + 8] = dwa[1];
  }
  float* rw = red + wp * 16 * DP;
#pragma unroll
  for (int nt = 0; nt < DP / 8; ++nt) {
    const int col = 8 * nt + 2 * c;
    rw[g * DP + col] = dqa[nt][0];
    rw[g * DP + col + 1] = dqa[nt][1];
    rw[(g + 8) * DP + col] = dqa[nt][2];
    rw[(g + 8) * DP + col + 1] = dqa[nt][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 16 * DP; i += kThreads) {
    const int h = i / DP;
    if (h0 + h >= H) break;  // i grows with h
    float sum = 0.f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) sum += red[v * 16 * DP + i];
    const int64_t th = t * H + h0 + h;
    dq[th * DP + i % DP] = __float2bfloat16(scale * __bfloat162float(w[th]) * sum);
  }
  if (threadIdx.x < 16 && h0 + static_cast<int>(threadIdx.x) < H) {
    float sum = 0.f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) sum += dwp[v][threadIdx.x];
    dw[t * H + h0 + threadIdx.x] = __float2bfloat16(scale * sum);
  }
}

__device__ __forceinline__ void unpack8(float (&f)[8], const uint4& v) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __nv_bfloat162 b;
    *reinterpret_cast<uint32_t*>(&b) = u[i];
    const float2 p = __bfloat1622float2(b);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// dk[s] = scale sum_{(t, j) -> s} g_tj sum_h w_th 1[q_th . k_s > 0] q_th, one block per key; the
// indicator comes from the dq kernel's bits `pos` ([T, kmax, head groups] u16, bit h % 16).
template <int DP>
__global__ void __launch_bounds__(kThreads)
    scores_bwd_dk_vec_kernel(int H, int64_t K, float scale, const bf16* q, const bf16* w,
                             const float* dscores, const uint16_t* pos, int groups,
                             const int32_t* offsets, const int32_t* entries, bf16* dk) {
  constexpr int L = DP / 8;  // lanes per (query, head) row: 8 dims each
  constexpr int R = 32 / L;  // rows per warp and load
  constexpr int U = 4;       // loads in flight per lane
  constexpr int step = kWarps * R;
  __shared__ float red[kWarps][DP];
  const int64_t s = blockIdx.x;
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, sub = lane % L, rg = lane / L;
  float acc[8] = {};
  const int64_t e0 = offsets[s], pairs = static_cast<int64_t>(offsets[s + 1] - e0) * H;
  for (int64_t base = static_cast<int64_t>(wp) * R; base < pairs; base += step * U) {
    uint4 qv[U];
    float cf[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t pi = base + u * step + rg;
      qv[u] = make_uint4(0u, 0u, 0u, 0u);
      cf[u] = 0.f;
      if (pi < pairs) {
        const int64_t e = entries[e0 + pi / H];
        const int h = static_cast<int>(pi % H);
        if ((pos[e * groups + h / 16] >> (h % 16)) & 1u) {
          const int64_t th = (e / K) * H + h;
          qv[u] = *reinterpret_cast<const uint4*>(q + th * DP + 8 * sub);
          cf[u] = dscores[e] * __bfloat162float(w[th]);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float qf[8];
      unpack8(qf, qv[u]);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += cf[u] * qf[i];
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int o = L; o < 32; o <<= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
  if (rg == 0)
#pragma unroll
    for (int i = 0; i < 8; ++i) red[wp][8 * sub + i] = acc[i];
  __syncthreads();
  for (int d = threadIdx.x; d < DP; d += kThreads) {
    float sum = 0.f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) sum += red[v][d];
    dk[s * DP + d] = __float2bfloat16(scale * sum);
  }
}

// The forward kernel's shared memory: q rows, two key tiles, weights, and with the KL the row
// (ops::indexer_scores_kl_fits counts the same).
int64_t fwd_smem(const IndexerParams& p, bool kl) {
  const int64_t LD = p.head_dim + kPad, HP = (p.heads + 15) / 16 * 16;
  return 2 * (HP * LD + 2 * kSlots * LD) + 4 * HP + (kl ? 4 * p.kmax : 0);
}

// scores: the score table (forward), or with KL the score gradient (null: none).
template <int DP, bool KL>
void forward_as(Context& ctx, const IndexerParams& p, const Tensor& q, const Tensor& k,
                const Tensor& w, const Tensor& indices, float* scores,
                const float* target = nullptr, double c = 0, double* kl_rows = nullptr) {
  const char* op = KL ? "indexer_scores_kl" : "indexer_scores_forward";
  auto kernel = scores_fwd_tc_kernel<DP, KL>;
  const size_t sm = smem_for(kernel, static_cast<size_t>(fwd_smem(p, KL)), op);
  kernel<<<grid_of(p.tokens, op), kThreads, sm, stream(ctx)>>>(
      p.tokens, static_cast<int>(p.heads), p.kmax, p.eff_scale(), ptr<bf16>(q), ptr<bf16>(k),
      ptr<bf16>(w), ptr<int32_t>(indices), scores, target, c, kl_rows);
  MT_CUDA_LAUNCH_CHECK();
}

template <int DP>
void backward_as(Context& ctx, const IndexerParams& p, const Tensor& q, const Tensor& k,
                 const Tensor& w, const Tensor& indices, const Tensor& dscores, Tensor& dq,
                 Tensor& dk, Tensor& dw) {
  const char* op = "indexer_scores_backward";
  constexpr int64_t LD = DP + kPad;
  const int64_t NT = p.tokens, H = p.heads, K = p.kmax;
  const float scale = p.eff_scale();
  const int32_t* idx = ptr<int32_t>(indices);
  const int64_t groups = (H + 15) / 16;
  ArenaScope scope(ctx.workspace());
  // 16-bit words (no u16 dtype): per slot and head group, which heads have q . k > 0.
  Tensor pos = ctx.workspace().alloc({std::max<int64_t>(NT * K * groups, 1)}, DType::BF16);
  uint16_t* pp = reinterpret_cast<uint16_t*>(pos.raw());
  auto k1 = scores_bwd_dq_tc_kernel<DP>;
  const size_t sm1 =
      smem_for(k1,
               static_cast<size_t>(2 * 16 * LD +
                                   std::max<int64_t>(2 * 2 * kSlots * LD, 4 * kWarps * 16 * DP)),
               op);
  const dim3 grid1(grid_of(NT, op), static_cast<unsigned>(groups));
  k1<<<grid1, kThreads, sm1, stream(ctx)>>>(NT, static_cast<int>(H), K, scale, ptr<bf16>(q),
                                            ptr<bf16>(k), ptr<bf16>(w), idx, ptr<float>(dscores),
                                            ptr<bf16>(dq), ptr<bf16>(dw), pp);
  MT_CUDA_LAUNCH_CHECK();
  const DeviceKeyLists kl = build_device_key_lists(ctx, idx, NT, K, op);
  scores_bwd_dk_vec_kernel<DP><<<grid_of(NT, op), kThreads, 0, stream(ctx)>>>(
      static_cast<int>(H), K, scale, ptr<bf16>(q), ptr<bf16>(w), ptr<float>(dscores), pp,
      static_cast<int>(groups), kl.offsets, kl.entries, ptr<bf16>(dk));
  MT_CUDA_LAUNCH_CHECK();
}

bool aligned16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0;
}

}  // namespace

bool indexer_scores_tc_takes(const IndexerParams& p, const Tensor& q, const Tensor& k) {
  return q.dtype() == DType::BF16 && p.heads >= 1 && p.heads <= 64 &&
         (p.head_dim == 64 || p.head_dim == 128) && aligned16(q) && aligned16(k);
}

void indexer_scores_forward_tc(Context& ctx, const IndexerParams& p, const Tensor& q,
                               const Tensor& k, const Tensor& w, const Tensor& indices,
                               Tensor& scores) {
  if (p.head_dim == 64)
    forward_as<64, false>(ctx, p, q, k, w, indices, ptr<float>(scores));
  else
    forward_as<128, false>(ctx, p, q, k, w, indices, ptr<float>(scores));
}

bool indexer_scores_kl_takes(const IndexerParams& p, const Tensor& q, const Tensor& k) {
  return indexer_scores_tc_takes(p, q, k) &&
         ops::indexer_scores_kl_fits(p.heads, p.head_dim, p.kmax);
}

void indexer_scores_kl(Context& ctx, const IndexerParams& p, const Tensor& q, const Tensor& k,
                       const Tensor& w, const Tensor& indices, const Tensor& target, double dloss,
                       Tensor& loss, Tensor& dscores) {
  const char* op = "indexer_scores_kl";
  expect_same_dtype(op, q, k, "k");
  expect_same_dtype(op, q, w, "w");
  expect_f32(op, target, "target");
  expect_f32(op, dscores, "dscores");
  MT_CHECK(indexer_scores_kl_takes(p, q, k), ValueError, op, ": ", p.heads, " heads x ", p.head_dim,
           " (", dtype_name(q.dtype()), ") with ", p.kmax, " slots do not fit the fused kernel");
  cudaStream_t s = stream(ctx);
  MT_CUDA_CHECK(cudaMemsetAsync(loss.raw(), 0, sizeof(double), s));
  if (p.tokens == 0) return;
  ArenaScope scope(ctx.workspace());
  Tensor rows = ctx.workspace().alloc({p.tokens}, DType::F64);
  float* ds = dscores.defined() ? ptr<float>(dscores) : nullptr;
  const double c = dloss / static_cast<double>(p.tokens);
  if (p.head_dim == 64)
    forward_as<64, true>(ctx, p, q, k, w, indices, ds, ptr<float>(target), c, ptr<double>(rows));
  else
    forward_as<128, true>(ctx, p, q, k, w, indices, ds, ptr<float>(target), c, ptr<double>(rows));
  // The loss stays on the device (written, never read back here).
  kl_total_kernel<<<1, 1024, 0, s>>>(p.tokens, ptr<double>(rows), ptr<double>(loss));
  MT_CUDA_LAUNCH_CHECK();
}

void indexer_scores_backward_tc(Context& ctx, const IndexerParams& p, const Tensor& q,
                                const Tensor& k, const Tensor& w, const Tensor& indices,
                                const Tensor& dscores, Tensor& dq, Tensor& dk, Tensor& dw) {
  if (p.head_dim == 64)
    backward_as<64>(ctx, p, q, k, w, indices, dscores, dq, dk, dw);
  else
    backward_as<128>(ctx, p, q, k, w, indices, dscores, dq, dk, dw);
}

}  // namespace mt::ops::cuda
