// Shared pieces of the ops over index tables (attention, indexer): warp dot products, launch
// helpers, and the transpose of an index table on the GPU: for every key position s, the table
// slots e = t * kmax + j that reference it, in increasing slot order. The backward passes gather
// key gradients through it (one block per key, no float atomics), and the sorted order makes their
// sums independent of scheduling, as cpu::build_key_lists does on the host. It is built with
// integer atomics (counts and a fill cursor, whose results do not depend on order) and CUB's
// segmented sort, which restores slot order inside each key's list.
#pragma once

#include <cub/device/device_scan.cuh>
#include <cub/device/device_segmented_sort.cuh>

#include "core/arena.h"
#include "ops/cuda/common.cuh"

namespace mt::ops::cuda {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// a . b over n elements by one warp; every lane gets the sum.
template <typename A, typename B>
__device__ __forceinline__ float warp_dot(const A* a, const B* b, int64_t n) {
  float s = 0.f;
  for (int64_t d = threadIdx.x & 31; d < n; d += 32) s += ld(a, d) * ld(b, d);
  return warp_sum(s);
}

// The document of token t in packed offsets cu [nseq + 1]: cu[i] <= t < cu[i + 1].
__device__ __forceinline__ int64_t doc_index(const int32_t* cu, int64_t nseq, int64_t t) {
  int64_t lo = 0, hi = nseq - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (cu[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ bool valid_slot(int32_t s, int64_t tokens) {
  return s >= 0 && s < tokens;
}

inline unsigned grid_of(int64_t n, const char* op) {
  MT_CHECK(n <= 0x7fffffff, ValueError, op, ": ", n, " blocks exceed one grid");
  return static_cast<unsigned>(n);
}

// Dynamic shared memory of `bytes` for `kernel`, opting in past the default 48 KiB.
template <typename Kernel>
size_t smem_for(Kernel kernel, size_t bytes, const char* op) {
  if (bytes > (48u << 10)) {
    int dev = 0, most = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    MT_CHECK(bytes <= static_cast<size_t>(most), ValueError, op, ": needs ", bytes,
             " bytes of shared memory per block (head dims or top-k too large), the GPU has ",
             most);
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
    // All of L1 as shared memory, so that blocks under half of it fit twice per SM.
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
  }
  return bytes;
}

struct DeviceKeyLists {
  const int32_t* offsets = nullptr;  // [T + 1]: key s owns entries[offsets[s], offsets[s + 1])
  const int32_t* entries = nullptr;  // slot numbers t * kmax + j, sorted within each key
};

__global__ inline void key_count_kernel(int64_t n, int64_t tokens, const int32_t* idx,
                                        int32_t* counts) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t s = idx[e];
    if (s >= 0 && s < tokens) atomicAdd(counts + s, 1);
  }
}

__global__ inline void key_fill_kernel(int64_t n, int64_t tokens, const int32_t* idx,
                                       int32_t* cursor, int32_t* entries) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t s = idx[e];
    if (s >= 0 && s < tokens) entries[atomicAdd(cursor + s, 1)] = static_cast<int32_t>(e);
  }
}

// The lists of `n` slots idx[0, n) whose values are keys in [0, tokens) (others are skipped).
// Allocates from ctx.workspace() (the caller holds an ArenaScope): 8 bytes per table slot plus
// CUB's scratch, since the number of valid slots is known only on the device.
inline DeviceKeyLists build_device_slot_lists(Context& ctx, const int32_t* idx, int64_t n,
                                              int64_t tokens, const char* op) {
  MT_CHECK(n <= 0x7fffffff, ValueError, op, ": index table of ", n,
           " slots exceeds the GPU key lists' 32-bit slot numbers");
  cudaStream_t s = stream(ctx);
  Arena& ws = ctx.workspace();
  Tensor counts = ws.alloc({tokens + 1}, DType::I32);
  Tensor offsets = ws.alloc({tokens + 1}, DType::I32);
  Tensor cursor = ws.alloc({tokens + 1}, DType::I32);
  Tensor buf0 = ws.alloc({std::max<int64_t>(n, 1)}, DType::I32);
  Tensor buf1 = ws.alloc({std::max<int64_t>(n, 1)}, DType::I32);
  int32_t* pc = ptr<int32_t>(counts);
  int32_t* po = ptr<int32_t>(offsets);
  MT_CUDA_CHECK(cudaMemsetAsync(pc, 0, counts.bytes(), s));
  const int threads = 256;
  if (n > 0) {
    key_count_kernel<<<blocks_for(n, threads, 8192), threads, 0, s>>>(n, tokens, idx, pc);
    MT_CUDA_LAUNCH_CHECK();
  }
  // counts[T] stays 0, so offsets[T] is the number of valid slots.
  const int num = static_cast<int>(tokens + 1);
  size_t scan_bytes = 0, sort_bytes = 0;
  MT_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, pc, po, num, s));
  cub::DoubleBuffer<int32_t> keys(ptr<int32_t>(buf0), ptr<int32_t>(buf1));
  MT_CUDA_CHECK(
      cub::DeviceSegmentedSort::SortKeys(nullptr, sort_bytes, keys, n, tokens, po, po + 1, s));
  const int64_t temp_words = static_cast<int64_t>((std::max(scan_bytes, sort_bytes) + 7) / 8);
  Tensor temp = ws.alloc({std::max<int64_t>(temp_words, 1)}, DType::I64);
  size_t temp_bytes = static_cast<size_t>(temp.bytes());
  MT_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.raw(), temp_bytes, pc, po, num, s));
  MT_CUDA_CHECK(
      cudaMemcpyAsync(ptr<int32_t>(cursor), po, offsets.bytes(), cudaMemcpyDeviceToDevice, s));
  if (n > 0) {
    key_fill_kernel<<<blocks_for(n, threads, 8192), threads, 0, s>>>(
        n, tokens, idx, ptr<int32_t>(cursor), ptr<int32_t>(buf0));
    MT_CUDA_LAUNCH_CHECK();
    temp_bytes = static_cast<size_t>(temp.bytes());
    MT_CUDA_CHECK(
        cub::DeviceSegmentedSort::SortKeys(temp.raw(), temp_bytes, keys, n, tokens, po, po + 1, s));
  }
  return {po, keys.Current()};
}

// An index table [tokens, kmax] of key positions (attention's, the indexer's).
inline DeviceKeyLists build_device_key_lists(Context& ctx, const int32_t* idx, int64_t tokens,
                                             int64_t kmax, const char* op) {
  MT_CHECK(kmax == 0 || tokens <= 0x7fffffff / kmax, ValueError, op, ": index table of ", tokens,
           " x ", kmax, " slots exceeds the GPU key lists' 32-bit slot numbers");
  return build_device_slot_lists(ctx, idx, tokens * kmax, tokens, op);
}

}  // namespace mt::ops::cuda
