// The MoE router on the GPU (direct version): one warp per token for scores, group-limited top-k
// and gate weights; the losses reduce per token or per document and then in one fixed-order pass,
// so every result is deterministic. Router tensors (logits, scores, weights, their gradients) are
// f32 whatever the model's precision, the losses f64 [1] tensors on the device; the selection
// repeats the CPU's comparisons exactly (descending score, lower index on ties), so ids match the
// CPU's whenever the scores do.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/moe_rules.h"
#include "ops/router.h"

namespace mt::ops::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
constexpr size_t kStaticSmem = 48 << 10;
constexpr double kNormEps = 1e-20;  // the CPU's guard of the top-k renormalisation

__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Warp-wide arg-max in the CPU's order (larger value, then lower index); every lane gets it.
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) {
      v = ov;
      i = oi;
    }
  }
}

// Best (value, index) among a[lo..hi) with stride 32 from lane, in the CPU's order.
__device__ __forceinline__ void lane_argmax(const float* a, int64_t n, int lane, float& v, int& i) {
  v = -INFINITY;
  i = INT32_MAX;
  for (int64_t e = lane; e < n; e += kWarp) {
    const float x = a[e];
    if (x > v || (x == v && e < i)) {
      v = x;
      i = static_cast<int>(e);
    }
  }
}

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

struct Dims {
  int64_t tokens, experts, top_k, n_group, topk_group;
  bool softmax, norm_topk_prob;
  float routed_scaling;
};

Dims dims_of(const RouterParams& p) {
  return {p.tokens,         p.experts,       p.top_k,
          p.n_group,        p.topk_group,    p.score == ScoreFunc::Softmax,
          p.norm_topk_prob, p.routed_scaling};
}

// Shared memory per warp: scores [E], selection work copy [E], group scores [G].
__global__ void router_fwd_kernel(Dims d, const float* logits, const float* bias, float* scores,
                                  int32_t* ids, float* weights) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + warp;
  if (t >= d.tokens) return;  // whole warps leave together
  const int64_t E = d.experts, G = d.n_group, K = d.top_k;
  float* s = smem + warp * (2 * E + G);
  float* work = s + E;
  float* gs = work + E;
  const float* l = logits + t * E;

  if (d.softmax) {
    float mx = -INFINITY;
    for (int64_t i = lane; i < E; i += kWarp) mx = fmaxf(mx, l[i]);
    mx = warp_max(mx);
    double sum = 0;
    for (int64_t i = lane; i < E; i += kWarp) {
      const float e = expf(l[i] - mx);
      s[i] = e;
      sum += e;
    }
    const float inv = static_cast<float>(1.0 / warp_sum_d(sum));
    for (int64_t i = lane; i < E; i += kWarp) s[i] *= inv;
  } else {
    for (int64_t i = lane; i < E; i += kWarp) s[i] = sigmoid(l[i]);
  }
  for (int64_t i = lane; i < E; i += kWarp) {
    work[i] = s[i] + (bias ? bias[i] : 0.0f);
    scores[t * E + i] = s[i];
  }
  __syncwarp();

  if (G > 1) {
    // Group scores as the CPU forms them (top-2 sum for sigmoid, max for softmax), one lane per
    // group; then the kept groups by repeated arg-max; experts of other groups are excluded.
    const int64_t gsize = E / G;
    for (int64_t g = lane; g < G; g += kWarp)
      gs[g] = group_score(work + g * gsize, gsize, !d.softmax);
    __syncwarp();
    // A kept group's score becomes NaN: no later arg-max picks it (NaN compares false), and the
    // experts of the groups still holding a number are excluded from the top-k below.
    for (int64_t j = 0; j < d.topk_group; ++j) {
      float v;
      int g;
      lane_argmax(gs, G, lane, v, g);
      warp_argmax(v, g);
      __syncwarp();  // every lane has read gs before lane 0 marks the chosen group
      if (lane == 0) gs[g] = __int_as_float(0x7fc00000);
      __syncwarp();
    }
    for (int64_t i = lane; i < E; i += kWarp)
      if (!isnan(gs[i / gsize])) work[i] = -INFINITY;
    __syncwarp();
  }

  // Top-k by repeated arg-max: the order is descending score, lower index on ties, as the CPU's
  // partial sort with its strict order.
  double denom = 0;
  for (int64_t j = 0; j < K; ++j) {
    float v;
    int e;
    lane_argmax(work, E, lane, v, e);
    warp_argmax(v, e);
    __syncwarp();  // every lane has read work before lane 0 removes the chosen expert
    if (lane == 0) {
      ids[t * K + j] = e;
      work[e] = -INFINITY;
    }
    denom += s[e];
    __syncwarp();
  }
  const double scale = d.norm_topk_prob ? d.routed_scaling / (denom + kNormEps)
                                        : static_cast<double>(d.routed_scaling);
  for (int64_t j = lane; j < K; j += kWarp) {
    const int32_t e = ids[t * K + j];
    weights[t * K + j] = static_cast<float>(s[e] * scale);
  }
}

// dl (this lane's experts) from ds given sparsely at the token's k experts.
__global__ void router_bwd_kernel(Dims d, const float* scores, const int32_t* ids,
                                  const float* dweights, float* dlogits) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + warp;
  if (t >= d.tokens) return;
  const int64_t E = d.experts, K = d.top_k;
  const float* s = scores + t * E;
  const int32_t* id = ids + t * K;
  const float* dw = dweights + t * K;
  const double c = d.routed_scaling;
  double denom = 0, dot = 0;
  for (int64_t j = 0; j < K; ++j) {
    denom += s[id[j]];
    dot += static_cast<double>(dw[j]) * s[id[j]];
  }
  denom += kNormEps;
  auto ds_of = [&](int64_t j) {
    return d.norm_topk_prob ? static_cast<float>(c * (dw[j] / denom - dot / (denom * denom)))
                            : static_cast<float>(c * dw[j]);
  };
  // Softmax needs <s, ds>, which only the k chosen experts contribute to.
  double sds = 0;
  if (d.softmax)
    for (int64_t j = 0; j < K; ++j) sds += static_cast<double>(s[id[j]]) * ds_of(j);
  for (int64_t i = lane; i < E; i += kWarp) {
    float ds = 0.f;
    for (int64_t j = 0; j < K; ++j)
      if (id[j] == i) ds = ds_of(j);
    dlogits[t * E + i] =
        d.softmax ? s[i] * (ds - static_cast<float>(sds)) : ds * s[i] * (1.0f - s[i]);
  }
}

__global__ void row_sum_kernel(int64_t T, int64_t E, const float* scores, float* sums) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + warp;
  if (t >= T) return;
  double s = 0;
  for (int64_t i = lane; i < E; i += kWarp) s += scores[t * E + i];
  s = warp_sum_d(s);
  if (lane == 0) sums[t] = static_cast<float>(s);
}

// Per document d and expert i: the selection count (times E / (k n) when `scaled`) and, when
// `prob` is given, sum_t s_ti / S_t. Two passes so that a long document is not one thread's
// serial loop (a single 8K-token document took 7 ms that way): chunk_stats_kernel sums each
// kChunk-token chunk of the token axis per expert, blind to documents; doc_stats_kernel then adds,
// per (document, expert), the partials of the chunks inside the document and the tokens of the
// partial chunks at its ends directly. Every sum runs in a fixed order: deterministic.
constexpr int64_t kChunk = 64;

__device__ inline void add_token(int64_t t, int64_t i, int64_t E, int64_t K, const int32_t* ids,
                                 const float* scores, const float* rowsum, float& c, float& p) {
  for (int64_t j = 0; j < K; ++j) c += ids[t * K + j] == i ? 1.0f : 0.0f;
  if (rowsum) p += static_cast<float>(static_cast<double>(scores[t * E + i]) / rowsum[t]);
}

__global__ void chunk_stats_kernel(int64_t T, int64_t E, int64_t K, const float* scores,
                                   const int32_t* ids, const float* rowsum, float* part_c,
                                   float* part_p) {
  const int64_t chunk = blockIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= E) return;
  const int64_t b = chunk * kChunk, e = min(b + kChunk, T);
  float c = 0.f, p = 0.f;
  for (int64_t t = b; t < e; ++t) add_token(t, i, E, K, ids, scores, rowsum, c, p);
  part_c[chunk * E + i] = c;
  if (rowsum) part_p[chunk * E + i] = p;
}

__global__ void doc_stats_kernel(int64_t E, int64_t K, const int64_t* off, const float* scores,
                                 const int32_t* ids, const float* rowsum, const float* part_c,
                                 const float* part_p, float* cnt, float* prob, bool scaled) {
  const int64_t doc = blockIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= E) return;
  const int64_t b = off[doc], e = off[doc + 1];
  // The chunks wholly inside [b, e): [first, last).
  const int64_t first = (b + kChunk - 1) / kChunk, last = e / kChunk;
  float c = 0.f, p = 0.f;
  if (first < last) {
    for (int64_t t = b; t < first * kChunk; ++t) add_token(t, i, E, K, ids, scores, rowsum, c, p);
    for (int64_t ch = first; ch < last; ++ch) {
      c += part_c[ch * E + i];
      if (rowsum) p += part_p[ch * E + i];
    }
    for (int64_t t = last * kChunk; t < e; ++t) add_token(t, i, E, K, ids, scores, rowsum, c, p);
  } else {
    for (int64_t t = b; t < e; ++t) add_token(t, i, E, K, ids, scores, rowsum, c, p);
  }
  if (scaled) c *= static_cast<float>(static_cast<double>(E) / static_cast<double>(K * (e - b)));
  cnt[doc * E + i] = c;
  if (prob) prob[doc * E + i] = p;
}

// Loss of each document, sum_i (E / (k n) cnt_i) (prob_i / n), into per_doc (double).
__global__ void doc_loss_kernel(int64_t E, int64_t K, const int64_t* off, const float* cnt,
                                const float* prob, double* per_doc) {
  const int64_t doc = blockIdx.x;
  const double n = static_cast<double>(off[doc + 1] - off[doc]);
  double l = 0;
  for (int64_t i = threadIdx.x; i < E; i += blockDim.x)
    l += (static_cast<double>(E) / (static_cast<double>(K) * n) * cnt[doc * E + i]) *
         (prob[doc * E + i] / n);
  __shared__ double part[kWarp];
  l = warp_sum_d(l);
  if (threadIdx.x % kWarp == 0) part[threadIdx.x / kWarp] = l;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) s += part[w];
    per_doc[doc] = s;
  }
}

// out[0] = scale * (sum of v[0..n) in a fixed order) (one block).
__global__ void sum_doubles_kernel(int64_t n, const double* v, double scale, double* out) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
  __shared__ double part[kWarp];
  s = warp_sum_d(s);
  if (threadIdx.x % kWarp == 0) part[threadIdx.x / kWarp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double tot = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) tot += part[w];
    out[0] = scale * tot;
  }
}

__global__ void seq_aux_bwd_kernel(Dims d, int64_t docs, const int64_t* off, const float* scores,
                                   const float* f_all, float grad, float* dlogits) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + warp;
  if (t >= d.tokens) return;
  const int64_t E = d.experts;
  // The token's document: the last doc whose start is <= t.
  int64_t lo = 0, hi = docs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (off[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  const double g = grad / (static_cast<double>(docs) * static_cast<double>(off[lo + 1] - off[lo]));
  const float* f = f_all + lo * E;
  const float* s = scores + t * E;
  double sum = 0, fs = 0;
  for (int64_t i = lane; i < E; i += kWarp) {
    sum += s[i];
    fs += static_cast<double>(f[i]) * s[i];
  }
  sum = warp_sum_d(sum);
  fs = warp_sum_d(fs);
  // P_i uses s_i / S: d/ds_m = (f_m - sum_i f_i s_i / S) / S.
  auto ds_of = [&](int64_t i) { return static_cast<float>(g * (f[i] - fs / sum) / sum); };
  double sds = 0;
  if (d.softmax) {
    for (int64_t i = lane; i < E; i += kWarp) sds += static_cast<double>(s[i]) * ds_of(i);
    sds = warp_sum_d(sds);
  }
  for (int64_t i = lane; i < E; i += kWarp) {
    const float ds = ds_of(i);
    dlogits[t * E + i] +=
        d.softmax ? s[i] * (ds - static_cast<float>(sds)) : ds * s[i] * (1.0f - s[i]);
  }
}

// lse_t in double; zsq[t] = lse^2 (forward) or dlogits += c_t softmax(l_t) (backward).
__global__ void z_loss_kernel(int64_t T, int64_t E, const float* logits, double* zsq, float grad,
                              float* dlogits) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + warp;
  if (t >= T) return;
  const float* l = logits + t * E;
  float mxf = -INFINITY;
  for (int64_t i = lane; i < E; i += kWarp) mxf = fmaxf(mxf, l[i]);
  const double mx = warp_max(mxf);
  double sum = 0;
  for (int64_t i = lane; i < E; i += kWarp) sum += exp(l[i] - mx);
  sum = warp_sum_d(sum);
  const double lse = mx + log(sum);
  if (zsq) {
    if (lane == 0) zsq[t] = lse * lse;
    return;
  }
  const double c = grad * 2.0 * lse / static_cast<double>(T);
  for (int64_t i = lane; i < E; i += kWarp)
    dlogits[t * E + i] += static_cast<float>(c * exp(l[i] - mx) / sum);
}

// Integer counts: atomics on integers give the same total in any order, so this is deterministic.
__global__ void load_count_kernel(int64_t n, int64_t E, const int32_t* ids,
                                  unsigned long long* counts, bool use_smem) {
  extern __shared__ unsigned int hist[];
  if (use_smem) {
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
    __syncthreads();
  }
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t e = ids[i];
    if (e < 0 || e >= E) continue;  // ids come from the router; not re-checked here (docs/gpu.md)
    if (use_smem)
      atomicAdd(&hist[e], 1u);
    else
      atomicAdd(&counts[e], 1ull);
  }
  if (use_smem) {
    __syncthreads();
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
      if (hist[e]) atomicAdd(&counts[e], static_cast<unsigned long long>(hist[e]));
  }
}

__global__ void bias_update_kernel(int64_t E, const int64_t* load, float rate, float* bias) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < E; i += blockDim.x) s += static_cast<double>(load[i]);
  __shared__ double part[kWarp];
  __shared__ double mean;
  s = warp_sum_d(s);
  if (threadIdx.x % kWarp == 0) part[threadIdx.x / kWarp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double tot = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) tot += part[w];
    mean = tot / static_cast<double>(E > 1 ? E : 1);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < E; i += blockDim.x) {
    const double diff = mean - static_cast<double>(load[i]);
    bias[i] += rate * static_cast<float>((diff > 0) - (diff < 0));
  }
}

unsigned warp_blocks(int64_t tokens, int warps) {
  return static_cast<unsigned>((tokens + warps - 1) / warps);
}

void expect_router_f32(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) expect_f32(op, *t, "a router tensor");
}

// The documents' token offsets on the device (a stream-ordered copy from the host SeqInfo).
Tensor device_offsets(Context& ctx, const SeqInfo& seq) {
  Tensor off = ctx.workspace().alloc({seq.num_seqs + 1}, DType::I64);
  MT_CUDA_CHECK(cudaMemcpyAsync(off.raw(), seq.offsets.data(),
                                static_cast<size_t>(seq.num_seqs + 1) * sizeof(int64_t),
                                cudaMemcpyHostToDevice, stream(ctx)));
  return off;
}

// Per-document selection counts (and score shares) into cnt / prob [docs, E].
void doc_stats(Context& ctx, const RouterParams& p, const SeqInfo& seq, const Tensor& off,
               const Tensor& scores, const Tensor& ids, Tensor& cnt, float* prob, bool scaled) {
  const int64_t T = p.tokens, E = p.experts;
  const int threads = 128;
  const auto expert_blocks = static_cast<unsigned>((E + threads - 1) / threads);
  Tensor rowsum;
  if (prob) {
    rowsum = ctx.workspace().alloc({T});
    row_sum_kernel<<<warp_blocks(T, kWarpsPerBlock), kWarpsPerBlock * kWarp, 0, stream(ctx)>>>(
        T, E, ptr<float>(scores), ptr<float>(rowsum));
    MT_CUDA_LAUNCH_CHECK();
  }
  const float* rs = prob ? ptr<float>(rowsum) : nullptr;
  const int64_t chunks = (T + kChunk - 1) / kChunk;
  Tensor part_c = ctx.workspace().alloc({std::max<int64_t>(chunks, 1), E});
  Tensor part_p = prob ? ctx.workspace().alloc({std::max<int64_t>(chunks, 1), E}) : Tensor{};
  if (chunks > 0) {
    chunk_stats_kernel<<<dim3(static_cast<unsigned>(chunks), expert_blocks), threads, 0,
                         stream(ctx)>>>(T, E, p.top_k, ptr<float>(scores), ptr<int32_t>(ids), rs,
                                        ptr<float>(part_c), prob ? ptr<float>(part_p) : nullptr);
    MT_CUDA_LAUNCH_CHECK();
  }
  doc_stats_kernel<<<dim3(static_cast<unsigned>(seq.num_seqs), expert_blocks), threads, 0,
                     stream(ctx)>>>(
      E, p.top_k, ptr<int64_t>(off), ptr<float>(scores), ptr<int32_t>(ids), rs, ptr<float>(part_c),
      prob ? ptr<float>(part_p) : nullptr, ptr<float>(cnt), prob, scaled);
  MT_CUDA_LAUNCH_CHECK();
}

// loss[0] = scale * sum of v [n], on the device (the loss stays there: no synchronisation).
void sum_into(Context& ctx, const Tensor& v, int64_t n, double scale, Tensor& loss) {
  sum_doubles_kernel<<<1, 1024, 0, stream(ctx)>>>(n, ptr<double>(v), scale, ptr<double>(loss));
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace

void router_forward(Context& ctx, const RouterParams& p, const Tensor& logits, const Tensor& bias,
                    Tensor& scores, Tensor& ids, Tensor& weights) {
  expect_router_f32("router_forward", {&logits, &bias, &scores, &weights});
  if (p.tokens == 0) return;
  const bool has_bias = bias.defined() && bias.numel() > 0;
  const size_t per_warp = static_cast<size_t>(2 * p.experts + p.n_group) * sizeof(float);
  int warps = kWarpsPerBlock;
  while (warps > 1 && warps * per_warp > kStaticSmem) warps /= 2;
  const size_t smem = warps * per_warp;
  if (smem > kStaticSmem)
    MT_CUDA_CHECK(cudaFuncSetAttribute(
        router_fwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  router_fwd_kernel<<<warp_blocks(p.tokens, warps), warps * kWarp, smem, stream(ctx)>>>(
      dims_of(p), ptr<float>(logits), has_bias ? ptr<float>(bias) : nullptr, ptr<float>(scores),
      ptr<int32_t>(ids), ptr<float>(weights));
  MT_CUDA_LAUNCH_CHECK();
}

void router_backward(Context& ctx, const RouterParams& p, const Tensor& scores, const Tensor& ids,
                     const Tensor& dweights, Tensor& dlogits) {
  expect_router_f32("router_backward", {&scores, &dweights, &dlogits});
  if (p.tokens == 0) return;
  router_bwd_kernel<<<warp_blocks(p.tokens, kWarpsPerBlock), kWarpsPerBlock * kWarp, 0,
                      stream(ctx)>>>(dims_of(p), ptr<float>(scores), ptr<int32_t>(ids),
                                     ptr<float>(dweights), ptr<float>(dlogits));
  MT_CUDA_LAUNCH_CHECK();
}

void router_seq_aux_loss(Context& ctx, const RouterParams& p, const SeqInfo& seq,
                         const Tensor& scores, const Tensor& ids, Tensor& loss) {
  expect_router_f32("router_seq_aux_loss", {&scores});
  MT_CHECK(loss.dtype() == DType::F64, ShapeError, "router_seq_aux_loss: loss must be f64");
  const int64_t E = p.experts, D = seq.num_seqs;
  ArenaScope scope(ctx.workspace());
  Tensor off = device_offsets(ctx, seq);
  Tensor cnt = ctx.workspace().alloc({D, E}), prob = ctx.workspace().alloc({D, E});
  doc_stats(ctx, p, seq, off, scores, ids, cnt, ptr<float>(prob), false);
  Tensor per_doc = ctx.workspace().alloc({D}, DType::F64);
  doc_loss_kernel<<<static_cast<unsigned>(D), 256, 0, stream(ctx)>>>(
      E, p.top_k, ptr<int64_t>(off), ptr<float>(cnt), ptr<float>(prob), ptr<double>(per_doc));
  MT_CUDA_LAUNCH_CHECK();
  sum_into(ctx, per_doc, D, 1.0 / static_cast<double>(D), loss);
}

void router_seq_aux_backward(Context& ctx, const RouterParams& p, const SeqInfo& seq,
                             const Tensor& scores, const Tensor& ids, float grad, Tensor& dlogits) {
  expect_router_f32("router_seq_aux_backward", {&scores, &dlogits});
  if (p.tokens == 0) return;
  ArenaScope scope(ctx.workspace());
  Tensor off = device_offsets(ctx, seq);
  Tensor f = ctx.workspace().alloc({seq.num_seqs, p.experts});
  doc_stats(ctx, p, seq, off, scores, ids, f, nullptr, true);
  seq_aux_bwd_kernel<<<warp_blocks(p.tokens, kWarpsPerBlock), kWarpsPerBlock * kWarp, 0,
                       stream(ctx)>>>(dims_of(p), seq.num_seqs, ptr<int64_t>(off),
                                      ptr<float>(scores), ptr<float>(f), grad, ptr<float>(dlogits));
  MT_CUDA_LAUNCH_CHECK();
}

void router_z_loss(Context& ctx, const RouterParams& p, const Tensor& logits, Tensor& loss) {
  expect_router_f32("router_z_loss", {&logits});
  MT_CHECK(loss.dtype() == DType::F64, ShapeError, "router_z_loss: loss must be f64");
  const int64_t T = p.tokens;
  if (T == 0) {
    MT_CUDA_CHECK(cudaMemsetAsync(loss.raw(), 0, sizeof(double), stream(ctx)));
    return;
  }
  ArenaScope scope(ctx.workspace());
  Tensor zsq = ctx.workspace().alloc({T}, DType::F64);
  z_loss_kernel<<<warp_blocks(T, kWarpsPerBlock), kWarpsPerBlock * kWarp, 0, stream(ctx)>>>(
      T, p.experts, ptr<float>(logits), ptr<double>(zsq), 0.f, nullptr);
  MT_CUDA_LAUNCH_CHECK();
  sum_into(ctx, zsq, T, 1.0 / static_cast<double>(T), loss);
}

void router_z_loss_backward(Context& ctx, const RouterParams& p, const Tensor& logits, float grad,
                            Tensor& dlogits) {
  expect_router_f32("router_z_loss_backward", {&logits, &dlogits});
  const int64_t T = p.tokens;
  if (T == 0) return;
  z_loss_kernel<<<warp_blocks(T, kWarpsPerBlock), kWarpsPerBlock * kWarp, 0, stream(ctx)>>>(
      T, p.experts, ptr<float>(logits), nullptr, grad, ptr<float>(dlogits));
  MT_CUDA_LAUNCH_CHECK();
}

void expert_load_counts(Context& ctx, const Tensor& ids, int64_t experts, Tensor& counts) {
  MT_CHECK(counts.dtype() == DType::I64, ShapeError, "expert_load_counts: counts must be i64");
  MT_CUDA_CHECK(cudaMemsetAsync(counts.raw(), 0, counts.bytes(), stream(ctx)));
  const int64_t n = ids.numel();
  if (n == 0) return;
  const size_t smem = static_cast<size_t>(experts) * sizeof(unsigned int);
  const bool use_smem = smem <= kStaticSmem;
  const int threads = 256;
  load_count_kernel<<<blocks_for(n, threads, 1024), threads, use_smem ? smem : 0, stream(ctx)>>>(
      n, experts, ptr<int32_t>(ids), ptr<unsigned long long>(counts), use_smem);
  MT_CUDA_LAUNCH_CHECK();
}

void router_bias_update(Context& ctx, const Tensor& load, float rate, Tensor& bias) {
  expect_f32("router_bias_update", bias, "bias");
  // The stream orders it after the kernels that counted the load and before the next forward's
  // router reads the bias.
  bias_update_kernel<<<1, 256, 0, stream(ctx)>>>(load.dim(0), ptr<int64_t>(load), rate,
                                                 ptr<float>(bias));
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::ops::cuda
