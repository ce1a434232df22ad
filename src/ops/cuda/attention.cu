// Attention over index lists on the GPU, the direct version: one block of four warps per
// (query, head) walks the query's index list, each warp taking every fourth slot with its own
// online softmax (running max, sum and output row in shared memory), merged across warps at the
// end. q.k and p.v are warp reductions over the head dimension; statistics and accumulation are
// fp32. The backward recomputes probabilities from the saved lse: dq per (query, head) the same
// way, dk/dv per (key, kv head) gathered through the transposed index table (index_lists.cuh), so
// every output row has one writer and sums run in a fixed order (no float atomics).
//
// bf16 with query heads sharing key heads in groups of 16 to 64 runs the tensor-core kernels of
// dsa_sparse_attention.cu instead (the backward outside deterministic mode).
//
// The same kernels run dense causal attention without index lists (the key range of a query is
// its document up to itself, found in cu_seqlens) where the tensor-core kernels of
// flash_attention.cu do not apply: fp32, grouped key heads, head dims past their widths.
#include <limits>
#include <vector>

#include "core/device.h"
#include "ops/attention.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/dsa_sparse_attention.h"
#include "ops/cuda/flash_attention.h"
#include "ops/cuda/index_lists.cuh"

namespace mt::ops::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// The keys of one query row: list[j] (-1 when outside [0, tokens)), or first + j without a list.
struct KeySpan {
  const int32_t* list;
  int64_t first, n, tokens;
  __device__ int64_t key(int64_t j) const {
    if (!list) return first + j;
    const int32_t s = list[j];
    return valid_slot(s, tokens) ? s : -1;
  }
};
struct TableRows {
  const int32_t* idx;
  int64_t kmax, tokens;
  __device__ KeySpan span(int64_t t) const { return {idx + t * kmax, 0, kmax, tokens}; }
};
struct CausalRows {
  const int32_t* cu;
  int64_t nseq, tokens;
  __device__ KeySpan span(int64_t t) const {
    const int64_t b = cu[doc_index(cu, nseq, t)];
    return {nullptr, b, t - b + 1, tokens};
  }
};

// The queries that attend to one key: entries[first + i] / kmax, or first + i without a list.
struct QuerySpan {
  const int32_t* entries;
  int64_t first, n, kmax;
  __device__ int64_t query(int64_t i) const {
    return entries ? entries[first + i] / kmax : first + i;
  }
};
struct TableCols {
  const int32_t* offsets;
  const int32_t* entries;
  int64_t kmax;
  __device__ QuerySpan span(int64_t s) const {
    return {entries, offsets[s], offsets[s + 1] - offsets[s], kmax};
  }
};
struct CausalCols {
  const int32_t* cu;
  int64_t nseq;
  __device__ QuerySpan span(int64_t s) const {
    return {nullptr, s, cu[doc_index(cu, nseq, s) + 1] - s, 1};
  }
};

template <typename T, typename Rows>
__global__ void attn_fwd_kernel(int64_t H, int64_t Hk, int64_t Dk, int64_t Dv, float scale,
                                const T* q, const T* k, const T* v, Rows rows, T* o, float* lse) {
  extern __shared__ float smem[];
  float* qs = smem;               // [Dk]
  float* acc = qs + Dk;           // [kWarps][Dv], unnormalised output per warp
  float* wm = acc + kWarps * Dv;  // [kWarps] running max
  float* wl = wm + kWarps;        // [kWarps] running sum
  const int64_t th = blockIdx.x, t = th / H, g = (th % H) / (H / Hk);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int64_t d = threadIdx.x; d < Dk; d += blockDim.x) qs[d] = ld(q, th * Dk + d);
  float* aw = acc + w * Dv;
  for (int64_t d = lane; d < Dv; d += 32) aw[d] = 0.f;
  __syncthreads();
  const KeySpan row = rows.span(t);
  float m = -INFINITY, l = 0.f;
  for (int64_t j = w; j < row.n; j += kWarps) {
    const int64_t s = row.key(j);
    if (s < 0) continue;  // uniform across the warp
    const float sc = scale * warp_dot(qs, k + (s * Hk + g) * Dk, Dk);
    const float mn = fmaxf(m, sc);
    const float corr = expf(m - mn), p = expf(sc - mn);
    l = l * corr + p;
    m = mn;
    const T* vr = v + (s * Hk + g) * Dv;
    for (int64_t d = lane; d < Dv; d += 32) aw[d] = aw[d] * corr + p * ld(vr, d);
  }
  if (lane == 0) {
    wm[w] = m;
    wl[w] = l;
  }
  __syncthreads();
  float M = -INFINITY;
  for (int i = 0; i < kWarps; ++i) M = fmaxf(M, wm[i]);
  if (M == -INFINITY) {  // no valid slot
    for (int64_t d = threadIdx.x; d < Dv; d += blockDim.x) st(o, th * Dv + d, 0.f);
    if (threadIdx.x == 0) lse[th] = -INFINITY;
    return;
  }
  float c[kWarps], L = 0.f;
  for (int i = 0; i < kWarps; ++i) {
    c[i] = expf(wm[i] - M);  // 0 for a warp that saw no slot
    L += wl[i] * c[i];
  }
  const float inv = 1.f / L;
  for (int64_t d = threadIdx.x; d < Dv; d += blockDim.x) {
    float s = 0.f;
    for (int i = 0; i < kWarps; ++i) s += acc[i * Dv + d] * c[i];
    st(o, th * Dv + d, s * inv);
  }
  if (threadIdx.x == 0) lse[th] = M + logf(L);
}

// dq and Delta = o . dout per (query, head).
template <typename T, typename Rows>
__global__ void attn_bwd_dq_kernel(int64_t H, int64_t Hk, int64_t Dk, int64_t Dv, float scale,
                                   const T* q, const T* k, const T* v, Rows rows, const T* o,
                                   const float* lse, const T* dout, T* dq, float* delta) {
  extern __shared__ float smem[];
  float* qs = smem;       // [Dk]
  float* dos = qs + Dk;   // [Dv]
  float* acc = dos + Dv;  // [kWarps][Dk]
  const int64_t th = blockIdx.x, t = th / H, g = (th % H) / (H / Hk);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int64_t d = threadIdx.x; d < Dk; d += blockDim.x) qs[d] = ld(q, th * Dk + d);
  float part = 0.f;
  for (int64_t d = threadIdx.x; d < Dv; d += blockDim.x) {
    const float g_o = ld(dout, th * Dv + d);
    dos[d] = g_o;
    part += g_o * ld(o, th * Dv + d);
  }
  float* aw = acc + w * Dk;
  for (int64_t d = lane; d < Dk; d += 32) aw[d] = 0.f;
  const float dl = block_sum(part);  // its barriers also publish qs and dos
  const float l = lse[th];
  const KeySpan row = rows.span(t);
  for (int64_t j = w; j < row.n; j += kWarps) {
    const int64_t s = row.key(j);
    if (s < 0) continue;
    const T* kr = k + (s * Hk + g) * Dk;
    const float p = expf(scale * warp_dot(qs, kr, Dk) - l);
    const float ds = p * (warp_dot(dos, v + (s * Hk + g) * Dv, Dv) - dl) * scale;
    for (int64_t d = lane; d < Dk; d += 32) aw[d] += ds * ld(kr, d);
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < Dk; d += blockDim.x) {
    float s = 0.f;
    for (int i = 0; i < kWarps; ++i) s += acc[i * Dk + d];
    st(dq, th * Dk + d, s);
  }
  if (threadIdx.x == 0) delta[th] = dl;
}

// dk and dv per (key, kv head), over the (slot, head of the group) pairs that reference the key.
template <typename T, typename Cols>
__global__ void attn_bwd_dkv_kernel(int64_t H, int64_t Hk, int64_t Dk, int64_t Dv, float scale,
                                    const T* q, const T* k, const T* v, const float* lse,
                                    const T* dout, const float* delta, Cols cols, T* dk, T* dv) {
  extern __shared__ float smem[];
  float* ks = smem;              // [Dk]
  float* vs = ks + Dk;           // [Dv]
  float* ak = vs + Dv;           // [kWarps][Dk]
  float* av = ak + kWarps * Dk;  // [kWarps][Dv]
  const int64_t sg = blockIdx.x, s = sg / Hk, g = sg % Hk, G = H / Hk;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int64_t d = threadIdx.x; d < Dk; d += blockDim.x) ks[d] = ld(k, sg * Dk + d);
  for (int64_t d = threadIdx.x; d < Dv; d += blockDim.x) vs[d] = ld(v, sg * Dv + d);
  float* akw = ak + w * Dk;
  float* avw = av + w * Dv;
  for (int64_t d = lane; d < Dk; d += 32) akw[d] = 0.f;
  for (int64_t d = lane; d < Dv; d += 32) avw[d] = 0.f;
  __syncthreads();
  const QuerySpan queries = cols.span(s);
  const int64_t pairs = queries.n * G;
  for (int64_t pi = w; pi < pairs; pi += kWarps) {
    const int64_t t = queries.query(pi / G), th = t * H + g * G + pi % G;
    const T* qr = q + th * Dk;
    const T* dor = dout + th * Dv;
    const float p = expf(scale * warp_dot(qr, ks, Dk) - lse[th]);
    const float ds = p * (warp_dot(dor, vs, Dv) - delta[th]) * scale;
    for (int64_t d = lane; d < Dk; d += 32) akw[d] += ds * ld(qr, d);
    for (int64_t d = lane; d < Dv; d += 32) avw[d] += p * ld(dor, d);
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < Dk; d += blockDim.x) {
    float a = 0.f;
    for (int i = 0; i < kWarps; ++i) a += ak[i * Dk + d];
    st(dk, sg * Dk + d, a);
  }
  for (int64_t d = threadIdx.x; d < Dv; d += blockDim.x) {
    float a = 0.f;
    for (int i = 0; i < kWarps; ++i) a += av[i * Dv + d];
    st(dv, sg * Dv + d, a);
  }
}

// out[t, j] = sum_h p[t, h, j]: one block per query, one warp per slot.
template <typename T>
__global__ void prob_sum_kernel(int64_t tokens, int64_t H, int64_t Hk, int64_t Dk, int64_t K,
                                float scale, const T* q, const T* k, const int32_t* idx,
                                const float* lse, float* out) {
  const int64_t t = blockIdx.x, G = H / Hk;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int64_t j = w; j < K; j += kWarps) {
    const int32_t s = idx[t * K + j];
    float acc = 0.f;
    if (valid_slot(s, tokens))
      for (int64_t h = 0; h < H; ++h)
        acc += expf(scale * warp_dot(q + (t * H + h) * Dk, k + (s * Hk + h / G) * Dk, Dk) -
                    lse[t * H + h]);
    if (lane == 0) out[t * K + j] = acc;
  }
}

void check_dtypes(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  expect_same_dtype(op, q, k, "k");
  expect_same_dtype(op, q, v, "v");
}

}  // namespace

__global__ void causal_indices_kernel(int64_t n, int64_t kmax, const int32_t* pos, int32_t* idx) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t t = i / kmax, j = i % kmax;
  const int32_t p = pos[t];  // the token's position in its document: its row is start .. t
  idx[i] = j <= p ? static_cast<int32_t>(t - p + j) : -1;
}

void causal_indices(const SeqInfo& seq, Tensor& indices) {
  if (seq.positions.device() == Device::CUDA) {
    // From the staged positions, on the legacy stream (ordered with every context's blocking
    // stream): no host table, no copy, no wait.
    const int64_t n = indices.numel();
    if (n == 0) return;
    const int threads = 256;
    causal_indices_kernel<<<static_cast<unsigned>((n + threads - 1) / threads), threads>>>(
        n, indices.dim(1), ptr<int32_t>(seq.positions), ptr<int32_t>(indices));
    MT_CUDA_LAUNCH_CHECK();
    return;
  }
  // Built on the host from the host-side document offsets and copied in one transfer (set-up
  // data of a batch, like the offsets themselves). Without a context there is no stream to order
  // the copy after kernels that may still read this memory (a reused workspace block), so the
  // device is drained first: a synchronisation point (docs/gpu.md).
  const int64_t kmax = indices.dim(1);
  std::vector<int32_t> host(static_cast<size_t>(indices.numel()), -1);
  for (size_t d = 0; d + 1 < seq.offsets.size(); ++d)
    for (int64_t t = seq.offsets[d]; t < seq.offsets[d + 1]; ++t)
      for (int64_t s = seq.offsets[d]; s <= t; ++s)
        host[static_cast<size_t>(t * kmax + s - seq.offsets[d])] = static_cast<int32_t>(s);
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  copy_bytes(indices.raw(), indices.device(), host.data(), Device::CPU,
             host.size() * sizeof(int32_t));
}

namespace {

template <typename T, typename Rows>
void direct_forward(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                    const Tensor& v, const Rows& rows, Tensor& o, Tensor& lse) {
  const int64_t NT = p.tokens, H = p.heads, Dk = p.qk_dim, Dv = p.v_dim;
  auto kernel = attn_fwd_kernel<T, Rows>;
  const size_t sm =
      smem_for(kernel, sizeof(float) * (Dk + kWarps * Dv + 2 * kWarps), "attention_forward");
  kernel<<<grid_of(NT * H, "attention_forward"), kThreads, sm, stream(ctx)>>>(
      H, p.kvh(), Dk, Dv, p.scale, ptr<T>(q), ptr<T>(k), ptr<T>(v), rows, ptr<T>(o),
      ptr<float>(lse));
  MT_CUDA_LAUNCH_CHECK();
}

// dq and Delta (returned, from the workspace: the caller holds a scope).
template <typename T, typename Rows>
Tensor direct_backward_queries(Context& ctx, const AttentionParams& p, const Tensor& q,
                               const Tensor& k, const Tensor& v, const Rows& rows, const Tensor& o,
                               const Tensor& lse, const Tensor& dout, Tensor& dq) {
  const char* op = "attention_backward";
  const int64_t NT = p.tokens, H = p.heads, Dk = p.qk_dim, Dv = p.v_dim;
  Tensor delta = ctx.workspace().alloc({NT, H});
  auto kernel = attn_bwd_dq_kernel<T, Rows>;
  const size_t sm = smem_for(kernel, sizeof(float) * (Dk + Dv + kWarps * Dk), op);
  kernel<<<grid_of(NT * H, op), kThreads, sm, stream(ctx)>>>(
      H, p.kvh(), Dk, Dv, p.scale, ptr<T>(q), ptr<T>(k), ptr<T>(v), rows, ptr<T>(o),
      ptr<float>(lse), ptr<T>(dout), ptr<T>(dq), ptr<float>(delta));
  MT_CUDA_LAUNCH_CHECK();
  return delta;
}

template <typename T, typename Cols>
void direct_backward_keys(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                          const Tensor& v, const Cols& cols, const Tensor& lse, const Tensor& dout,
                          const Tensor& delta, Tensor& dk, Tensor& dv) {
  const char* op = "attention_backward";
  const int64_t NT = p.tokens, H = p.heads, Hk = p.kvh(), Dk = p.qk_dim, Dv = p.v_dim;
  auto kernel = attn_bwd_dkv_kernel<T, Cols>;
  const size_t sm = smem_for(kernel, sizeof(float) * (kWarps + 1) * (Dk + Dv), op);
  kernel<<<grid_of(NT * Hk, op), kThreads, sm, stream(ctx)>>>(
      H, Hk, Dk, Dv, p.scale, ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<float>(lse), ptr<T>(dout),
      ptr<float>(delta), cols, ptr<T>(dk), ptr<T>(dv));
  MT_CUDA_LAUNCH_CHECK();
}

void check_backward_dtypes(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& o, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                           const Tensor& dk, const Tensor& dv) {
  check_dtypes(op, q, k, v);
  expect_same_dtype(op, q, o, "o");
  expect_same_dtype(op, q, dout, "dout");
  expect_same_dtype(op, q, dq, "dq");
  expect_same_dtype(op, q, dk, "dk");
  expect_same_dtype(op, q, dv, "dv");
  expect_f32(op, lse, "lse");
}

bool use_flash(const AttentionParams& p, const Tensor& q) {
  return q.dtype() == DType::BF16 && flash_attention_fits(p.qk_dim, p.v_dim, p.kvh() == p.heads);
}

bool use_sparse(const AttentionParams& p, const Tensor& q) {
  return q.dtype() == DType::BF16 && sparse_attention_fits(p.heads, p.kvh(), p.qk_dim, p.v_dim);
}

}  // namespace

void attention_forward(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& indices, Tensor& o, Tensor& lse) {
  check_dtypes("attention_forward", q, k, v);
  expect_same_dtype("attention_forward", q, o, "o");
  expect_f32("attention_forward", lse, "lse");
  if (p.tokens == 0) return;
  if (use_sparse(p, q)) return sparse_attention_forward(ctx, p, q, k, v, indices, o, lse);
  const TableRows rows{ptr<int32_t>(indices), p.kmax, p.tokens};
  MT_DISPATCH_FLOAT(q, "attention_forward", { direct_forward<T>(ctx, p, q, k, v, rows, o, lse); });
}

void attention_backward(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& indices, const Tensor& o, const Tensor& lse,
                        const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  const char* op = "attention_backward";
  check_backward_dtypes(op, q, k, v, o, lse, dout, dq, dk, dv);
  if (p.tokens == 0) return;
  // The tensor-core backward adds key gradients with float atomics: not bit-repeatable.
  if (use_sparse(p, q) && !ctx.deterministic())
    return sparse_attention_backward(ctx, p, q, k, v, indices, o, lse, dout, dq, dk, dv);
  ArenaScope scope(ctx.workspace());
  const int32_t* idx = ptr<int32_t>(indices);
  MT_DISPATCH_FLOAT(q, op, {
    const Tensor delta = direct_backward_queries<T>(
        ctx, p, q, k, v, TableRows{idx, p.kmax, p.tokens}, o, lse, dout, dq);
    const DeviceKeyLists kl = build_device_key_lists(ctx, idx, p.tokens, p.kmax, op);
    direct_backward_keys<T>(ctx, p, q, k, v, TableCols{kl.offsets, kl.entries, p.kmax}, lse, dout,
                            delta, dk, dv);
  });
}

void causal_attention_forward(Context& ctx, const AttentionParams& p, const Tensor& cu_seqlens,
                              const Tensor& q, const Tensor& k, const Tensor& v, Tensor& o,
                              Tensor& lse) {
  check_dtypes("causal_attention_forward", q, k, v);
  expect_same_dtype("causal_attention_forward", q, o, "o");
  expect_f32("causal_attention_forward", lse, "lse");
  if (p.tokens == 0) return;
  if (use_flash(p, q)) return flash_attention_forward(ctx, p, cu_seqlens, q, k, v, o, lse);
  const CausalRows rows{ptr<int32_t>(cu_seqlens), cu_seqlens.numel() - 1, p.tokens};
  MT_DISPATCH_FLOAT(q, "causal_attention_forward",
                    { direct_forward<T>(ctx, p, q, k, v, rows, o, lse); });
}

void causal_attention_backward(Context& ctx, const AttentionParams& p, const Tensor& cu_seqlens,
                               const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                               const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                               Tensor& dv) {
  const char* op = "causal_attention_backward";
  check_backward_dtypes(op, q, k, v, o, lse, dout, dq, dk, dv);
  if (p.tokens == 0) return;
  if (use_flash(p, q))
    return flash_attention_backward(ctx, p, cu_seqlens, q, k, v, o, lse, dout, dq, dk, dv);
  ArenaScope scope(ctx.workspace());
  const int32_t* cu = ptr<int32_t>(cu_seqlens);
  const int64_t nseq = cu_seqlens.numel() - 1;
  MT_DISPATCH_FLOAT(q, op, {
    const Tensor delta = direct_backward_queries<T>(ctx, p, q, k, v, CausalRows{cu, nseq, p.tokens},
                                                    o, lse, dout, dq);
    direct_backward_keys<T>(ctx, p, q, k, v, CausalCols{cu, nseq}, lse, dout, delta, dk, dv);
  });
}

void attention_prob_sum(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                        const Tensor& indices, const Tensor& lse, Tensor& out) {
  const char* op = "attention_prob_sum";
  expect_same_dtype(op, q, k, "k");
  expect_f32(op, lse, "lse");
  expect_f32(op, out, "out");
  if (p.tokens == 0 || p.kmax == 0) return;
  MT_DISPATCH_FLOAT(q, op, {
    prob_sum_kernel<T><<<grid_of(p.tokens, op), kThreads, 0, stream(ctx)>>>(
        p.tokens, p.heads, p.kvh(), p.qk_dim, p.kmax, p.scale, ptr<T>(q), ptr<T>(k),
        ptr<int32_t>(indices), ptr<float>(lse), ptr<float>(out));
  });
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::ops::cuda
