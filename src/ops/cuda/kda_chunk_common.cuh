// What the CUDA-core kernels of the chunked KDA core (kda_chunk.cu describes the algorithm) share,
// and the launchers through which kda_chunk.cu's entries run them: kda_chunk_prep.cu (step 1, the
// prep), kda_chunk_state.cu (steps 2 and 3, the state passes), kda_chunk_products.cu (step 4,
// backward's products), kda_chunk_grads.cu and kda_chunk_grads_v2.cu (step 5, the gradients; what
// only those two share is in kda_chunk_grads.cuh). Device code is compiled without -rdc, each .cu
// a whole program of its own, so the helpers their kernels share are defined here, in namespace
// kda_chunk. Each .cu keeps its kernels in an anonymous namespace of mt::ops::cuda, as the one
// file did (the kernel names the profilers report stay the same), and defines its launcher below
// next to them.
#pragma once

#include <cstddef>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kda_chunk_args.cuh"

namespace mt::ops::cuda::kda_chunk {

using kda_detail::Args;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxC = 64;    // chunk (kda_chunk_kernel_fits)
constexpr int kMaxKV = 128;  // head_k, head_v

// The exponent differences and the dGam sums: double for fp32 tensors (their 1e-5 check, with
// cumsums that reach the thousands under strong decay), float for bf16, whose rounding of every
// input and output (2^-9) dwarfs the float error of a difference of cumsums (|Gam| 2^-24) and
// which then runs without conversions and with half the shared memory for Gam.
template <typename T>
using Wide = std::conditional_t<std::is_same_v<T, float>, double, float>;

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(bytes)));
  // All of L1 as shared memory, so that kernels under half of it fit twice per SM.
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
}

// The launchers, each defined next to its kernels for T = float and __nv_bfloat16 (the types of
// MT_DISPATCH_FLOAT).

// Step 1 (kda_chunk_prep.cu): the prepared block of every (chunk, head); bf16 on the tensor-core
// path goes to kda_fwd_tc.h's prep_tc.
template <typename T>
void prep(Context& ctx, const Args& a, const Tensor& q, const Tensor& k, const Tensor& v);

// Steps 2 and 3 (kda_chunk_state.cu): the CUDA-core state passes, forward (o, `saved`, hT) and
// reverse (Delta, dR and each chunk's outgoing dS; dh0).
template <typename T>
void forward_state(Context& ctx, const Args& a, T* o);
template <typename T>
void backward_state(Context& ctx, const Args& a, const T* dout);

// Step 4 (kda_chunk_products.cu): backward's products on CUDA cores.
template <typename T>
void products(Context& ctx, const Args& a, const T* dout);

// Step 5 (kda_chunk_grads.cu): dq, dk, dv, dg and dbeta.
template <typename T>
void grads(Context& ctx, const Args& a, const Tensor& q, const Tensor& k, const Tensor& v,
           Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace mt::ops::cuda::kda_chunk
