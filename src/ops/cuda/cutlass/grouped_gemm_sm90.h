// The grouped expert GEMM on Hopper's tensor cores: CUTLASS's pointer-array grouped kernel
// (TMA loads, wgmma, warp-specialised cooperative schedule), one launch for every non-empty group.
// grouped_matmul.cu calls it for the bf16 forward and input-gradient forms and keeps cuBLAS's
// grouped GEMM for the rest (f32, the f32 weight gradient, rows TMA cannot address).
//
// The .cu includes no engine header and talks to the engine through plain values (the caller owns
// the context, the scratch and the errors): its minute-long CUTLASS compile is not redone when an
// engine header changes, and CUTLASS's include path stays on this one file.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace mt::ops::cuda {

// The non-empty groups of one grouped call, passed by value to the kernels that lay out the
// per-group addresses (CUDA 12.1+ takes kernel parameters up to 32 KB; this is 12 KB), so the
// host's group offsets never travel by a copy.
constexpr int kMaxGroups = 1024;
struct GroupRows {
  int32_t group[kMaxGroups];  // group index
  int32_t row0[kMaxGroups];   // its first row
  int32_t rows[kMaxGroups];   // its row count (> 0)
};

// C_g [m_g, n] = alpha A_g [m_g, k] op(W_g) + beta C_g, all bf16, f32 accumulation. A and C are
// row views (leading dimensions lda, ldc); W [G, ...] is contiguous, W_g [n, k] when `w_nk` (the
// forward X W^T) and [k, n] otherwise (the input gradient dY W).
struct Sm90Grouped {
  bool w_nk = true;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* w = nullptr;
  void* c = nullptr;
  int64_t ldc = 0;
  int64_t n = 0, k = 0;
  float alpha = 1.f, beta = 0.f;
};

// Where and on what it runs: the stream, the device and its multiprocessor count.
struct Sm90Launch {
  cudaStream_t stream = nullptr;
  int device = 0, multiprocessors = 0;
};

// Whether sm90_grouped_gemm takes the call: TMA needs 16-byte aligned bases and row pitches.
bool sm90_grouped_fits(const Sm90Grouped& g, int count);

// Device scratch bytes one call needs (the per-group arrays and CUTLASS's own workspace).
size_t sm90_grouped_scratch(const Sm90Grouped& g, const GroupRows& rows, int count,
                            const Sm90Launch& at);

// Runs the call with `scratch` (sm90_grouped_scratch bytes, 256-byte aligned). Returns nullptr, or
// what failed (CUTLASS's status or the launch's error) for the caller to raise.
const char* sm90_grouped_gemm(const Sm90Grouped& g, const GroupRows& rows, int count,
                              const Sm90Launch& at, void* scratch);

}  // namespace mt::ops::cuda
