// AdamW and gradient-norm clipping on the GPU: fp32 parameters (masters), gradients and moments.
// The squared norm is reduced in a fixed order (per-block partials, then one block), in double as
// on the CPU, and read back once: the step's one statistics synchronisation.
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/optim.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kNormBlocks = 512;

__global__ void adamw_kernel(int64_t n, float b1, float b2, float eps, float step_size,
                             float inv_sqrt_bc2, float decay, float* p, const float* g, float* m,
                             float* v) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    const float mi = b1 * m[i] + (1.f - b1) * gi;
    const float vi = b2 * v[i] + (1.f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
  }
}

__global__ void sumsq_partial_kernel(int64_t n, const float* g, double* partial) {
  double s = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    s += static_cast<double>(g[i]) * g[i];
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] += s;
}

__global__ void sum_kernel(int n, const double* partial, double* out) {
  double s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

// norm = sqrt(sum of squares), in place.
__global__ void sqrt_kernel(double* norm) {
  *norm = sqrt(*norm);
}

// The clipping of ops/cpu/optim.cpp with the norm read on the device: the 1e-6 keeps the clipped
// norm just under max_norm, as torch's clip_grad_norm_ does.
__global__ void clip_kernel(int64_t n, double max_norm, const double* norm, float* g) {
  const double nv = *norm;
  if (!(nv > max_norm)) return;
  const float scale = static_cast<float>(max_norm / (nv + 1e-6));
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    g[i] *= scale;
}

}  // namespace

void adamw_step(Context& ctx, const AdamWParams& p, Tensor& param, const Tensor& grad, Tensor& m,
                Tensor& v) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&param, &grad, &m, &v})
    expect_f32("adamw", *t, "parameter, gradient and moments");
  const int64_t n = param.numel();
  if (n == 0) return;
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  adamw_kernel<<<blocks_for(n, kThreads, 8192), kThreads, 0, stream(ctx)>>>(
      n, p.beta1, p.beta2, p.eps, static_cast<float>(p.lr / bc1),
      static_cast<float>(1.0 / std::sqrt(bc2)), 1.0f - p.lr * p.weight_decay, ptr<float>(param),
      ptr<float>(grad), ptr<float>(m), ptr<float>(v));
  MT_CUDA_LAUNCH_CHECK();
}

void grad_norm_sq(Context& ctx, const std::vector<Tensor>& grads, Tensor& total) {
  ArenaScope scope(ctx.workspace());
  Tensor partial = ctx.workspace().alloc({kNormBlocks}, DType::F64);
  MT_CUDA_CHECK(cudaMemsetAsync(partial.raw(), 0, partial.bytes(), stream(ctx)));
  for (const Tensor& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    expect_f32("grad_norm", g, "gradient");
    sumsq_partial_kernel<<<kNormBlocks, kThreads, 0, stream(ctx)>>>(g.numel(), ptr<float>(g),
                                                                    ptr<double>(partial));
    MT_CUDA_LAUNCH_CHECK();
  }
  sum_kernel<<<1, kThreads, 0, stream(ctx)>>>(kNormBlocks, ptr<double>(partial),
                                              ptr<double>(total));
  MT_CUDA_LAUNCH_CHECK();
}

void clip_grad_norm(Context& ctx, const std::vector<Tensor>& grads, double max_norm, Tensor& norm) {
  grad_norm_sq(ctx, grads, norm);
  sqrt_kernel<<<1, 1, 0, stream(ctx)>>>(ptr<double>(norm));
  MT_CUDA_LAUNCH_CHECK();
  if (max_norm <= 0) return;
  for (const Tensor& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    clip_kernel<<<blocks_for(g.numel(), kThreads, 8192), kThreads, 0, stream(ctx)>>>(
        g.numel(), max_norm, ptr<double>(norm), ptr<float>(g));
    MT_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace mt::ops::cuda
