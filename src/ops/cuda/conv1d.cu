// Depthwise causal conv1d on the GPU, varlen: a token finds its document by binary search in
// cu_seqlens and reads the tokens before the document start as zeros. With the SiLU
// (CausalConvParams::silu) forward applies it before the store, and backward first forms dy's
// gradient through it, dpre = dy silu'(conv(x)), from the conv re-formed at each token.
#include "ops/conv1d.h"
#include "ops/cuda/colsum.cuh"
#include "ops/cuda/common.cuh"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

// The document holding token t: the largest i with cu[i] <= t (cu[0] = 0 <= t < cu[docs]).
__device__ __forceinline__ int64_t doc_of(const int32_t* cu, int64_t docs, int64_t t) {
  int64_t lo = 0, hi = docs;  // invariant: cu[lo] <= t < cu[hi]
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (cu[mid] <= t)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// The conv's output at element i = (t, c).
template <typename T>
__device__ __forceinline__ float conv_at(int64_t i, int64_t C, int64_t K, int64_t docs,
                                         const int32_t* cu, const T* x, const T* w) {
  const int64_t t = i / C, c = i % C, s0 = cu[doc_of(cu, docs, t)];
  float acc = 0.f;
  for (int64_t j = 0; j < K; ++j) {
    const int64_t s = t - (K - 1) + j;
    if (s >= s0) acc += ld(w, c * K + j) * ld(x, s * C + c);
  }
  return acc;
}

// kSilu: y = silu(conv), as silu_forward computes it.
template <typename T, bool kSilu>
__global__ void conv_fwd_kernel(int64_t tokens, int64_t C, int64_t K, int64_t docs,
                                const int32_t* cu, const T* x, const T* w, T* y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < tokens * C;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = conv_at(i, C, K, docs, cu, x, w);
    st(y, i, kSilu ? v * sigm(v) : v);
  }
}

// dpre = dy silu'(conv(x)), as silu_backward computes it from a saved conv output.
template <typename T>
__global__ void conv_silu_grad_kernel(int64_t tokens, int64_t C, int64_t K, int64_t docs,
                                      const int32_t* cu, const T* x, const T* w, const T* dy,
                                      T* dpre) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < tokens * C;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    st(dpre, i, silu_grad(conv_at(i, C, K, docs, cu, x, w), ld(dy, i)));
  }
}

template <typename T>
__global__ void conv_bwd_kernel(int64_t tokens, int64_t C, int64_t K, int64_t docs,
                                const int32_t* cu, const T* w, const T* dy, T* dx) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < tokens * C;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = i / C, c = i % C, e = cu[doc_of(cu, docs, s) + 1];
    float acc = 0.f;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t t = s + (K - 1) - j;  // the output that reads x[s] through tap j
      if (t < e) acc += ld(w, c * K + j) * ld(dy, t * C + c);
    }
    st(dx, i, acc);
  }
}

}  // namespace

void causal_conv1d_forward(Context& ctx, const CausalConvParams& p, const Tensor& cu_seqlens,
                           const Tensor& x, const Tensor& w, Tensor& y) {
  expect_same_dtype("causal_conv1d", x, w, "weight");
  expect_same_dtype("causal_conv1d", x, y, "y");
  if (p.tokens == 0) return;
  const int64_t docs = cu_seqlens.numel() - 1;
  MT_DISPATCH_FLOAT(x, "causal_conv1d", {
    const auto launch = [&](auto kernel) {
      kernel<<<blocks_for(p.tokens * p.channels, kThreads), kThreads, 0, stream(ctx)>>>(
          p.tokens, p.channels, p.kernel, docs, ptr<int32_t>(cu_seqlens), ptr<T>(x), ptr<T>(w),
          ptr<T>(y));
    };
    if (p.silu)
      launch(conv_fwd_kernel<T, true>);
    else
      launch(conv_fwd_kernel<T, false>);
  });
  MT_CUDA_LAUNCH_CHECK();
}

void causal_conv1d_backward(Context& ctx, const CausalConvParams& p, const Tensor& cu_seqlens,
                            const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                            Tensor& dw) {
  expect_same_dtype("causal_conv1d", x, w, "weight");
  expect_same_dtype("causal_conv1d", x, dy, "dy");
  expect_same_dtype("causal_conv1d", x, dx, "dx");
  expect_f32("causal_conv1d", dw, "dw");
  if (p.tokens == 0) return;
  const int64_t docs = cu_seqlens.numel() - 1, C = p.channels, K = p.kernel;
  const int32_t* cu = ptr<int32_t>(cu_seqlens);
  ArenaScope scope(ctx.workspace());
  MT_DISPATCH_FLOAT(x, "causal_conv1d", {
    const T* grad = ptr<T>(dy);  // the conv output's gradient
    if (p.silu) {
      Tensor dpre = ctx.workspace().alloc({p.tokens, C}, x.dtype());
      conv_silu_grad_kernel<T><<<blocks_for(p.tokens * C, kThreads), kThreads, 0, stream(ctx)>>>(
          p.tokens, C, K, docs, cu, ptr<T>(x), ptr<T>(w), ptr<T>(dy), ptr<T>(dpre));
      MT_CUDA_LAUNCH_CHECK();
      grad = ptr<T>(dpre);
    }
    conv_bwd_kernel<T><<<blocks_for(p.tokens * C, kThreads), kThreads, 0, stream(ctx)>>>(
        p.tokens, C, K, docs, cu, ptr<T>(w), grad, ptr<T>(dx));
    MT_CUDA_LAUNCH_CHECK();
    if (dw.defined()) {
      const T* px = ptr<T>(x);
      const T* pdy = grad;
      colsum_accumulate(ctx, p.tokens, C * K, ptr<float>(dw),
                        [=] __device__(int64_t tok, int64_t col) {
                          const int64_t c = col / K, j = col % K, s = tok - (K - 1) + j;
                          if (s < cu[doc_of(cu, docs, tok)]) return 0.f;
                          return ld(pdy, tok * C + c) * ld(px, s * C + c);
                        });
    }
  });
}

}  // namespace mt::ops::cuda
