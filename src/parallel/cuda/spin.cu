#include "parallel/cuda/spin.h"

#include "core/cuda/check.h"

namespace mt::par {

namespace {

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(uint64_t ns) {
  const uint64_t t0 = global_ns();
  while (global_ns() - t0 < ns) __nanosleep(1000);
}

}  // namespace

void spin_on_stream(cudaStream_t stream, int64_t us) {
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<uint64_t>(us) * 1000);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::par
