// Overflow rerouting on the GPU (direct version). The assignment is a greedy pass in a total order
// over the shed pairs, each move changing the loads the next one sees: sequential by nature, and
// its statistics are returned to the host anyway. So the candidates' priorities are formed on the
// device, the candidates and priorities come to the host once (the op's one synchronisation,
// docs/gpu.md), the host core ops::overflow_assign (the CPU's, so the result is identical) picks
// the final ids, and those go back for the gate weights, computed on the device. The backward is
// the router's (ops/overflow_route.cpp).
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/overflow_route.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

// prio[t, j] = scores[t, cand[t, j]] + bias[cand[t, j]]; a candidate out of range gets 0 here and
// is reported by overflow_assign, which checks every candidate on the host.
__global__ void prio_kernel(int64_t T, int64_t E, int64_t W, const float* scores, const float* bias,
                            const int32_t* cand, float* prio) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < T * W;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t e = cand[i];
    const int64_t t = i / W;
    prio[i] = e >= 0 && e < E ? scores[t * E + e] + (bias ? bias[e] : 0.f) : 0.f;
  }
}

// The router's gate formula on the unbiased scores of the final ids, one thread per token.
__global__ void gate_kernel(int64_t T, int64_t E, int64_t K, bool norm, float scaling,
                            const float* scores, const int32_t* ids, float* weights) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < T;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* s = scores + t * E;
    double sum = 0;
    for (int64_t j = 0; j < K; ++j) sum += s[ids[t * K + j]];
    const double scale = norm ? scaling / (sum + 1e-20) : static_cast<double>(scaling);
    for (int64_t j = 0; j < K; ++j)
      weights[t * K + j] = static_cast<float>(s[ids[t * K + j]] * scale);
  }
}

}  // namespace

OverflowStats overflow_route_forward(Context& ctx, const OverflowParams& p, const RouterParams& rp,
                                     const std::vector<int32_t>& expert_rank, const Tensor& scores,
                                     const Tensor& bias, const Tensor& cand, Tensor& ids,
                                     Tensor& weights) {
  expect_f32("overflow_route", scores, "scores");
  expect_f32("overflow_route", bias, "bias");
  expect_f32("overflow_route", weights, "weights");
  const int64_t T = p.tokens, E = p.experts, K = p.top_k, W = p.top_k + p.extra;
  cudaStream_t s = stream(ctx);
  const bool has_bias = bias.defined() && bias.numel() > 0;
  std::vector<int32_t> h_cand(static_cast<size_t>(T * W)), h_ids(static_cast<size_t>(T * K));
  std::vector<float> h_prio(static_cast<size_t>(T * W));
  if (T > 0) {
    ArenaScope scope(ctx.workspace());
    Tensor prio = ctx.workspace().alloc({T, W});
    prio_kernel<<<blocks_for(T * W, kThreads, 4096), kThreads, 0, s>>>(
        T, E, W, ptr<float>(scores), has_bias ? ptr<float>(bias) : nullptr, ptr<int32_t>(cand),
        ptr<float>(prio));
    MT_CUDA_LAUNCH_CHECK();
    MT_CUDA_CHECK(cudaMemcpyAsync(h_cand.data(), cand.raw(), h_cand.size() * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, s));
    MT_CUDA_CHECK(cudaMemcpyAsync(h_prio.data(), prio.raw(), h_prio.size() * sizeof(float),
                                  cudaMemcpyDeviceToHost, s));
    MT_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  const OverflowStats st =
      overflow_assign(p, h_cand.data(), h_prio.data(), expert_rank, h_ids.data(), nullptr);
  if (T == 0) return st;
  // From pageable memory the copy has taken the bytes when it returns, so h_ids may go.
  MT_CUDA_CHECK(cudaMemcpyAsync(ids.raw(), h_ids.data(), h_ids.size() * sizeof(int32_t),
                                cudaMemcpyHostToDevice, s));
  gate_kernel<<<blocks_for(T, kThreads, 4096), kThreads, 0, s>>>(
      T, E, K, rp.norm_topk_prob, rp.routed_scaling, ptr<float>(scores), ptr<int32_t>(ids),
      ptr<float>(weights));
  MT_CUDA_LAUNCH_CHECK();
  return st;
}

}  // namespace mt::ops::cuda
