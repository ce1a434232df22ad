// The transpose of an index table on the GPU, for the ops over index tables (attention, the
// indexer, pos_embed's tap table): for every key position s, the table slots e = t * kmax + j that
// reference it, in increasing slot order. The backward passes gather key gradients through it (one
// block per key, no float atomics), and the sorted order makes their sums independent of
// scheduling, as cpu::build_key_lists does on the host. It is built with integer atomics (counts
// and a fill cursor, whose results do not depend on order) and CUB's segmented sort, which
// restores slot order inside each key's list. The generic helpers its users share (warp_sum,
// warp_dot, doc_index, valid_slot, grid_of, smem_for) are in common.cuh.
#pragma once

#include <cub/device/device_scan.cuh>
#include <cub/device/device_segmented_sort.cuh>

#include "core/arena.h"
#include "ops/cuda/common.cuh"

namespace mt::ops::cuda {

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
