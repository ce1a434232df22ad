// The chunked KDA's state passes on tensor cores (kda_state_tc_fwd.cu, kda_state_tc_bwd.cu; what
// they share in kda_state_tc_common.cuh), for bf16 tensors: what kda_chunk_state.cu's CUDA-core
// state passes compute, with every product a tf32 MMA over the fp32 prepared blocks. fp32 tensors
// keep the CUDA-core passes (their 1e-5 check against the CPU).
#pragma once

#include <cuda_bf16.h>

#include "core/context.h"
#include "ops/cuda/kda_chunk_args.cuh"

namespace mt::ops::cuda::kda_detail {

// Chunk 64, head dims multiples of 16 up to 128 (kda_state_tc_common.cuh's tiles).
bool state_tc_fits(const Args& a);

// Forward: the state pass (S0 of every chunk into `saved`, the final state into hT), which forms
// each chunk's o = Qh S0 + Aqk Delta in the same step.
void forward_state_tc(Context& ctx, const Args& a, __nv_bfloat16* o);

// The overlapped forward (kda_forward_overlap in ops/kda_prep_path.h): the prep's persistent grid
// where it applies to these args (bf16 layout, fewer 32-column state blocks than SMs), else 0;
// and the state pass that follows that prep (prep_tc with a.ready), waiting on a.ready's flags.
int forward_overlap_blocks(Context& ctx, const Args& a);
void forward_state_tc_follow(Context& ctx, const Args& a, __nv_bfloat16* o);

// Backward: Delta, Aqk^T dO and Qh^T dO for every chunk in parallel, then the reverse pass
// (dR and each chunk's outgoing dS, as the CUDA-core pass leaves them; dh0).
void backward_state_tc(Context& ctx, const Args& a, const __nv_bfloat16* dout);

}  // namespace mt::ops::cuda::kda_detail
