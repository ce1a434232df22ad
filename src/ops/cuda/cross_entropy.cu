// LM head + cross-entropy on the GPU, chunk by chunk of tokens as on the CPU: the f32 logits of one
// chunk live in workspace, never the whole [tokens, vocab]. One block per row does max, sum of
// exponentials and the target's logit; targets are checked in the kernel (a bad one is reported
// by position after the forward's one synchronisation, which the returned mean needs anyway).
#include <algorithm>

#include "ops/cross_entropy.h"
#include "ops/cuda/blas.h"
#include "ops/cuda/common.cuh"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 512;

// (m, s) pairs: the running max and the sum of exp(x - m) over what a thread has seen.
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  s = (m == -INFINITY ? 0.f : s * __expf(m - mn)) + (m2 == -INFINITY ? 0.f : s2 * __expf(m2 - mn));
  m = mn;
}

// log sum exp of a row of V logits in one read (an online max and sum per thread, merged across
// the block); every thread gets it. The row is read once here and once more by the gradient: the
// logits of a 1,024-token chunk are 671 MB at Kimi's vocabulary.
__device__ __forceinline__ float row_lse(const float* lr, int64_t V) {
  float m = -INFINITY, s = 0.f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float x = lr[v];
    if (x > m) {
      s = (m == -INFINITY ? 0.f : s * __expf(m - x)) + 1.f;
      m = x;
    } else {
      s += __expf(x - m);
    }
  }
  for (int o = 16; o > 0; o >>= 1)
    lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  __shared__ float pm[32], ps[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // pm/ps may still be read by a previous call
  if (lane == 0) {
    pm[warp] = m;
    ps[warp] = s;
  }
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  m = lane < warps ? pm[lane] : -INFINITY;
  s = lane < warps ? ps[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1)
    lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  return m + logf(s);
}

// A row with no loss: an ignored target (lse 0) or one out of range (reported by position).
__device__ __forceinline__ bool row_skipped(int64_t t, int32_t target, int32_t ignore, int64_t V,
                                            float* lse, int32_t* bad) {
  if (target != ignore && target >= 0 && target < V) return false;
  if (threadIdx.x == 0) {
    if (target == ignore)
      lse[t] = 0.f;
    else
      atomicMin(bad, static_cast<int32_t>(t));
  }
  return true;
}

// The row's lse into lse[t] and its loss (lse - logit[target]) into the sum; every thread gets lse.
__device__ __forceinline__ float row_loss(int64_t t, const float* lr, int64_t V, int32_t target,
                                          float* lse, double* loss_sum) {
  const float l = row_lse(lr, V);
  if (threadIdx.x == 0) {
    lse[t] = l;
    atomicAdd(loss_sum, static_cast<double>(l) - lr[target]);
  }
  return l;
}

// dlogits of a row = scale * (softmax - onehot); an ignored row (target < 0) gets zeros, also
// where ignore_index is itself a valid id (the caller passes -1 then).
template <typename T>
__device__ __forceinline__ void row_grad(T* gr, const float* lr, int64_t V, int32_t target, float l,
                                         float scale) {
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    float d = 0.f;
    if (target >= 0)
      d = v == target ? scale * __expf(lr[v] - l) - scale : scale * __expf(lr[v] - l);
    st(gr, v, d);
  }
}

__device__ __forceinline__ float grad_scale(float dloss, const int64_t* valid) {
  return dloss / static_cast<float>(*valid > 0 ? *valid : 1);
}

// Per row of the chunk: lse and the row's loss; ignored rows give 0 and 0.
__global__ void ce_fwd_kernel(int64_t t0, int64_t V, int32_t ignore, const float* logits,
                              const int32_t* tg, float* lse, double* loss_sum, int32_t* bad) {
  const int64_t r = blockIdx.x, t = t0 + r;
  const int32_t target = tg[t];
  if (row_skipped(t, target, ignore, V, lse, bad)) return;
  row_loss(t, logits + r * V, V, target, lse, loss_sum);
}

// dlogits = scale * (softmax - onehot), scale = dloss / valid read from the device.
template <typename T>
__global__ void ce_bwd_kernel(int64_t t0, int64_t V, int32_t ignore, float dloss,
                              const int64_t* valid, const float* logits, const int32_t* tg,
                              const float* lse, T* g) {
  const int64_t r = blockIdx.x, t = t0 + r;
  const int32_t target = tg[t];
  row_grad(g + r * V, logits + r * V, V, target == ignore ? -1 : target, lse[t],
           grad_scale(dloss, valid));
}

// Both at once for a row: lse and its loss as ce_fwd_kernel, then dlogits as ce_bwd_kernel with
// that lse (the same float backward would read), so the row's logits are read twice, not three
// times. `valid` is counted before the first chunk.
template <typename T>
__global__ void ce_fused_kernel(int64_t t0, int64_t V, int32_t ignore, float dloss,
                                const int64_t* valid, const float* logits, const int32_t* tg,
                                float* lse, double* loss_sum, int32_t* bad, T* g) {
  const int64_t r = blockIdx.x, t = t0 + r;
  const int32_t target = tg[t];
  const float* lr = logits + r * V;
  if (row_skipped(t, target, ignore, V, lse, bad)) {
    row_grad(g + r * V, lr, V, -1, 0.f, 0.f);
    return;
  }
  const float l = row_loss(t, lr, V, target, lse, loss_sum);
  row_grad(g + r * V, lr, V, target, l, grad_scale(dloss, valid));
}

__global__ void count_valid_kernel(int64_t n, int32_t ignore, const int32_t* tg, int64_t* valid) {
  int64_t c = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) c += tg[i] != ignore;
  const float s = block_sum(static_cast<float>(c));  // exact below 2^24 tokens per thread block
  if (threadIdx.x == 0) *valid = static_cast<int64_t>(s);
}

// loss = sum / valid (0 without valid targets), on the device: the op never reads it back.
__global__ void ce_mean_kernel(const int64_t* valid, double* loss) {
  *loss = *valid > 0 ? *loss / static_cast<double>(*valid) : 0.0;
}

MatRef mref(const Tensor& t, int64_t row0, int64_t ld) {
  return {static_cast<const char*>(t.raw()) + row0 * ld * dtype_size(t.dtype()), t.dtype(), ld};
}

// logits [rows, V] (f32) = h[t0 .. t0 + rows) w^T.
void chunk_logits(Context& ctx, const CrossEntropyParams& p, const Tensor& h, const Tensor& w,
                  int64_t t0, int64_t rows, Tensor& logits) {
  lt_matmul(ctx, false, true, rows, p.vocab, p.hidden, 1.f, mref(h, t0, p.hidden),
            mref(w, 0, p.hidden), 0.f, logits.raw(), DType::F32, p.vocab);
}

// dh[t0 .. t0 + rows) = g [rows, V] w.
void chunk_dh(Context& ctx, const CrossEntropyParams& p, const Tensor& g, const Tensor& w,
              int64_t t0, int64_t rows, Tensor& dh) {
  lt_matmul(ctx, false, false, rows, p.hidden, p.vocab, 1.f, mref(g, 0, p.vocab),
            mref(w, 0, p.hidden), 0.f,
            static_cast<char*>(dh.raw()) + t0 * p.hidden * dtype_size(dh.dtype()), dh.dtype(),
            p.hidden);
}

// The number of non-ignored targets, into valid (i64 [1], on the device).
Tensor count_valid(Context& ctx, const CrossEntropyParams& p, const Tensor& targets) {
  Tensor valid = ctx.workspace().alloc({1}, DType::I64);
  count_valid_kernel<<<1, 1024, 0, stream(ctx)>>>(p.tokens, p.ignore_index, ptr<int32_t>(targets),
                                                  ptr<int64_t>(valid));
  MT_CUDA_LAUNCH_CHECK();
  return valid;
}

constexpr int32_t kNoBadTarget = 0x7fffffff;

// The first out-of-range target's position (i32 [1]), kNoBadTarget until a kernel finds one.
Tensor bad_target_slot(Context& ctx) {
  Tensor bad = ctx.workspace().alloc({1}, DType::I32);
  MT_CUDA_CHECK(cudaMemcpyAsync(bad.raw(), &kNoBadTarget, sizeof kNoBadTarget,
                                cudaMemcpyHostToDevice, stream(ctx)));
  return bad;
}

// The mean from the sum, then the one read-back of the forward ops: an out-of-range target is an
// error naming its position (docs/gpu.md, "Synchronisation points", lists it until batches are
// validated on the host).
void finish_forward(Context& ctx, const CrossEntropyParams& p, const Tensor& targets,
                    const Tensor& valid, const Tensor& bad, Tensor& loss) {
  cudaStream_t s = stream(ctx);
  ce_mean_kernel<<<1, 1, 0, s>>>(ptr<int64_t>(valid), ptr<double>(loss));
  MT_CUDA_LAUNCH_CHECK();
  int32_t first_bad = kNoBadTarget;
  MT_CUDA_CHECK(
      cudaMemcpyAsync(&first_bad, bad.raw(), sizeof first_bad, cudaMemcpyDeviceToHost, s));
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  if (first_bad != kNoBadTarget) {
    int32_t target = 0;
    MT_CUDA_CHECK(cudaMemcpy(&target, ptr<int32_t>(targets) + first_bad, sizeof target,
                             cudaMemcpyDeviceToHost));
    MT_THROW(ValueError, "cross_entropy: target ", target, " at position ", first_bad,
             " is outside [0, ", p.vocab, ") and is not ignore_index ", p.ignore_index);
  }
}

}  // namespace

void lm_head_cross_entropy_forward(Context& ctx, const CrossEntropyParams& p, const Tensor& h,
                                   const Tensor& w, const Tensor& targets, Tensor& lse,
                                   Tensor& loss) {
  expect_same_dtype("cross_entropy", h, w, "lm_head weight");
  expect_f32("cross_entropy", lse, "lse");
  cudaStream_t s = stream(ctx);
  MT_CUDA_CHECK(cudaMemsetAsync(loss.raw(), 0, sizeof(double), s));
  if (p.tokens == 0) return;
  const int64_t V = p.vocab, chunk = std::min(p.chunk_tokens, p.tokens);
  ArenaScope scope(ctx.workspace());
  Tensor logits = ctx.workspace().alloc({chunk, V});
  Tensor& sum = loss;  // the sum first, divided by the valid count at the end
  Tensor bad = bad_target_slot(ctx);
  for (int64_t t0 = 0; t0 < p.tokens; t0 += chunk) {
    const int64_t rows = std::min(chunk, p.tokens - t0);
    chunk_logits(ctx, p, h, w, t0, rows, logits);
    ce_fwd_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(
        t0, V, p.ignore_index, ptr<float>(logits), ptr<int32_t>(targets), ptr<float>(lse),
        ptr<double>(sum), ptr<int32_t>(bad));
    MT_CUDA_LAUNCH_CHECK();
  }
  finish_forward(ctx, p, targets, count_valid(ctx, p, targets), bad, loss);
}

void lm_head_cross_entropy_forward_backward(Context& ctx, const CrossEntropyParams& p,
                                            const Tensor& h, const Tensor& w, const Tensor& targets,
                                            float dloss, Tensor& lse, Tensor& loss, Tensor& dh) {
  expect_same_dtype("cross_entropy", h, w, "lm_head weight");
  expect_same_dtype("cross_entropy", h, dh, "dh");
  expect_f32("cross_entropy", lse, "lse");
  cudaStream_t s = stream(ctx);
  MT_CUDA_CHECK(cudaMemsetAsync(loss.raw(), 0, sizeof(double), s));
  if (p.tokens == 0) return;
  const int64_t V = p.vocab, chunk = std::min(p.chunk_tokens, p.tokens);
  ArenaScope scope(ctx.workspace());
  Tensor logits = ctx.workspace().alloc({chunk, V});
  Tensor g = ctx.workspace().alloc({chunk, V}, h.dtype());  // dlogits
  Tensor bad = bad_target_slot(ctx);
  const Tensor valid = count_valid(ctx, p, targets);
  for (int64_t t0 = 0; t0 < p.tokens; t0 += chunk) {
    const int64_t rows = std::min(chunk, p.tokens - t0);
    chunk_logits(ctx, p, h, w, t0, rows, logits);
    MT_DISPATCH_FLOAT(h, "cross_entropy", {
      ce_fused_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, s>>>(
          t0, V, p.ignore_index, dloss, ptr<int64_t>(valid), ptr<float>(logits),
          ptr<int32_t>(targets), ptr<float>(lse), ptr<double>(loss), ptr<int32_t>(bad), ptr<T>(g));
    });
    MT_CUDA_LAUNCH_CHECK();
    chunk_dh(ctx, p, g, w, t0, rows, dh);
  }
  finish_forward(ctx, p, targets, valid, bad, loss);
}

void lm_head_cross_entropy_backward(Context& ctx, const CrossEntropyParams& p, const Tensor& h,
                                    const Tensor& w, const Tensor& targets, const Tensor& lse,
                                    float dloss, Tensor& dh, Tensor& dw) {
  expect_same_dtype("cross_entropy", h, w, "lm_head weight");
  expect_same_dtype("cross_entropy", h, dh, "dh");
  expect_f32("cross_entropy", dw, "lm_head weight gradient");
  if (p.tokens == 0) return;
  const int64_t V = p.vocab, D = p.hidden, chunk = std::min(p.chunk_tokens, p.tokens);
  cudaStream_t s = stream(ctx);
  ArenaScope scope(ctx.workspace());
  Tensor logits = ctx.workspace().alloc({chunk, V});
  Tensor g = ctx.workspace().alloc({chunk, V}, h.dtype());  // dlogits, an operand of two GEMMs
  const Tensor valid = count_valid(ctx, p, targets);
  for (int64_t t0 = 0; t0 < p.tokens; t0 += chunk) {
    const int64_t rows = std::min(chunk, p.tokens - t0);
    chunk_logits(ctx, p, h, w, t0, rows, logits);
    MT_DISPATCH_FLOAT(h, "cross_entropy", {
      ce_bwd_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, s>>>(
          t0, V, p.ignore_index, dloss, ptr<int64_t>(valid), ptr<float>(logits),
          ptr<int32_t>(targets), ptr<float>(lse), ptr<T>(g));
    });
    MT_CUDA_LAUNCH_CHECK();
    chunk_dh(ctx, p, g, w, t0, rows, dh);
    if (dw.defined())
      lt_matmul(ctx, true, false, V, D, rows, 1.f, mref(g, 0, V), mref(h, t0, D), 1.f, dw.raw(),
                DType::F32, D);
  }
}

void lm_head_logits(Context& ctx, const Tensor& h, const Tensor& w, Tensor& logits) {
  expect_same_dtype("lm_head_logits", h, w, "lm_head weight");
  lt_matmul(ctx, false, true, h.dim(0), w.dim(0), h.dim(1), 1.f, mref(h, 0, h.dim(1)),
            mref(w, 0, w.dim(1)), 0.f, logits.raw(), logits.dtype(), w.dim(0));
}

}  // namespace mt::ops::cuda
