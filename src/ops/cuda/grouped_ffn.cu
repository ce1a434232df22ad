// The SwiGLU between the grouped projections of the routed experts (ops/grouped_ffn.cpp runs the
// projections through grouped_matmul): h = silu(g) * u over gate_up = [g | u] [rows, 2F], and its
// backward, element-wise in the activations' type with fp32 arithmetic.
#include "ops/cuda/common.cuh"
#include "ops/grouped_ffn.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void swiglu_fwd_kernel(int64_t rows, int64_t F, const T* gu, T* h) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * F;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / F, c = i % F;
    const float g = ld(gu, r * 2 * F + c), u = ld(gu, r * 2 * F + F + c);
    st(h, i, g / (1.0f + expf(-g)) * u);
  }
}

template <typename T>
__global__ void swiglu_bwd_kernel(int64_t rows, int64_t F, const T* gu, const T* dh, T* dgu) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * F;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / F, c = i % F;
    const float g = ld(gu, r * 2 * F + c), u = ld(gu, r * 2 * F + F + c), d = ld(dh, i);
    const float sg = 1.0f / (1.0f + expf(-g));
    st(dgu, r * 2 * F + F + c, d * g * sg);
    st(dgu, r * 2 * F + c, d * u * sg * (1.0f + g * (1.0f - sg)));
  }
}

}  // namespace

void grouped_ffn_swiglu_forward(Context& ctx, const Tensor& gate_up, Tensor& h) {
  expect_same_dtype("grouped_ffn swiglu", gate_up, h, "h");
  const int64_t rows = h.dim(0), F = h.dim(1);
  if (rows * F == 0) return;
  MT_DISPATCH_FLOAT(gate_up, "grouped_ffn swiglu", {
    swiglu_fwd_kernel<T><<<blocks_for(rows * F, kThreads), kThreads, 0, stream(ctx)>>>(
        rows, F, ptr<T>(gate_up), ptr<T>(h));
  });
  MT_CUDA_LAUNCH_CHECK();
}

void grouped_ffn_swiglu_backward(Context& ctx, const Tensor& gate_up, const Tensor& dh,
                                 Tensor& dgate_up) {
  expect_same_dtype("grouped_ffn swiglu", gate_up, dh, "dh");
  expect_same_dtype("grouped_ffn swiglu", gate_up, dgate_up, "dgate_up");
  const int64_t rows = dh.dim(0), F = dh.dim(1);
  if (rows * F == 0) return;
  MT_DISPATCH_FLOAT(gate_up, "grouped_ffn swiglu", {
    swiglu_bwd_kernel<T><<<blocks_for(rows * F, kThreads), kThreads, 0, stream(ctx)>>>(
        rows, F, ptr<T>(gate_up), ptr<T>(dh), ptr<T>(dgate_up));
  });
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::ops::cuda
