// Decoding over a cache on the GPU (ops/cached_attention.h).
// - Attention: one block per (query row, head); each warp walks a strided share of the row's keys
//   with its own online softmax (running max, sum and fp32 output accumulators in shared memory),
//   and the warps' partial results merge at the end. One pass over the keys.
// - Indexer top-k: a score kernel (one warp per cached position, the row's queries in shared
//   memory; key blocks on grid.x, whose limit is 2^31 - 1, and query rows strided over grid.y)
//   fills a [n, cached] fp32 table in the workspace; a per-row kernel then finds the k-th
//   best (score, position) key by an 8-bit radix select over 64-bit keys (ordered score bits, then
//   the inverted position, so ties go to the lower position) and writes the winners in increasing
//   position through a block scan.
// The device path never reads the positions on the host (ops/cached_attention.cpp checks them on
// the CPU path only), so every kernel clamps a row's key count to [0, cached]: a bad position then
// reads no key past the cache and writes nothing outside its row.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <limits>

#include "ops/cached_attention.h"
#include "ops/cuda/common.cuh"
#include "ops/indexer.h"

namespace mt::ops::cuda {

namespace {

constexpr int kAttnWarps = kCachedAttentionWarps;

// Row i's causal key count, positions[i] + 1, within [0, cached].
__device__ __forceinline__ int64_t causal_count(const int32_t* positions, int64_t i,
                                                int64_t cached) {
  const int64_t c = static_cast<int64_t>(positions[i]) + 1;
  return c < 0 ? 0 : (c > cached ? cached : c);
}

template <typename T>
__global__ void cached_attention_kernel(CachedAttentionParams p, const T* __restrict__ q,
                                        const T* __restrict__ k, const T* __restrict__ v,
                                        const int32_t* __restrict__ positions,
                                        const int32_t* __restrict__ indices, T* __restrict__ o) {
  extern __shared__ float smem[];
  const int64_t i = blockIdx.x, h = blockIdx.y, H = p.heads, Dqk = p.qk_dim, Dv = p.v_dim;
  float* qs = smem;                   // [Dqk]
  float* acc = smem + Dqk;            // [warps, Dv]
  float* wm = acc + kAttnWarps * Dv;  // [warps] running max
  float* wsum = wm + kAttnWarps;      // [warps] running sum
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t e = threadIdx.x; e < Dqk; e += blockDim.x) qs[e] = ld(q, (i * H + h) * Dqk + e);
  for (int64_t e = lane; e < Dv; e += 32) acc[warp * Dv + e] = 0.f;
  __syncthreads();
  const bool listed = indices != nullptr;
  const int64_t count = listed ? p.kmax : causal_count(positions, i, p.cached);
  float m = -INFINITY, sum = 0.f;
  for (int64_t j = warp; j < count; j += kAttnWarps) {
    const int64_t s = listed ? indices[i * p.kmax + j] : j;
    if (s < 0 || s >= p.cached) continue;
    float dot = 0.f;
    for (int64_t e = lane; e < Dqk; e += 32) dot += qs[e] * ld(k, (s * H + h) * Dqk + e);
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float sc = p.scale * dot, mn = fmaxf(m, sc);
    const float corr = expf(m - mn), w = expf(sc - mn);
    sum = sum * corr + w;
    for (int64_t e = lane; e < Dv; e += 32)
      acc[warp * Dv + e] = acc[warp * Dv + e] * corr + w * ld(v, (s * H + h) * Dv + e);
    m = mn;
  }
  if (lane == 0) {
    wm[warp] = m;
    wsum[warp] = sum;
  }
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, wm[w]);
  float total = 0.f;
  for (int w = 0; w < kAttnWarps; ++w)
    if (wm[w] != -INFINITY) total += wsum[w] * expf(wm[w] - M);
  for (int64_t e = threadIdx.x; e < Dv; e += blockDim.x) {
    float r = 0.f;
    if (M != -INFINITY) {
      for (int w = 0; w < kAttnWarps; ++w)
        if (wm[w] != -INFINITY) r += acc[w * Dv + e] * expf(wm[w] - M);
      r /= total;
    }
    st(o, (i * H + h) * Dv + e, r);
  }
}

constexpr int kScoreWarps = 8;

// scores[i, s] for s < causal_count(i); the rest of the row is never read. Block (x, y) holds key
// block x (kScoreWarps positions) for rows y, y + gridDim.y, ...: grid.y stays within its 65535.
template <typename T>
__global__ void cached_scores_kernel(CachedIndexerParams p, float scale, const T* __restrict__ q,
                                     const T* __restrict__ k, const T* __restrict__ w,
                                     const int32_t* __restrict__ positions,
                                     float* __restrict__ scores) {
  extern __shared__ float smem[];
  const int64_t HI = p.heads, DI = p.head_dim;
  float* qs = smem;          // [HI, DI]
  float* ws = qs + HI * DI;  // [HI]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t s = static_cast<int64_t>(blockIdx.x) * kScoreWarps + warp;
  for (int64_t i = blockIdx.y; i < p.tokens; i += gridDim.y) {
    __syncthreads();  // the previous row's queries are read by every warp
    for (int64_t e = threadIdx.x; e < HI * DI; e += blockDim.x) qs[e] = ld(q, i * HI * DI + e);
    for (int64_t e = threadIdx.x; e < HI; e += blockDim.x) ws[e] = ld(w, i * HI + e);
    __syncthreads();
    if (s >= causal_count(positions, i, p.cached)) continue;  // whole warps: s is per warp
    // acc starts at +0 and only adds: a row without positive dots scores +0, never -0, so the
    // top-k's key bits see one zero.
    float acc = 0.f;
    for (int64_t h = 0; h < HI; ++h) {
      float dot = 0.f;
      for (int64_t e = lane; e < DI; e += 32) dot += qs[h * DI + e] * ld(k, s * DI + e);
      for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      acc += ws[h] * fmaxf(0.f, dot);
    }
    if (lane == 0) scores[i * p.cached + s] = acc * scale;
  }
}

// Larger key = better candidate: the score's bits made order-preserving as an unsigned integer,
// then the inverted position (the lower position wins a tie).
__device__ __forceinline__ uint64_t cand_key(float score, int64_t s) {
  uint32_t u = __float_as_uint(score);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(u) << 32) | static_cast<uint32_t>(0xffffffffu - s);
}

constexpr int kTopkThreads = 512;

__global__ void cached_topk_kernel(CachedIndexerParams p, const float* __restrict__ scores,
                                   const int32_t* __restrict__ positions,
                                   int32_t* __restrict__ out) {
  using Scan = cub::BlockScan<int, kTopkThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int hist[256];
  __shared__ uint64_t prefix_s;
  __shared__ int64_t need_s;
  __shared__ int written_s;
  const int64_t i = blockIdx.x, count = causal_count(positions, i, p.cached);
  const int64_t keff = count < p.topk ? count : p.topk;
  const float* row = scores + i * p.cached;
  uint64_t thr = 0;  // every key is above 0: all candidates win when keff == count
  if (keff < count) {
    if (threadIdx.x == 0) {
      prefix_s = 0;
      need_s = keff;
    }
    uint64_t mask = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
      __syncthreads();
      const uint64_t prefix = prefix_s;
      for (int64_t s = threadIdx.x; s < count; s += blockDim.x) {
        const uint64_t key = cand_key(row[s], s);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xff], 1);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        // The digit holding the need-th largest key among those matching the prefix.
        int64_t need = need_s;
        int d = 255;
        for (; d > 0 && hist[d] < need; --d) need -= hist[d];
        need_s = need;
        prefix_s = prefix | (static_cast<uint64_t>(d) << shift);
      }
      mask |= static_cast<uint64_t>(0xff) << shift;
      __syncthreads();
    }
    thr = prefix_s;  // keys are distinct: exactly keff keys are >= the keff-th largest
  }
  if (threadIdx.x == 0) written_s = 0;
  __syncthreads();
  int32_t* orow = out + i * p.topk;
  for (int64_t base = 0; base < count; base += blockDim.x) {
    const int64_t s = base + threadIdx.x;
    const int win = s < count && cand_key(row[s], s) >= thr ? 1 : 0;
    int at = 0, total = 0;
    Scan(scan_tmp).ExclusiveSum(win, at, total);
    if (win) orow[written_s + at] = static_cast<int32_t>(s);
    __syncthreads();
    if (threadIdx.x == 0) written_s += total;
    __syncthreads();
  }
  for (int64_t j = keff + threadIdx.x; j < p.topk; j += blockDim.x) orow[j] = -1;
}

}  // namespace

void cached_attention_forward(Context& ctx, const CachedAttentionParams& p, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& positions,
                              const Tensor& indices, Tensor& o) {
  MT_CHECK(cached_attention_fits(p.qk_dim, p.v_dim), ShapeError, "cached_attention: head dims qk ",
           p.qk_dim, ", v ", p.v_dim, " exceed the kernel's shared memory");
  const size_t smem =
      sizeof(float) * static_cast<size_t>(p.qk_dim + kAttnWarps * p.v_dim + 2 * kAttnWarps);
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.heads));
  const int32_t* idx = indices.defined() ? ptr<const int32_t>(indices) : nullptr;
  MT_DISPATCH_FLOAT(q, "cached_attention", {
    cached_attention_kernel<T><<<grid, 32 * kAttnWarps, smem, stream(ctx)>>>(
        p, ptr<const T>(q), ptr<const T>(k), ptr<const T>(v), ptr<const int32_t>(positions), idx,
        ptr<T>(o));
  });
  MT_CUDA_LAUNCH_CHECK();
}

void cached_indexer_topk(Context& ctx, const CachedIndexerParams& p, const Tensor& q,
                         const Tensor& k, const Tensor& w, const Tensor& positions, Tensor& out) {
  MT_CHECK(cached_indexer_fits(p.heads, p.head_dim), ShapeError, "cached_indexer_topk: ", p.heads,
           " heads of ", p.head_dim, " exceed the score kernel's shared memory");
  const size_t smem = sizeof(float) * static_cast<size_t>(p.heads * p.head_dim + p.heads);
  // Positions are i32 and the top-k's keys hold the inverted position in 32 bits.
  MT_CHECK(p.cached <= std::numeric_limits<int32_t>::max(), ValueError,
           "cached_indexer_topk: cached = ", p.cached, " positions exceed the i32 positions");
  // The [tokens, cached] fp32 score table must fit the workspace: say so with both sizes rather
  // than as the arena's failure (a long prompt against a long cache is what reaches it).
  Arena& ws = ctx.workspace();
  const size_t table = arena_footprint(static_cast<size_t>(p.tokens * p.cached) * sizeof(float));
  MT_CHECK(ws.used() + table <= ws.capacity(), ValueError,
           "cached_indexer_topk: the score table of ", p.tokens, " rows x cached = ", p.cached,
           " positions needs ", table, " bytes; the workspace has ", ws.capacity() - ws.used(),
           " of ", ws.capacity(),
           " free (decode the prompt in shorter steps or grow the workspace)");
  const float scale = IndexerParams{.head_dim = p.head_dim, .scale = p.scale}.eff_scale();
  ArenaScope scope(ws);
  Tensor scores = ws.alloc({p.tokens, p.cached}, DType::F32);
  constexpr int64_t kMaxGridY = 65535;
  const dim3 grid(static_cast<unsigned>((p.cached + kScoreWarps - 1) / kScoreWarps),
                  static_cast<unsigned>(std::min(p.tokens, kMaxGridY)));
  MT_DISPATCH_FLOAT(q, "cached_indexer_topk", {
    cached_scores_kernel<T><<<grid, 32 * kScoreWarps, smem, stream(ctx)>>>(
        p, scale, ptr<const T>(q), ptr<const T>(k), ptr<const T>(w), ptr<const int32_t>(positions),
        ptr<float>(scores));
  });
  MT_CUDA_LAUNCH_CHECK();
  cached_topk_kernel<<<static_cast<unsigned>(p.tokens), kTopkThreads, 0, stream(ctx)>>>(
      p, ptr<const float>(scores), ptr<const int32_t>(positions), ptr<int32_t>(out));
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::ops::cuda
