// The sparse stage's key selection fused with the lightning indexer on tensor cores: for every
// query, the top-k causal positions of its document by I[t, s] = scale sum_h w[t, h]
// ReLU(q[t, h] . k[s]), without a score table (at T = 131072 the [T, T] f32 table alone is 64 GiB).
//
// One block of four warps per 64 queries (16 per warp, every indexer head's q rows in shared
// memory) walks the key tiles of the queries' documents in increasing position; each warp forms
// its rows' scores for a tile of 64 keys in registers (per head an m16n8k16 bf16 product, fp32
// accumulators, then the weighted ReLU sum in the CPU's head order and the scale last, so that
// equal inputs give equal scores). The scores are never stored; the selection is a radix select
// over their order-preserving 32-bit keys, one sweep over the key tiles per 8-bit digit:
// - a sweep counts, per query, the keys that share the prefix decided so far in a 256-bin
//   histogram; the query's digit is the bin holding its k-th best key. A query is decided once
//   its bin holds exactly the keys still needed, or the whole key is known;
// - sweeps stop when every query of the block is decided (typically after three: the first digit
//   is mostly sign and exponent), and a last sweep emits the positions: keys above the prefix,
//   and of the keys equal to it the lowest positions still needed. A warp owns its rows and sees
//   their keys in increasing position order (tile by tile; inside a tile, ranked across the four
//   lanes that share a row), so equal scores go to the lower position, exactly as the CPU's
//   topk_select, and the list comes out sorted.
// Queries with no more causal keys than top-k take them all without any score (the dense part of
// the layer below index_topk tokens). Scores are recomputed per sweep: at most five products of
// the queries with their keys, no memory beyond the output.
// Where every head's q rows do not fit the shared memory (DeepSeek-V3.2's 64 x 128: 1.2 MB),
// IndexerTopkTile::resident_heads of them are staged at a time, per key tile, from L2: the same
// products in the same head order, with the q rows re-read once per tile and sweep.
#include <climits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/indexer.h"

namespace mt::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;
using Tile = IndexerTopkTile;

constexpr int kRows = static_cast<int>(Tile::rows);
constexpr int kKeys = static_cast<int>(Tile::keys);
constexpr int kPad = static_cast<int>(Tile::pad);
constexpr int kBins = static_cast<int>(Tile::bins);
constexpr int kThreads = 128;
static_assert(kRows == 16 * (kThreads / 32) && kKeys == 64 && kBins == 256);

// The score's bits made monotone in unsigned order (-0 as +0, which float comparison ties).
__device__ __forceinline__ uint32_t order_key(float score) {
  if (score == 0.f) score = 0.f;
  const uint32_t b = __float_as_uint(score);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exclusive prefix and total of v over the four lanes that share a fragment row (lane order is
// key order inside an 8-key column group).
__device__ __forceinline__ void quad_scan(int v, int& excl, int& total) {
  const int c = threadIdx.x & 3;
  int inc = v;
  int y = __shfl_up_sync(0xffffffffu, inc, 1, 4);
  if (c >= 1) inc += y;
  y = __shfl_up_sync(0xffffffffu, inc, 2, 4);
  if (c >= 2) inc += y;
  excl = inc - v;
  total = __shfl_sync(0xffffffffu, inc, 3, 4);
}

// n rows of `width` elements (row r at src + r * stride) into tile[r][DP + kPad], zero past
// `valid` rows and past `width`; 16-byte cp.async when `vec` (width % 8 == 0, aligned rows).
template <int DP>
__device__ __forceinline__ void stage_rows(bf16* tile, const bf16* src, int64_t stride, int n,
                                           int valid, int width, bool vec) {
  constexpr int ld = DP + kPad, chunks = DP / 8;
  for (int i = threadIdx.x; i < n * chunks; i += kThreads) {
    const int r = i / chunks, c8 = (i % chunks) * 8;
    bf16* d = tile + r * ld + c8;
    const bf16* s = src + r * stride + c8;
    if (vec && r < valid && c8 + 8 <= width)
      mma::cp_async16(d, s);
    else
      for (int e = 0; e < 8; ++e)
        d[e] = (r < valid && c8 + e < width) ? s[e] : __float2bfloat16(0.f);
  }
}

// What one lane knows of one of its two rows during a sweep.
struct RowState {
  int64_t t;      // the query's position
  int64_t start;  // its document's first key (INT_MAX past T: no key is valid)
  uint32_t prefix, mask;
  int need;         // keys still to take among those equal to the prefix
  int seen = 0;     // select sweep: keys equal to the prefix met so far
  int emitted = 0;  // select sweep: positions written so far
  __device__ bool valid(int64_t key) const { return key >= start && key <= t; }
};

template <int DP>
__global__ void __launch_bounds__(kThreads)
    topk_fused_kernel(int64_t T, int H, int HS, int D, float scale, int topk, const int32_t* cu,
                      int64_t nseq, bool vec, const bf16* q, const bf16* k, const bf16* w,
                      int32_t* out) {
  constexpr int LD = DP + kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);                   // [HS][kRows][LD]
  bf16* Kb = Qs + HS * kRows * LD;                            // [2][kKeys][LD]
  float* Ws = reinterpret_cast<float*>(Kb + 2 * kKeys * LD);  // [kRows][H]
  int* hist = reinterpret_cast<int*>(Ws + kRows * H);         // [kRows][kBins]
  int* start = hist + kRows * kBins;                          // [kRows]
  uint32_t* prefix = reinterpret_cast<uint32_t*>(start + kRows);
  uint32_t* mask = prefix + kRows;
  int* need = reinterpret_cast<int*>(mask + kRows);
  int* done = need + kRows;
  __shared__ int open_rows;

  // The longest query tiles (latest queries) first, so that short ones fill the tail.
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kRows;
  const int rows_in = static_cast<int>(T - q0 < kRows ? T - q0 : kRows);
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  if (threadIdx.x == 0) open_rows = 0;
  __syncthreads();
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const int64_t t = q0 + r;
    const int64_t s0 = t < T ? cu[doc_index(cu, nseq, t)] : INT_MAX;
    const int64_t n = t < T ? t - s0 + 1 : 0;
    start[r] = static_cast<int>(s0);
    need[r] = static_cast<int>(n < topk ? n : topk);
    prefix[r] = 0;
    mask[r] = 0;  // with an empty mask every valid key equals the prefix: all are taken
    done[r] = n <= topk;
    if (n > topk) atomicAdd(&open_rows, 1);
  }
  // Every head's q rows stay in shared memory where they fit (HS == H); otherwise HS of them at a
  // time are staged per key tile (stage_heads below).
  const bool sliced = HS < H;
  const auto stage_heads = [&](int h0, int hn) {
    for (int h = 0; h < hn; ++h)
      stage_rows<DP>(Qs + h * kRows * LD, q + (q0 * H + h0 + h) * D, static_cast<int64_t>(H) * D,
                     kRows, rows_in, D, vec);
  };
  if (!sliced) stage_heads(0, H);
  mma::cp_async_commit();
  for (int i = threadIdx.x; i < kRows * H; i += kThreads) {
    const int r = i / H;
    Ws[i] = r < rows_in ? __bfloat162float(w[(q0 + r) * H + i % H]) : 0.f;
  }
  __syncthreads();  // start, need
  // Slots past a row's count are unused.
  for (int i = threadIdx.x; i < rows_in * topk; i += kThreads) {
    const int r = i / topk, j = i % topk;
    if (j >= need[r]) out[(q0 + r) * topk + j] = -1;
  }

  const int64_t last = q0 + rows_in - 1;
  const int64_t kb0 = start[0] / kKeys * kKeys;
  const int tiles = static_cast<int>((last - kb0) / kKeys + 1);
  const int r0 = 16 * wp + g, r1 = r0 + 8;
  const int64_t warp_first = start[16 * wp], warp_last = q0 + 16 * wp + 15;
  // Whether any row of this warp needs scores at all (more causal keys than top-k).
  const bool warp_scores =
      __any_sync(0xffffffffu, (r0 < rows_in && !done[r0]) || (r1 < rows_in && !done[r1]));

  for (int shift = 24;; shift -= 8) {
    const bool select = open_rows == 0 || shift < 0;  // read after a barrier: block-uniform
    if (!select)
      for (int i = threadIdx.x; i < kRows * kBins; i += kThreads) hist[i] = 0;
    RowState rs[2];
    const int rr[2] = {r0, r1};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      rs[i].t = q0 + rr[i];
      rs[i].start = rr[i] < rows_in ? start[rr[i]] : INT_MAX;
      rs[i].prefix = prefix[rr[i]];
      rs[i].mask = mask[rr[i]];
      rs[i].need = need[rr[i]];
    }
    // A histogram sweep skips the warps whose rows are all decided; the select sweep needs every
    // warp with rows, and scores only where some row has more keys than top-k.
    const bool active = select ? 16 * wp < rows_in
                               : __any_sync(0xffffffffu, (r0 < rows_in && !done[r0]) ||
                                                             (r1 < rows_in && !done[r1]));
    const bool counting[2] = {!select && r0 < rows_in && !done[r0],
                              !select && r1 < rows_in && !done[r1]};
    stage_rows<DP>(Kb, k + kb0 * D, D, kKeys, static_cast<int>(T - kb0 < kKeys ? T - kb0 : kKeys),
                   D, vec);
    mma::cp_async_commit();
    for (int it = 0; it < tiles; ++it) {
      const int64_t kb = kb0 + static_cast<int64_t>(it) * kKeys;
      if (it + 1 < tiles) {
        const int64_t nb = kb + kKeys;
        stage_rows<DP>(Kb + ((it + 1) & 1) * kKeys * LD, k + nb * D, D, kKeys,
                       static_cast<int>(T - nb < kKeys ? T - nb : kKeys), D, vec);
      }
      mma::cp_async_commit();
      mma::cp_async_wait<1>();
      __syncthreads();  // tile it (and, in the first sweep, the q rows) landed for every thread
      const bf16* Ks = Kb + (it & 1) * kKeys * LD;
      // Warp-uniform: a tile wholly after the warp's rows, or before their documents.
      const bool meets = active && kb <= warp_last && kb + kKeys > warp_first;
      float acc[kKeys / 8][4] = {};
      // The weighted ReLU sum over heads h0 .. h1 - 1, whose q rows are at Qs from head h0 - q_at.
      const auto add_heads = [&](int h0, int h1, int q_at) {
        for (int h = h0; h < h1; ++h) {
          const bf16* Qh = Qs + (h - q_at) * kRows * LD;
          float s[kKeys / 8][4] = {};
#pragma unroll
          for (int kk = 0; kk < DP / 16; ++kk) {
            uint32_t a[4];
            mma::ldsm_a(a, Qh, LD, 16 * wp, 16 * kk, lane);
#pragma unroll
            for (int j = 0; j < kKeys / 8; j += 2) {
              uint32_t b0[2], b1[2];
              mma::ldsm_b_nk2(b0, b1, Ks, LD, 8 * j, 16 * kk, lane);
              mma::mma_bf16(s[j], a, b0);
              mma::mma_bf16(s[j + 1], a, b1);
            }
          }
          const float w0 = Ws[r0 * H + h], w1 = Ws[r1 * H + h];
#pragma unroll
          for (int j = 0; j < kKeys / 8; ++j) {
            acc[j][0] += w0 * fmaxf(s[j][0], 0.f);
            acc[j][1] += w0 * fmaxf(s[j][1], 0.f);
            acc[j][2] += w1 * fmaxf(s[j][2], 0.f);
            acc[j][3] += w1 * fmaxf(s[j][3], 0.f);
          }
        }
      };
      if (!sliced) {
        if (meets && warp_scores) add_heads(0, H, 0);
      } else if (__syncthreads_or(meets && warp_scores)) {
        // In the CPU's head order, slice by slice; every thread stages, every scoring warp adds.
        for (int h0 = 0; h0 < H; h0 += HS) {
          const int hn = H - h0 < HS ? H - h0 : HS;
          __syncthreads();  // the previous slice is read no more
          stage_heads(h0, hn);
          mma::cp_async_commit();
          mma::cp_async_wait<0>();
          __syncthreads();
          if (meets && warp_scores) add_heads(h0, h0 + hn, h0);
        }
      }
      if (meets) {
#pragma unroll
        for (int j = 0; j < kKeys / 8; ++j) {
          const int64_t key0 = kb + 8 * j + 2 * c;
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            RowState& r = rs[i];
            const uint32_t f0 = order_key(acc[j][2 * i] * scale),
                           f1 = order_key(acc[j][2 * i + 1] * scale);
            const uint32_t u0 = f0 & r.mask, u1 = f1 & r.mask;
            const bool v0 = r.valid(key0), v1 = r.valid(key0 + 1);
            if (!select) {
              if (!counting[i]) continue;
              int* hr = hist + rr[i] * kBins;
              if (v0 && u0 == r.prefix) atomicAdd(hr + ((f0 >> shift) & 255), 1);
              if (v1 && u1 == r.prefix) atomicAdd(hr + ((f1 >> shift) & 255), 1);
              continue;
            }
            // Keys equal to the prefix are ranked by position: this lane's two, after the
            // lower lanes' of the same column group, after every earlier group.
            const bool e0 = v0 && u0 == r.prefix, e1 = v1 && u1 == r.prefix;
            int excl, total;
            quad_scan(e0 + e1, excl, total);
            const bool s0 = (v0 && u0 > r.prefix) || (e0 && r.seen + excl < r.need);
            const bool s1 = (v1 && u1 > r.prefix) || (e1 && r.seen + excl + e0 < r.need);
            r.seen += total;
            int at, taken;
            quad_scan(s0 + s1, at, taken);
            int32_t* orow = out + r.t * topk + r.emitted + at;
            if (s0) *orow++ = static_cast<int32_t>(key0);
            if (s1) *orow = static_cast<int32_t>(key0 + 1);
            r.emitted += taken;
          }
        }
      }
      __syncthreads();  // every warp is done with this buffer before it is refilled
    }
    if (select) break;
    // Each open row takes the digit of the bin that holds its k-th best key.
    for (int r = threadIdx.x; r < kRows; r += kThreads) {
      if (done[r]) continue;
      const int* hr = hist + r * kBins;
      int nd = need[r], above = 0, digit = 0;
      for (int d = kBins - 1; d >= 0; --d) {
        if (above + hr[d] >= nd) {
          digit = d;
          break;
        }
        above += hr[d];
      }
      nd -= above;
      need[r] = nd;
      prefix[r] |= static_cast<uint32_t>(digit) << shift;
      mask[r] |= 255u << shift;
      // Decided: the bin holds exactly the keys still needed, or the whole key is known (what
      // remains equal is an exact tie, broken by position in the select sweep).
      if (hr[digit] == nd || shift == 0) {
        done[r] = 1;
        atomicSub(&open_rows, 1);
      }
    }
    __syncthreads();
  }
}

template <int DP>
void launch_as(Context& ctx, const IndexerParams& p, const Tensor& cu_seqlens, const Tensor& q,
               const Tensor& k, const Tensor& w, int64_t topk, Tensor& out, bool vec) {
  const char* op = "indexer_causal_topk";
  auto kernel = topk_fused_kernel<DP>;
  const size_t sm =
      smem_for(kernel, static_cast<size_t>(Tile::smem_bytes(p.heads, p.head_dim)), op);
  kernel<<<grid_of((p.tokens + kRows - 1) / kRows, op), kThreads, sm, stream(ctx)>>>(
      p.tokens, static_cast<int>(p.heads),
      static_cast<int>(Tile::resident_heads(p.heads, p.head_dim)), static_cast<int>(p.head_dim),
      p.eff_scale(), static_cast<int>(topk), ptr<int32_t>(cu_seqlens), cu_seqlens.numel() - 1, vec,
      ptr<bf16>(q), ptr<bf16>(k), ptr<bf16>(w), ptr<int32_t>(out));
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace

void indexer_causal_topk(Context& ctx, const IndexerParams& p, const Tensor& cu_seqlens,
                         const Tensor& q, const Tensor& k, const Tensor& w, int64_t topk,
                         Tensor& out) {
  const char* op = "indexer_causal_topk";
  MT_CHECK(q.dtype() == DType::BF16, ShapeError, op, ": the fused kernel takes bf16, got ",
           dtype_name(q.dtype()));
  expect_same_dtype(op, q, k, "k");
  expect_same_dtype(op, q, w, "w");
  MT_CHECK(indexer_topk_fits(p.heads, p.head_dim), ValueError, op, ": ", p.heads, " heads x ",
           p.head_dim, " do not fit the fused kernel's shared memory");
  MT_CHECK(p.tokens < INT_MAX && topk < INT_MAX, ValueError, op, ": ", p.tokens, " tokens, top-",
           topk, " exceed 32-bit positions");
  if (p.tokens == 0) return;
  const bool vec = p.head_dim % 8 == 0 && reinterpret_cast<uintptr_t>(q.raw()) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(k.raw()) % 16 == 0;
  if (Tile::padded_dim(p.head_dim) == 64)
    launch_as<64>(ctx, p, cu_seqlens, q, k, w, topk, out, vec);
  else
    launch_as<128>(ctx, p, cu_seqlens, q, k, w, topk, out, vec);
}

}  // namespace mt::ops::cuda
