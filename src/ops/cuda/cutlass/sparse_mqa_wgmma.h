// The absorbed sparse MQA forward, backward and prob sum (ops/sparse_mqa_attention.h) on Hopper's
// wgmma, the keys as the MMA's rows: blocks of 32 heads per query, 64 listed keys per tile.
// ops/cuda/sparse_mqa_attention.cu calls the forward when SparseMqaParams::kernels is Wgmma, Wgmma2
// or Wgmma3, the backward and prob sum for Wgmma3 (the others keep the mma.sync kernels, Split).
// Like grouped_gemm_sm90.h, the .cu includes no engine header and takes plain values, so CUTLASS's
// include path stays on src/ops/cuda/cutlass.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace mt::ops::cuda {

// q [T, H, 576] and kv [T, 576] bf16 (16-byte aligned rows), idx i32 [T, K] (a slot outside
// [0, T) unused), o [T, H, 512] bf16 and lse [T, H] f32 (natural log; a row without a valid slot
// gets o = 0, lse = -inf): the contract of sparse_mqa_forward.
struct MqaWgmmaArgs {
  const void* q = nullptr;
  const void* kv = nullptr;
  const int32_t* idx = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  int64_t T = 0, H = 0, K = 0;
  float scale = 0;
};

constexpr int kMqaWgmmaHeads = 32;  // heads per block (fewer: zero rows; more: more blocks)

// `buffers` key tiles per block: 2 (one block per SM, the next tile lands while this one is
// multiplied) or 1 (two blocks per SM, each gathering while the other multiplies).
// Dynamic shared memory per block (bytes).
size_t sparse_mqa_fwd_wgmma_smem(int buffers);

// Launches on `s` (sets the kernel's shared-memory limit first); returns the first CUDA error.
cudaError_t sparse_mqa_fwd_wgmma(const MqaWgmmaArgs& a, int buffers, cudaStream_t s);

// The backward's contract (sparse_mqa_backward) for up to 32 heads: q, kv, idx, o, lse as the
// forward's; dout [T, H, 512] bf16; dq [T, H, 576] bf16 written; dkv f32 [T, 576] added into
// (zeroed by the caller, rounded by it); psum f32 [T, K] (or null) written with the heads' P per
// slot. The prob sum alone (sparse_mqa_prob_sum) reads q, kv, idx, lse and writes psum.
struct MqaWgmmaBwdArgs {
  const void* q = nullptr;
  const void* kv = nullptr;
  const int32_t* idx = nullptr;
  const void* o = nullptr;
  const float* lse = nullptr;
  const void* dout = nullptr;
  void* dq = nullptr;
  float* dkv = nullptr;
  float* psum = nullptr;
  int64_t T = 0, H = 0, K = 0;
  float scale = 0;
};

// Dynamic shared memory of the backward (grad) or the prob sum's block (bytes).
size_t sparse_mqa_bwd_wgmma_smem(bool grad);

// Launch on `s`; cudaErrorInvalidValue past 32 heads.
cudaError_t sparse_mqa_bwd_wgmma(const MqaWgmmaBwdArgs& a, cudaStream_t s);
cudaError_t sparse_mqa_prob_sum_wgmma(const MqaWgmmaBwdArgs& a, cudaStream_t s);

}  // namespace mt::ops::cuda
