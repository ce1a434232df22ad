// The KDA recurrence token by token on the GPU (ops/kda_step.h). The state's value columns evolve
// independently (u_j = v_j - S[:, j] . k, then S[:, j] += beta k u_j, o_j = S[:, j] . q), so a
// block owns one head's 32 columns: thread (x, y) holds column x at rows y, y + 8, ... of a
// [K, 32] fp32 tile in shared memory, and the two sums over K per token reduce across the 8 rows
// of threads. The state is read once and written once per call, whatever the number of tokens.
#include "ops/cuda/common.cuh"
#include "ops/kda_step.h"

namespace mt::ops::cuda {

namespace {

constexpr int kCols = 32, kRowThreads = 8;

template <typename T>
__global__ void kda_step_kernel(KdaStepParams p, float scale, const T* __restrict__ q,
                                const T* __restrict__ k, const T* __restrict__ v,
                                const float* __restrict__ g, const float* __restrict__ beta,
                                float* __restrict__ state, T* __restrict__ o) {
  extern __shared__ float smem[];
  const int64_t H = p.heads, K = p.head_k, V = p.head_v, h = blockIdx.x;
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kCols + tx;
  const int64_t j = static_cast<int64_t>(blockIdx.y) * kCols + tx;
  const bool col = j < V;
  float* S = smem;            // [K, kCols]
  float* ks = S + K * kCols;  // [K]
  float* qs = ks + K;         // [K]
  float* decay = qs + K;      // [K]
  __shared__ float part[kRowThreads][kCols];
  __shared__ float u[kCols];
  float* Sg = state + h * K * V;
  for (int64_t i = ty; i < K; i += kRowThreads) S[i * kCols + tx] = col ? Sg[i * V + j] : 0.f;
  for (int64_t t = 0; t < p.tokens; ++t) {
    const int64_t r = t * H + h;
    for (int64_t i = tid; i < K; i += kCols * kRowThreads) {
      ks[i] = ld(k, r * K + i);
      qs[i] = ld(q, r * K + i);
      decay[i] = expf(g[r * K + i]);
    }
    __syncthreads();
    float acc = 0.f;
    for (int64_t i = ty; i < K; i += kRowThreads) {
      const float s = S[i * kCols + tx] * decay[i];
      S[i * kCols + tx] = s;
      acc += s * ks[i];
    }
    part[ty][tx] = acc;
    __syncthreads();
    if (ty == 0) {
      float sk = 0.f;
      for (int y = 0; y < kRowThreads; ++y) sk += part[y][tx];
      u[tx] = col ? beta[r] * (ld(v, r * V + j) - sk) : 0.f;
    }
    __syncthreads();
    acc = 0.f;
    for (int64_t i = ty; i < K; i += kRowThreads) {
      const float s = S[i * kCols + tx] + ks[i] * u[tx];
      S[i * kCols + tx] = s;
      acc += s * qs[i];
    }
    part[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && col) {
      float so = 0.f;
      for (int y = 0; y < kRowThreads; ++y) so += part[y][tx];
      st(o, r * V + j, scale * so);
    }
    __syncthreads();  // ks, qs, decay and part are refilled by the next token
  }
  if (col)
    for (int64_t i = ty; i < K; i += kRowThreads) Sg[i * V + j] = S[i * kCols + tx];
}

}  // namespace

void kda_recurrent_step(Context& ctx, const KdaStepParams& p, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& g, const Tensor& beta, Tensor& state,
                        Tensor& o) {
  MT_CHECK(kda_step_fits(p.head_k), ShapeError, "kda_recurrent_step: q/k/g have head_k ", p.head_k,
           ", the kernel keeps the state's [head_k, 32] tile in shared memory: at most 256");
  const size_t smem = sizeof(float) * static_cast<size_t>(p.head_k * (kCols + 3));
  const dim3 grid(static_cast<unsigned>(p.heads),
                  static_cast<unsigned>((p.head_v + kCols - 1) / kCols));
  const dim3 block(kCols, kRowThreads);
  MT_DISPATCH_FLOAT(q, "kda_recurrent_step", {
    kda_step_kernel<T><<<grid, block, smem, stream(ctx)>>>(
        p, p.qk_scale(), ptr<const T>(q), ptr<const T>(k), ptr<const T>(v), ptr<const float>(g),
        ptr<const float>(beta), ptr<float>(state), ptr<T>(o));
  });
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::ops::cuda
