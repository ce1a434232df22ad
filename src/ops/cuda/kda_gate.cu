// The KDA decay gate on the GPU: g = -exp(A_log[h]) * softplus(raw + dt_bias), in fp32 (g is the
// log-decay that the KDA core sums over a chunk, so it stays f32 whatever raw's type).
#include "ops/cuda/colsum.cuh"
#include "ops/cuda/common.cuh"
#include "ops/kda_gate.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float softplus(float x) {
  return x > 20.f ? x : log1pf(expf(x));
}
__device__ __forceinline__ float softplus_grad(float x) {
  return x > 20.f ? 1.f : 1.f / (1.f + expf(-x));
}

template <typename T>
__global__ void gate_fwd_kernel(int64_t n, int64_t HK, int64_t K, const T* raw, const float* a_log,
                                const float* dt_bias, float* g) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % HK;
    g[i] = -expf(a_log[c / K]) * softplus(ld(raw, i) + dt_bias[c]);
  }
}

template <typename T>
__global__ void gate_bwd_kernel(int64_t n, int64_t HK, int64_t K, const T* raw, const float* a_log,
                                const float* dt_bias, const float* dg, T* draw) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % HK;
    st(draw, i, -expf(a_log[c / K]) * softplus_grad(ld(raw, i) + dt_bias[c]) * dg[i]);
  }
}

}  // namespace

void kda_gate_forward(Context& ctx, const KdaGateParams& p, const Tensor& raw, const Tensor& a_log,
                      const Tensor& dt_bias, Tensor& g) {
  expect_f32("kda_gate", a_log, "A_log");
  expect_f32("kda_gate", dt_bias, "dt_bias");
  expect_f32("kda_gate", g, "g");
  const int64_t HK = p.heads * p.head_dim, n = p.tokens * HK;
  if (n == 0) return;
  MT_DISPATCH_FLOAT(raw, "kda_gate", {
    gate_fwd_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream(ctx)>>>(
        n, HK, p.head_dim, ptr<T>(raw), ptr<float>(a_log), ptr<float>(dt_bias), ptr<float>(g));
  });
  MT_CUDA_LAUNCH_CHECK();
}

void kda_gate_backward(Context& ctx, const KdaGateParams& p, const Tensor& raw, const Tensor& a_log,
                       const Tensor& dt_bias, const Tensor& dg, Tensor& draw, Tensor& da_log,
                       Tensor& ddt_bias) {
  expect_f32("kda_gate", dg, "dg");
  expect_same_dtype("kda_gate", raw, draw, "draw");
  expect_f32("kda_gate", da_log, "A_log gradient");
  expect_f32("kda_gate", ddt_bias, "dt_bias gradient");
  const int64_t HK = p.heads * p.head_dim, K = p.head_dim, n = p.tokens * HK;
  if (n == 0) return;
  MT_DISPATCH_FLOAT(raw, "kda_gate", {
    const T* praw = ptr<T>(raw);
    const float* pa = ptr<float>(a_log);
    const float* pb = ptr<float>(dt_bias);
    const float* pdg = ptr<float>(dg);
    gate_bwd_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream(ctx)>>>(
        n, HK, K, praw, pa, pb, pdg, ptr<T>(draw));
    MT_CUDA_LAUNCH_CHECK();
    // dt_bias receives the raw-input gradient summed over tokens; A_log receives dg * g (the gate
    // is linear in exp(A_log)), summed over tokens and the head's channels.
    if (ddt_bias.defined())
      colsum_accumulate(
          ctx, p.tokens, HK, ptr<float>(ddt_bias), [=] __device__(int64_t r, int64_t c) {
            return -expf(pa[c / K]) * softplus_grad(ld(praw, r * HK + c) + pb[c]) * pdg[r * HK + c];
          });
    if (da_log.defined())
      colsum_accumulate(
          ctx, p.tokens, p.heads, ptr<float>(da_log), [=] __device__(int64_t r, int64_t h) {
            float s = 0.f;
            for (int64_t k = 0; k < K; ++k) {
              const int64_t c = h * K + k;
              s += -expf(pa[h]) * softplus(ld(praw, r * HK + c) + pb[c]) * pdg[r * HK + c];
            }
            return s;
          });
  });
}

}  // namespace mt::ops::cuda
