// The lightning indexer on the GPU, the direct version (bf16 with up to 64 heads of 64 or 128
// dims runs ops/cuda/indexer_tc.cu's tensor-core kernels instead: indexer_scores_tc_takes). Scores:
// one block per query holds the query's heads in shared memory; each warp takes one slot at a time
// and reduces q_h . k_s over the head dimension. Backward: dq/dw per (query, head), dk per key
// through the transposed index table (index_lists.cuh), each output row with one writer and a fixed
// summation order. Scores, their gradients, targets and the KL softmax are f32; q, k, w and their
// gradients are the op's storage type. top-k is a per-row radix select over (score, position) keys
// read tile by tile from the score table, so it needs no buffer of the row beyond a histogram and
// the selected positions.
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/index_lists.cuh"
#include "ops/cuda/indexer_tc.h"
#include "ops/indexer.h"

namespace mt::ops::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowThreads = 256;  // top-k and KL: one block per row

template <typename T>
__global__ void scores_fwd_kernel(int64_t tokens, int64_t H, int64_t D, int64_t K, float scale,
                                  const T* q, const T* k, const T* w, const int32_t* idx,
                                  float* scores) {
  extern __shared__ float smem[];
  float* qs = smem;        // [H][D]
  float* kb = qs + H * D;  // [kWarps][D], the key of each warp's slot
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  for (int64_t i = threadIdx.x; i < H * D; i += blockDim.x) qs[i] = ld(q, t * H * D + i);
  __syncthreads();
  float* kw = kb + wp * D;
  for (int64_t j = wp; j < K; j += kWarps) {
    const int32_t s = idx[t * K + j];
    float acc = 0.f;
    if (valid_slot(s, tokens)) {
      for (int64_t d = lane; d < D; d += 32) kw[d] = ld(k, s * D + d);
      __syncwarp();
      for (int64_t h = 0; h < H; ++h)
        acc += ld(w, t * H + h) * fmaxf(0.f, warp_dot(qs + h * D, kw, D));
      acc *= scale;
      __syncwarp();  // kw is rewritten for the next slot
    }
    if (lane == 0) scores[t * K + j] = acc;
  }
}

// dq[t, h] = scale w sum_j g_j 1[a_j > 0] k_j and dw[t, h] = scale sum_j g_j a_j, a_j = q.k_j.
template <typename T>
__global__ void scores_bwd_dq_kernel(int64_t tokens, int64_t H, int64_t D, int64_t K, float scale,
                                     const T* q, const T* k, const T* w, const int32_t* idx,
                                     const float* dscores, T* dq, T* dw) {
  extern __shared__ float smem[];
  float* qs = smem;               // [D]
  float* acc = qs + D;            // [kWarps][D]
  float* dwp = acc + kWarps * D;  // [kWarps]
  const int64_t th = blockIdx.x, t = th / H;
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) qs[d] = ld(q, th * D + d);
  float* aw = acc + wp * D;
  for (int64_t d = lane; d < D; d += 32) aw[d] = 0.f;
  __syncthreads();
  const float wg = ld(w, th) * scale;
  float dwa = 0.f;
  for (int64_t j = wp; j < K; j += kWarps) {
    const int32_t s = idx[t * K + j];
    if (!valid_slot(s, tokens)) continue;
    const T* kr = k + s * D;
    const float a = warp_dot(qs, kr, D);
    if (a <= 0.f) continue;
    const float g = dscores[t * K + j];
    dwa += g * a;
    for (int64_t d = lane; d < D; d += 32) aw[d] += wg * g * ld(kr, d);
  }
  if (lane == 0) dwp[wp] = dwa;
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float s = 0.f;
    for (int i = 0; i < kWarps; ++i) s += acc[i * D + d];
    st(dq, th * D + d, s);
  }
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int i = 0; i < kWarps; ++i) s += dwp[i];
    st(dw, th, scale * s);
  }
}

// dk[s] = scale sum_{(t, j) -> s} g_tj sum_h w_th 1[q_th . k_s > 0] q_th, one block per key.
template <typename T>
__global__ void scores_bwd_dk_kernel(int64_t H, int64_t D, int64_t K, float scale, const T* q,
                                     const T* k, const T* w, const float* dscores,
                                     const int32_t* offsets, const int32_t* entries, T* dk) {
  extern __shared__ float smem[];
  float* ks = smem;     // [D]
  float* acc = ks + D;  // [kWarps][D]
  const int64_t s = blockIdx.x;
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) ks[d] = ld(k, s * D + d);
  float* aw = acc + wp * D;
  for (int64_t d = lane; d < D; d += 32) aw[d] = 0.f;
  __syncthreads();
  const int64_t e0 = offsets[s], pairs = (offsets[s + 1] - e0) * H;
  for (int64_t pi = wp; pi < pairs; pi += kWarps) {
    const int64_t e = entries[e0 + pi / H], th = (e / K) * H + pi % H;
    const T* qr = q + th * D;
    if (warp_dot(qr, ks, D) <= 0.f) continue;
    const float c = dscores[e] * scale * ld(w, th);
    for (int64_t d = lane; d < D; d += 32) aw[d] += c * ld(qr, d);
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float a = 0.f;
    for (int i = 0; i < kWarps; ++i) a += acc[i * D + d];
    st(dk, s * D + d, a);
  }
}

// A key whose unsigned order is "larger score first, then lower position": the score's bits made
// monotone (with -0 as +0, as float comparison treats them), then the position reversed.
__device__ __forceinline__ uint64_t topk_key(float score, int32_t pos) {
  if (score == 0.f) score = 0.f;
  uint32_t b = __float_as_uint(score);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<uint64_t>(b) << 32) | static_cast<uint32_t>(0x7fffffff - pos);
}

// One block per row: an 8-bit radix select over the 64-bit keys finds the keff-th best key
// (stopping early once the keys sharing the selected prefix are exactly the ones still needed),
// the selected positions are gathered into shared memory and sorted ascending (bitonic, over
// `nsort`, a power of two >= keff).
__global__ void topk_kernel(int64_t tokens, int64_t K, int64_t topk, int64_t nsort,
                            const float* scores, const int32_t* cand, int32_t* out) {
  extern __shared__ int32_t sel[];  // [nsort]
  __shared__ int32_t hist[256];
  __shared__ int32_t n_valid, n_taken_eq, n_sel;
  __shared__ uint64_t prefix_s, mask_s;
  __shared__ int64_t need_s;
  __shared__ bool done_s;
  const int64_t t = blockIdx.x;
  const float* sr = scores + t * K;
  const int32_t* cr = cand + t * K;
  int32_t* orow = out + t * topk;
  if (threadIdx.x == 0) {
    n_valid = 0;
    n_taken_eq = 0;
    n_sel = 0;
    prefix_s = 0;
    mask_s = 0;
    done_s = false;
  }
  __syncthreads();
  int32_t mine = 0;
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x) mine += valid_slot(cr[j], tokens);
  atomicAdd(&n_valid, mine);
  __syncthreads();
  const int64_t keff = min(topk, static_cast<int64_t>(n_valid));
  if (threadIdx.x == 0) need_s = keff;
  __syncthreads();
  for (int shift = 56; shift >= 0 && keff > 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    const uint64_t prefix = prefix_s, mask = mask_s;
    for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
      const int32_t s = cr[j];
      if (!valid_slot(s, tokens)) continue;
      const uint64_t key = topk_key(sr[j], s);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t need = need_s, above = 0;
      int digit = 0;
      for (int d = 255; d >= 0; --d) {
        if (above + hist[d] >= need) {
          digit = d;
          break;
        }
        above += hist[d];
      }
      need -= above;
      need_s = need;
      prefix_s = prefix | (static_cast<uint64_t>(digit) << shift);
      mask_s = mask | (static_cast<uint64_t>(255) << shift);
      done_s = hist[digit] == need;
    }
    __syncthreads();
    if (done_s) break;
  }
  // Keys above the prefix are all taken; of the keys equal to it, `need` are (all of them when the
  // select stopped early, else exact duplicates of one position, which are interchangeable).
  const uint64_t prefix = prefix_s, mask = mask_s;
  const int64_t need = need_s;
  for (int64_t j = threadIdx.x; j < K && keff > 0; j += blockDim.x) {
    const int32_t s = cr[j];
    if (!valid_slot(s, tokens)) continue;
    const uint64_t key = topk_key(sr[j], s) & mask;
    if (key > prefix || (key == prefix && atomicAdd(&n_taken_eq, 1) < need))
      sel[atomicAdd(&n_sel, 1)] = s;
  }
  __syncthreads();
  for (int64_t i = keff + threadIdx.x; i < nsort; i += blockDim.x) sel[i] = 0x7fffffff;
  __syncthreads();
  for (int64_t size = 2; size <= nsort; size <<= 1)
    for (int64_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (int64_t i = threadIdx.x; i < nsort; i += blockDim.x) {
        const int64_t p = i ^ stride;
        if (p > i) {
          const int32_t a = sel[i], b = sel[p];
          if ((a > b) == ((i & size) == 0)) {
            sel[i] = b;
            sel[p] = a;
          }
        }
      }
      __syncthreads();
    }
  for (int64_t i = threadIdx.x; i < topk; i += blockDim.x) orow[i] = i < keff ? sel[i] : -1;
}

// Per row: softmax of the scores over the valid slots and KL(p || softmax) in double, as the CPU.
__global__ void kl_fwd_kernel(int64_t tokens, int64_t K, const float* scores, const float* target,
                              const int32_t* idx, float* softmax, double* row_kl) {
  const int64_t t = blockIdx.x;
  const int32_t* row = idx + t * K;
  const float* srow = scores + t * K;
  const float* trow = target + t * K;
  float* mrow = softmax + t * K;
  float m = -INFINITY;
  double ts = 0;
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
    if (!valid_slot(row[j], tokens)) continue;
    m = fmaxf(m, srow[j]);
    ts += trow[j];
  }
  m = block_max(m);
  const double tsum = block_sum(ts);
  if (m == -INFINITY) {
    for (int64_t j = threadIdx.x; j < K; j += blockDim.x) mrow[j] = 0.f;
    if (threadIdx.x == 0) row_kl[t] = 0;
    return;
  }
  double z = 0;
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x)
    if (valid_slot(row[j], tokens)) z += exp(static_cast<double>(srow[j] - m));
  const double logz = m + log(block_sum(z));
  double kl = 0;
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
    if (!valid_slot(row[j], tokens)) {
      mrow[j] = 0.f;
      continue;
    }
    const double logq = srow[j] - logz;
    mrow[j] = static_cast<float>(exp(logq));
    if (tsum > 0 && trow[j] > 0) {
      const double pj = trow[j] / tsum;
      kl += pj * (log(pj) - logq);
    }
  }
  kl = block_sum(kl);
  if (threadIdx.x == 0) row_kl[t] = kl;
}

// The rows' losses added in a fixed order by one block.
__global__ void sum_rows_kernel(int64_t n, const double* v, double* total) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *total = s;
}

__global__ void kl_bwd_kernel(int64_t tokens, int64_t K, double c, const float* softmax,
                              const float* target, const int32_t* idx, float* dscores) {
  const int64_t t = blockIdx.x;
  const int32_t* row = idx + t * K;
  double ts = 0;
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x)
    if (valid_slot(row[j], tokens)) ts += target[t * K + j];
  const double tsum = block_sum(ts);
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
    float g = 0.f;
    // A zero target contributes no loss, hence no gradient (softmax sums to 1 regardless).
    if (valid_slot(row[j], tokens) && tsum > 0)
      g = static_cast<float>(c * (softmax[t * K + j] - target[t * K + j] / tsum));
    dscores[t * K + j] = g;
  }
}

int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace

void indexer_scores_forward(Context& ctx, const IndexerParams& p, const Tensor& q, const Tensor& k,
                            const Tensor& w, const Tensor& indices, Tensor& scores) {
  const char* op = "indexer_scores_forward";
  expect_same_dtype(op, q, k, "k");
  expect_same_dtype(op, q, w, "w");
  expect_f32(op, scores, "scores");
  if (p.tokens == 0 || p.kmax == 0) return;
  if (indexer_scores_tc_takes(p, q, k))
    return indexer_scores_forward_tc(ctx, p, q, k, w, indices, scores);
  const int64_t H = p.heads, D = p.head_dim;
  MT_DISPATCH_FLOAT(q, op, {
    auto kernel = scores_fwd_kernel<T>;
    const size_t sm = smem_for(kernel, sizeof(float) * static_cast<size_t>((H + kWarps) * D), op);
    kernel<<<grid_of(p.tokens, op), kThreads, sm, stream(ctx)>>>(
        p.tokens, H, D, p.kmax, p.eff_scale(), ptr<T>(q), ptr<T>(k), ptr<T>(w),
        ptr<int32_t>(indices), ptr<float>(scores));
  });
  MT_CUDA_LAUNCH_CHECK();
}

namespace {

__global__ void div_kernel(double* v, double by) {
  *v /= by;
}

}  // namespace

void indexer_scores_backward(Context& ctx, const IndexerParams& p, const Tensor& q, const Tensor& k,
                             const Tensor& w, const Tensor& indices, const Tensor& dscores,
                             Tensor& dq, Tensor& dk, Tensor& dw) {
  const char* op = "indexer_scores_backward";
  expect_same_dtype(op, q, k, "k");
  expect_same_dtype(op, q, w, "w");
  expect_same_dtype(op, q, dq, "dq");
  expect_same_dtype(op, q, dk, "dk");
  expect_same_dtype(op, q, dw, "dw");
  expect_f32(op, dscores, "dscores");
  const int64_t NT = p.tokens, H = p.heads, D = p.head_dim, K = p.kmax;
  if (NT == 0) return;
  if (indexer_scores_tc_takes(p, q, k))
    return indexer_scores_backward_tc(ctx, p, q, k, w, indices, dscores, dq, dk, dw);
  const float scale = p.eff_scale();
  const int32_t* idx = ptr<int32_t>(indices);
  ArenaScope scope(ctx.workspace());
  MT_DISPATCH_FLOAT(q, op, {
    auto k1 = scores_bwd_dq_kernel<T>;
    const size_t sm1 =
        smem_for(k1, sizeof(float) * static_cast<size_t>((kWarps + 1) * D + kWarps), op);
    k1<<<grid_of(NT * H, op), kThreads, sm1, stream(ctx)>>>(
        NT, H, D, K, scale, ptr<T>(q), ptr<T>(k), ptr<T>(w), idx, ptr<float>(dscores), ptr<T>(dq),
        ptr<T>(dw));
    MT_CUDA_LAUNCH_CHECK();
    const DeviceKeyLists kl = build_device_key_lists(ctx, idx, NT, K, op);
    auto k2 = scores_bwd_dk_kernel<T>;
    const size_t sm2 = smem_for(k2, sizeof(float) * static_cast<size_t>((kWarps + 1) * D), op);
    k2<<<grid_of(NT, op), kThreads, sm2, stream(ctx)>>>(H, D, K, scale, ptr<T>(q), ptr<T>(k),
                                                        ptr<T>(w), ptr<float>(dscores), kl.offsets,
                                                        kl.entries, ptr<T>(dk));
  });
  MT_CUDA_LAUNCH_CHECK();
}

void topk_select(Context& ctx, const Tensor& scores, const Tensor& candidates, int64_t topk,
                 Tensor& out) {
  const char* op = "topk_select";
  expect_f32(op, scores, "scores");
  const int64_t NT = candidates.dim(0), K = candidates.dim(1);
  if (NT == 0) return;
  const int64_t nsort = pow2_at_least(std::max<int64_t>(std::min(topk, K), 1));
  const size_t sm = smem_for(topk_kernel, sizeof(int32_t) * static_cast<size_t>(nsort), op);
  topk_kernel<<<grid_of(NT, op), kRowThreads, sm, stream(ctx)>>>(
      NT, K, topk, nsort, ptr<float>(scores), ptr<int32_t>(candidates), ptr<int32_t>(out));
  MT_CUDA_LAUNCH_CHECK();
}

void indexer_kl_forward(Context& ctx, const Tensor& scores, const Tensor& target,
                        const Tensor& indices, Tensor& softmax, Tensor& loss) {
  const char* op = "indexer_kl_forward";
  expect_f32(op, scores, "scores");
  expect_f32(op, target, "target");
  expect_f32(op, softmax, "softmax");
  const int64_t NT = indices.dim(0), K = indices.dim(1);
  cudaStream_t s = stream(ctx);
  MT_CUDA_CHECK(cudaMemsetAsync(loss.raw(), 0, sizeof(double), s));
  if (NT == 0) return;
  ArenaScope scope(ctx.workspace());
  Tensor row_kl = ctx.workspace().alloc({NT}, DType::F64);
  kl_fwd_kernel<<<grid_of(NT, op), kRowThreads, 0, s>>>(NT, K, ptr<float>(scores),
                                                        ptr<float>(target), ptr<int32_t>(indices),
                                                        ptr<float>(softmax), ptr<double>(row_kl));
  MT_CUDA_LAUNCH_CHECK();
  // The loss stays on the device (written, never read back here): sum, then divide.
  sum_rows_kernel<<<1, 1024, 0, s>>>(NT, ptr<double>(row_kl), ptr<double>(loss));
  MT_CUDA_LAUNCH_CHECK();
  div_kernel<<<1, 1, 0, s>>>(ptr<double>(loss), static_cast<double>(NT));
  MT_CUDA_LAUNCH_CHECK();
}

void indexer_kl_backward(Context& ctx, const Tensor& softmax, const Tensor& target,
                         const Tensor& indices, double dloss, Tensor& dscores) {
  const char* op = "indexer_kl_backward";
  expect_f32(op, softmax, "softmax");
  expect_f32(op, target, "target");
  expect_f32(op, dscores, "dscores");
  const int64_t NT = indices.dim(0), K = indices.dim(1);
  if (NT == 0 || K == 0) return;
  kl_bwd_kernel<<<grid_of(NT, op), kRowThreads, 0, stream(ctx)>>>(
      NT, K, dloss / static_cast<double>(NT), ptr<float>(softmax), ptr<float>(target),
      ptr<int32_t>(indices), ptr<float>(dscores));
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::ops::cuda
