// Expert bookkeeping on the GPU: per-expert row counts from the dispatch offsets and the id
// relabelling, so that neither needs the plan on the host. Ids and tables come from the router and
// the placement (validated where they are built); an entry out of range is skipped here rather
// than reported (docs/gpu.md).
#include "ops/cuda/common.cuh"
#include "ops/expert_load.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

// Integer atomics: the sum is the same in any order, so the counts are deterministic.
__global__ void load_count_kernel(int64_t S, int64_t E, const int32_t* off, const int32_t* at,
                                  unsigned long long* load) {
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < S;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = at ? at[s] : s;
    const int64_t n = off[s + 1] - off[s];
    if (e >= 0 && e < E && n != 0) atomicAdd(&load[e], static_cast<unsigned long long>(n));
  }
}

__global__ void map_ids_kernel(int64_t n, int64_t m, int32_t* ids, const int32_t* table) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t v = ids[i];
    if (v >= 0 && v < m) ids[i] = table[v];
  }
}

}  // namespace

void expert_load_count(Context& ctx, const Tensor& offsets, const Tensor& slot_expert,
                       Tensor& load) {
  const int64_t S = offsets.numel() - 1, E = load.numel();
  if (S == 0) return;
  const bool mapped = slot_expert.defined() && slot_expert.numel() > 0;
  load_count_kernel<<<blocks_for(S, kThreads, 1024), kThreads, 0, stream(ctx)>>>(
      S, E, ptr<int32_t>(offsets), mapped ? ptr<int32_t>(slot_expert) : nullptr,
      ptr<unsigned long long>(load));
  MT_CUDA_LAUNCH_CHECK();
}

void map_ids(Context& ctx, Tensor& ids, const Tensor& table) {
  const int64_t n = ids.numel();
  if (n == 0) return;
  map_ids_kernel<<<blocks_for(n, kThreads, 4096), kThreads, 0, stream(ctx)>>>(
      n, table.numel(), ptr<int32_t>(ids), ptr<int32_t>(table));
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::ops::cuda
