// Attention over index lists on tensor cores, for query heads that share a key head (MQA, the
// absorbed MLA form, grouped heads: sparse_attention_fits). Every head of a query reads the same
// index list and, within a group, the same keys, so the group's heads are the MMA's rows: one block
// per (query, key head) with one warp per 16 heads gathers the listed keys and values 32 slots at a
// time (cp.async, double buffered; unused slots zero-filled and masked) and runs the flash
// algorithm over them: S = q k^T and P v as m16n8k16 bf16 products with fp32 accumulators, online
// softmax in log2 units, lse saved (natural log), a row without a valid slot giving o = 0 and
// lse = -inf as on the CPU.
//
// Backward, per (query, key head) again: Delta = o . dout per head, then per slot tile P (from the
// lse), dP = dout v^T, dS = P (dP - Delta); dq accumulates dS k in registers. dk and dv of a slot
// sum over every query that lists it: the block forms its tile's share, dv = P^T dout and
// dk = dS^T q over all of its heads (P and dS through shared memory, transposed by ldmatrix), and
// adds it with fp32 vector atomics into f32 buffers, rounded to the tensors' bf16 at the end.
// Atomics rather than the transposed index table of the direct kernels: gathering per key would
// re-read a whole group's q and dout rows (G x 320 bf16 per pair) and recompute P for every
// (key, query) pair, where here each product is formed once, where its operands already are. The
// order of the additions varies, so results are not bit-repeatable: a deterministic context runs
// the direct backward instead (ops/cuda/attention.cu).
#include <climits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/dsa_sparse_attention.h"
#include "ops/cuda/mma.cuh"

namespace mt::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kSlots = 32;  // index-list slots per tile
constexpr int kPad = 8;     // bf16 elements of padding per shared row
constexpr int kMaxWarps = 4;
constexpr int kLP = kSlots + kPad;  // row length of the P and dS tiles
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// n consecutive rows (stride `stride`) of `width` elements into tile[r][DP + kPad], zero past
// `width`; 16-byte cp.async when `vec`.
template <int DP>
__device__ __forceinline__ void stage_block(bf16* tile, const bf16* src, int64_t stride, int n,
                                            int width, bool vec) {
  constexpr int ld = DP + kPad, chunks = DP / 8;
  for (int i = threadIdx.x; i < n * chunks; i += blockDim.x) {
    const int r = i / chunks, c8 = (i % chunks) * 8;
    bf16* d = tile + r * ld + c8;
    const bf16* s = src + r * stride + c8;
    if (vec && c8 + 8 <= width)
      mma::cp_async16(d, s);
    else
      for (int e = 0; e < 8; ++e) d[e] = c8 + e < width ? s[e] : __float2bfloat16(0.f);
  }
}

// The rows of key head g listed in slots j0 .. j0+kSlots-1 of `row` into tile[kSlots][DP + kPad]
// (zero for unused slots and past `width`); their positions into slot[] (-1 when unused).
template <int DP>
__device__ __forceinline__ void gather_tile(bf16* tile, int* slot, const bf16* src, int64_t T,
                                            int64_t Hk, int64_t g, int width, const int32_t* row,
                                            int64_t j0, int64_t K, bool vec) {
  constexpr int ld = DP + kPad, chunks = DP / 8;
  for (int i = threadIdx.x; i < kSlots * chunks; i += blockDim.x) {
    const int r = i / chunks, c8 = (i % chunks) * 8;
    const int64_t j = j0 + r;
    const int32_t s = j < K ? row[j] : -1;
    const bool ok = valid_slot(s, T);
    bf16* d = tile + r * ld + c8;
    const bf16* sp = src + (static_cast<int64_t>(ok ? s : 0) * Hk + g) * width + c8;
    if (vec && ok && c8 + 8 <= width)
      mma::cp_async16(d, sp);
    else
      for (int e = 0; e < 8; ++e) d[e] = ok && c8 + e < width ? sp[e] : __float2bfloat16(0.f);
    if (c8 == 0 && slot) slot[r] = ok ? s : -1;
  }
}

// c += A B^T for the warp's 16 rows of A (from row 16 w) against the kSlots rows of B, over D
// columns (both tiles row-major in shared memory).
template <int D>
__device__ __forceinline__ void product_nt(float c[kSlots / 8][4], const bf16* A, int lda,
                                           const bf16* B, int ldb, int w, int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    mma::ldsm_a(a, A, lda, 16 * w, 16 * kk, lane);
#pragma unroll
    for (int j = 0; j < kSlots / 8; j += 2) {
      uint32_t b0[2], b1[2];
      mma::ldsm_b_nk2(b0, b1, B, ldb, 8 * j, 16 * kk, lane);
      mma::mma_bf16(c[j], a, b0);
      mma::mma_bf16(c[j + 1], a, b1);
    }
  }
}

// c += P B for the warp's 16 rows of P (C fragments over the tile's kSlots columns, rounded to
// bf16 here) against B[kSlots][N] in shared memory.
template <int N>
__device__ __forceinline__ void product_pn(float c[N / 8][4], float p[kSlots / 8][4], const bf16* B,
                                           int ldb, int lane) {
#pragma unroll
  for (int kk = 0; kk < kSlots / 16; ++kk) {
    uint32_t a[4];
    mma::c_to_a(a, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
    for (int jn = 0; jn < N / 8; ++jn) {
      uint32_t b[2];
      mma::load_b_kn(b, B, ldb, 16 * kk, 8 * jn, lane);
      mma::mma_bf16(c[jn], a, b);
    }
  }
}

struct Launch {
  int64_t T, H, Hk, K;
  int dk, dv, warps;
  float scale;
  bool vec;
};

// Key and value rows of slot tile `it` (and its positions) into one buffer pair.
template <int DK, int DV>
__device__ __forceinline__ void gather_kv(const Launch& l, bf16* Ks, bf16* Vs, int* slot,
                                          const bf16* k, const bf16* v, int64_t g,
                                          const int32_t* row, int it) {
  const int64_t j0 = static_cast<int64_t>(it) * kSlots;
  gather_tile<DK>(Ks, slot, k, l.T, l.Hk, g, l.dk, row, j0, l.K, l.vec);
  gather_tile<DV>(Vs, nullptr, v, l.T, l.Hk, g, l.dv, row, j0, l.K, l.vec);
}

// Starts gathering tile it + 1 into the other buffer pair and waits until tile it has landed for
// every thread; returns tile it's buffer.
template <int DK, int DV>
__device__ __forceinline__ int next_tile(const Launch& l, bf16* const Kb[2], bf16* const Vb[2],
                                         int* slots, const bf16* k, const bf16* v, int64_t g,
                                         const int32_t* row, int it, int tiles) {
  const int b = it & 1;
  if (it + 1 < tiles)
    gather_kv<DK, DV>(l, Kb[b ^ 1], Vb[b ^ 1], slots + (b ^ 1) * kSlots, k, v, g, row, it + 1);
  mma::cp_async_commit();
  mma::cp_async_wait<1>();
  __syncthreads();
  return b;
}

template <int DK, int DV>
__global__ void __launch_bounds__(kMaxWarps * 32)
    sparse_fwd_kernel(Launch l, const bf16* q, const bf16* k, const bf16* v, const int32_t* idx,
                      bf16* o, float* lse) {
  constexpr int LK = DK + kPad, LV = DV + kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  const int G = l.warps * 16;
  bf16* Qs = reinterpret_cast<bf16*>(smem);  // [G][LK]
  bf16* Kb[2] = {Qs + G * LK, Qs + G * LK + kSlots * (LK + LV)};
  bf16* Vb[2] = {Kb[0] + kSlots * LK, Kb[1] + kSlots * LK};
  int* slots = reinterpret_cast<int*>(Vb[1] + kSlots * LV);  // [2][kSlots]
  const int64_t t = blockIdx.x, g = blockIdx.y, h0 = g * G;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, c = lane & 3;
  const int32_t* row = idx + t * l.K;
  const float scale_log2 = l.scale * kLog2e;
  stage_block<DK>(Qs, q + (t * l.H + h0) * l.dk, l.dk, G, l.dk, l.vec);
  mma::cp_async_commit();
  const int tiles = static_cast<int>((l.K + kSlots - 1) / kSlots);
  if (tiles > 0) gather_kv<DK, DV>(l, Kb[0], Vb[0], slots, k, v, g, row, 0);
  mma::cp_async_commit();
  mma::cp_async_wait<1>();  // q
  __syncthreads();
  uint32_t qa[DK / 16][4];
#pragma unroll
  for (int kk = 0; kk < DK / 16; ++kk) mma::ldsm_a(qa[kk], Qs, LK, 16 * w, 16 * kk, lane);
  float acc[DV / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.f, 0.f};
  for (int it = 0; it < tiles; ++it) {
    const int b = next_tile<DK, DV>(l, Kb, Vb, slots, k, v, g, row, it, tiles);
    const int* sl = slots + b * kSlots;
    // Block-uniform: the unused tail of a short list is skipped.
    if (__any_sync(0xffffffffu, sl[lane] >= 0)) {
      const bf16* Ks = Kb[b];
      const bf16* Vs = Vb[b];
      float s[kSlots / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk)
#pragma unroll
        for (int j = 0; j < kSlots / 8; j += 2) {
          uint32_t b0[2], b1[2];
          mma::ldsm_b_nk2(b0, b1, Ks, LK, 8 * j, 16 * kk, lane);
          mma::mma_bf16(s[j], qa[kk], b0);
          mma::mma_bf16(s[j + 1], qa[kk], b1);
        }
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int j = 0; j < kSlots / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool ok = sl[8 * j + 2 * c + e] >= 0;
          s[j][e] = ok ? s[j][e] * scale_log2 : -INFINITY;
          s[j][2 + e] = ok ? s[j][2 + e] * scale_log2 : -INFINITY;
          mx0 = fmaxf(mx0, s[j][e]);
          mx1 = fmaxf(mx1, s[j][2 + e]);
        }
      const float mn0 = fmaxf(m[0], mma::quad_max(mx0)), mn1 = fmaxf(m[1], mma::quad_max(mx1));
      const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
      const float al0 = exp2f(m[0] - mu0), al1 = exp2f(m[1] - mu1);
      m[0] = mn0;
      m[1] = mn1;
      float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
      for (int j = 0; j < kSlots / 8; ++j) {
        s[j][0] = exp2f(s[j][0] - mu0);
        s[j][1] = exp2f(s[j][1] - mu0);
        s[j][2] = exp2f(s[j][2] - mu1);
        s[j][3] = exp2f(s[j][3] - mu1);
        rs0 += s[j][0] + s[j][1];
        rs1 += s[j][2] + s[j][3];
      }
      lsum[0] = lsum[0] * al0 + rs0;
      lsum[1] = lsum[1] * al1 + rs1;
#pragma unroll
      for (int jv = 0; jv < DV / 8; ++jv) {
        acc[jv][0] *= al0;
        acc[jv][1] *= al0;
        acc[jv][2] *= al1;
        acc[jv][3] *= al1;
      }
      product_pn<DV>(acc, s, Vs, LV, lane);
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  const float L[2] = {mma::quad_sum(lsum[0]), mma::quad_sum(lsum[1])};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t th = t * l.H + h0 + 16 * w + (lane >> 2) + 8 * r;
    // No valid slot: o = 0, lse = -inf.
    const float inv = L[r] > 0.f ? 1.f / L[r] : 0.f;
    bf16* orow = o + th * l.dv;
#pragma unroll
    for (int jv = 0; jv < DV / 8; ++jv) {
      const int col = 8 * jv + 2 * c;
      if (col < l.dv) orow[col] = __float2bfloat16(acc[jv][2 * r] * inv);
      if (col + 1 < l.dv) orow[col + 1] = __float2bfloat16(acc[jv][2 * r + 1] * inv);
    }
    if (c == 0) lse[th] = L[r] > 0.f ? (m[r] + log2f(L[r])) * kLn2 : -INFINITY;
  }
}

// Adds a C fragment (rows: slots m0 + g, m0 + g + 8 of the tile; columns 8 n + 2c, +1) times f
// into the f32 rows of the listed keys.
__device__ __forceinline__ void add_rows(float* dst, const int* sl, int64_t Hk, int64_t g, int D,
                                         int m0, int n, const float cf[4], float f) {
  const int lane = threadIdx.x & 31, col = 8 * n + 2 * (lane & 3);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int s = sl[m0 + (lane >> 2) + 8 * r];
    if (s < 0 || col >= D) continue;
    float* p = dst + (static_cast<int64_t>(s) * Hk + g) * D + col;
    if (col + 1 < D && (D & 1) == 0) {
      atomicAdd(reinterpret_cast<float2*>(p), make_float2(cf[2 * r] * f, cf[2 * r + 1] * f));
    } else {
      atomicAdd(p, cf[2 * r] * f);
      if (col + 1 < D) atomicAdd(p + 1, cf[2 * r + 1] * f);
    }
  }
}

template <int DK, int DV>
__global__ void __launch_bounds__(kMaxWarps * 32)
    sparse_bwd_kernel(Launch l, const bf16* q, const bf16* k, const bf16* v, const int32_t* idx,
                      const bf16* o, const float* lse, const bf16* dout, bf16* dq, float* dk_acc,
                      float* dv_acc) {
  constexpr int LK = DK + kPad, LV = DV + kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  const int G = l.warps * 16, W = l.warps;
  bf16* Qs = reinterpret_cast<bf16*>(smem);  // [G][LK]
  bf16* Os = Qs + G * LK;                    // [G][LV] dout
  bf16* Kb[2] = {Os + G * LV, Os + G * LV + kSlots * (LK + LV)};
  bf16* Vb[2] = {Kb[0] + kSlots * LK, Kb[1] + kSlots * LK};
  bf16* Ps = Vb[1] + kSlots * LV;                        // [G][kLP]
  bf16* Ds = Ps + G * kLP;                               // [G][kLP] dS
  float* lse2 = reinterpret_cast<float*>(Ds + G * kLP);  // [G]
  float* dl = lse2 + G;                                  // [G] Delta
  int* slots = reinterpret_cast<int*>(dl + G);           // [2][kSlots]
  const int64_t t = blockIdx.x, g = blockIdx.y, h0 = g * G;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, gr = lane >> 2, c = lane & 3;
  const int32_t* row = idx + t * l.K;
  const float scale_log2 = l.scale * kLog2e;
  stage_block<DK>(Qs, q + (t * l.H + h0) * l.dk, l.dk, G, l.dk, l.vec);
  stage_block<DV>(Os, dout + (t * l.H + h0) * l.dv, l.dv, G, l.dv, l.vec);
  mma::cp_async_commit();
  const int tiles = static_cast<int>((l.K + kSlots - 1) / kSlots);
  if (tiles > 0) gather_kv<DK, DV>(l, Kb[0], Vb[0], slots, k, v, g, row, 0);
  mma::cp_async_commit();
  // Delta = o . dout per head, one warp per head; lse in log2 units (-inf rows keep P at 0).
  for (int r = w; r < G; r += W) {
    const int64_t th = t * l.H + h0 + r;
    float s = 0.f;
    for (int d = lane; d < l.dv; d += 32)
      s += __bfloat162float(o[th * l.dv + d]) * __bfloat162float(dout[th * l.dv + d]);
    s = warp_sum(s);
    if (lane == 0) {
      dl[r] = s;
      lse2[r] = lse[th] * kLog2e;
    }
  }
  const int r0 = 16 * w + gr, r1 = r0 + 8;
  float acc[DK / 8][4] = {};
  for (int it = 0; it < tiles; ++it) {
    const int b = next_tile<DK, DV>(
        l, Kb, Vb, slots, k, v, g, row, it,
        tiles);  // tile it (with the q and dout rows, Delta and lse) visible to every warp
    const int* sl = slots + b * kSlots;
    const bf16* Ks = Kb[b];
    const bf16* Vs = Vb[b];
    const bool any = __any_sync(0xffffffffu, sl[lane] >= 0);  // block-uniform
    if (any) {
      float s[kSlots / 8][4] = {}, dp[kSlots / 8][4] = {};
      product_nt<DK>(s, Qs, LK, Ks, LK, w, lane);
      product_nt<DV>(dp, Os, LV, Vs, LV, w, lane);
      // P and dS = P (dP - Delta) (the softmax scale comes last); both also to shared memory,
      // rounded to bf16 as the products read them, for the key-side products below.
      const float l0 = lse2[r0], l1 = lse2[r1], d0 = dl[r0], d1 = dl[r1];
#pragma unroll
      for (int j = 0; j < kSlots / 8; ++j) {
        float p[4];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool ok = sl[8 * j + 2 * c + e] >= 0;
          p[e] = ok && l0 != -INFINITY ? exp2f(s[j][e] * scale_log2 - l0) : 0.f;
          p[2 + e] = ok && l1 != -INFINITY ? exp2f(s[j][2 + e] * scale_log2 - l1) : 0.f;
        }
        const int col = 8 * j + 2 * c;
        *reinterpret_cast<uint32_t*>(Ps + r0 * kLP + col) = mma::pack_bf16(p[0], p[1]);
        *reinterpret_cast<uint32_t*>(Ps + r1 * kLP + col) = mma::pack_bf16(p[2], p[3]);
        s[j][0] = p[0] * (dp[j][0] - d0);
        s[j][1] = p[1] * (dp[j][1] - d0);
        s[j][2] = p[2] * (dp[j][2] - d1);
        s[j][3] = p[3] * (dp[j][3] - d1);
        *reinterpret_cast<uint32_t*>(Ds + r0 * kLP + col) = mma::pack_bf16(s[j][0], s[j][1]);
        *reinterpret_cast<uint32_t*>(Ds + r1 * kLP + col) = mma::pack_bf16(s[j][2], s[j][3]);
      }
      // dq += dS k.
      product_pn<DK>(acc, s, Ks, LK, lane);
    }
    __syncthreads();  // P and dS of every head written
    if (any) {
      // dv = P^T dout and dk = dS^T q for the tile's slots, over all G heads: 16 slots x 8 dims
      // per job, the jobs dealt round-robin to the warps.
      constexpr int nv = DV / 8, nk = DK / 8, jobs = (kSlots / 16) * (nv + nk);
      for (int job = w; job < jobs; job += W) {
        const int m0 = 16 * (job / (nv + nk)), n = job % (nv + nk);
        const bool is_v = n < nv;
        const bf16* A = is_v ? Ps : Ds;
        const bf16* B = is_v ? Os : Qs;
        const int ldb = is_v ? LV : LK, nn = is_v ? n : n - nv;
        float cf[4] = {};
        for (int kk = 0; kk < G / 16; ++kk) {
          uint32_t a[4], bb[2];
          mma::ldsm_a_trans(a, A, kLP, m0, 16 * kk, lane);
          mma::load_b_kn(bb, B, ldb, 16 * kk, 8 * nn, lane);
          mma::mma_bf16(cf, a, bb);
        }
        if (is_v)
          add_rows(dv_acc, sl, l.Hk, g, l.dv, m0, nn, cf, 1.f);
        else
          add_rows(dk_acc, sl, l.Hk, g, l.dk, m0, nn, cf, l.scale);
      }
    }
    __syncthreads();  // the buffers and P / dS are refilled next
  }
  const int rows[2] = {r0, r1};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    bf16* out = dq + (t * l.H + h0 + rows[r]) * l.dk;
#pragma unroll
    for (int jd = 0; jd < DK / 8; ++jd) {
      const int col = 8 * jd + 2 * c;
      if (col < l.dk) out[col] = __float2bfloat16(acc[jd][2 * r] * l.scale);
      if (col + 1 < l.dk) out[col + 1] = __float2bfloat16(acc[jd][2 * r + 1] * l.scale);
    }
  }
}

Launch launch_of(const AttentionParams& p, std::initializer_list<const Tensor*> ts) {
  bool vec = p.qk_dim % 8 == 0 && p.v_dim % 8 == 0;
  for (const Tensor* t : ts) vec = vec && reinterpret_cast<uintptr_t>(t->raw()) % 16 == 0;
  MT_CHECK(p.tokens < INT_MAX && p.kvh() <= 65535, ValueError, "sparse attention: ", p.tokens,
           " tokens or ", p.kvh(), " key heads exceed one grid");
  return {p.tokens,
          p.heads,
          p.kvh(),
          p.kmax,
          static_cast<int>(p.qk_dim),
          static_cast<int>(p.v_dim),
          static_cast<int>(p.heads / p.kvh() / 16),
          p.scale,
          vec};
}

template <typename F>
void with_widths(const AttentionParams& p, F&& f) {
  if (p.qk_dim <= 64 && p.v_dim <= 64)
    f.template operator()<64, 64>();
  else if (p.qk_dim <= 128 && p.v_dim <= 128)
    f.template operator()<128, 128>();
  else
    f.template operator()<192, 128>();
}

}  // namespace

void sparse_attention_forward(Context& ctx, const AttentionParams& p, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& indices, Tensor& o,
                              Tensor& lse) {
  if (p.tokens == 0) return;
  const Launch l = launch_of(p, {&q, &k, &v});
  with_widths(p, [&]<int DK, int DV>() {
    constexpr size_t LK = DK + kPad, LV = DV + kPad;
    auto kernel = sparse_fwd_kernel<DK, DV>;
    const size_t G = static_cast<size_t>(l.warps) * 16;
    const size_t sm = smem_for(
        kernel, sizeof(bf16) * (G * LK + 2 * kSlots * (LK + LV)) + sizeof(int) * 2 * kSlots,
        "attention_forward");
    kernel<<<dim3(static_cast<unsigned>(l.T), static_cast<unsigned>(l.Hk)), 32 * l.warps, sm,
             stream(ctx)>>>(l, ptr<bf16>(q), ptr<bf16>(k), ptr<bf16>(v), ptr<int32_t>(indices),
                            ptr<bf16>(o), ptr<float>(lse));
    MT_CUDA_LAUNCH_CHECK();
  });
}

void sparse_attention_backward(Context& ctx, const AttentionParams& p, const Tensor& q,
                               const Tensor& k, const Tensor& v, const Tensor& indices,
                               const Tensor& o, const Tensor& lse, const Tensor& dout, Tensor& dq,
                               Tensor& dk, Tensor& dv) {
  if (p.tokens == 0) return;
  const char* op = "attention_backward";
  const Launch l = launch_of(p, {&q, &k, &v, &dout});
  ArenaScope scope(ctx.workspace());
  Tensor dk_acc = ctx.workspace().alloc(dk.shape()), dv_acc = ctx.workspace().alloc(dv.shape());
  cudaStream_t s = stream(ctx);
  MT_CUDA_CHECK(cudaMemsetAsync(dk_acc.raw(), 0, dk_acc.bytes(), s));
  MT_CUDA_CHECK(cudaMemsetAsync(dv_acc.raw(), 0, dv_acc.bytes(), s));
  with_widths(p, [&]<int DK, int DV>() {
    constexpr size_t LK = DK + kPad, LV = DV + kPad;
    auto kernel = sparse_bwd_kernel<DK, DV>;
    const size_t G = static_cast<size_t>(l.warps) * 16;
    const size_t sm =
        smem_for(kernel,
                 sizeof(bf16) * (G * (LK + LV) + 2 * kSlots * (LK + LV) + 2 * G * kLP) +
                     sizeof(float) * 2 * G + sizeof(int) * 2 * kSlots,
                 op);
    kernel<<<dim3(static_cast<unsigned>(l.T), static_cast<unsigned>(l.Hk)), 32 * l.warps, sm, s>>>(
        l, ptr<bf16>(q), ptr<bf16>(k), ptr<bf16>(v), ptr<int32_t>(indices), ptr<bf16>(o),
        ptr<float>(lse), ptr<bf16>(dout), ptr<bf16>(dq), ptr<float>(dk_acc), ptr<float>(dv_acc));
    MT_CUDA_LAUNCH_CHECK();
  });
  const float* pk = ptr<float>(dk_acc);
  const float* pv = ptr<float>(dv_acc);
  bf16* odk = ptr<bf16>(dk);
  bf16* odv = ptr<bf16>(dv);
  for_each_index(ctx, dk.numel(), [=] __device__(int64_t i) { odk[i] = __float2bfloat16(pk[i]); });
  for_each_index(ctx, dv.numel(), [=] __device__(int64_t i) { odv[i] = __float2bfloat16(pv[i]); });
}

}  // namespace mt::ops::cuda
