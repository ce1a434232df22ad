// The chunked KDA's intra-chunk pass (prep) on bf16 tensor cores (kda_fwd_tc.cu): the prepared
// block of ops/kda_chunk_layout.h in the layout Args carries (the bf16 one unless
// KdaKernels::bf16_prepared = false); the tensor-core state passes, the output and the backward
// read it.
#pragma once

#include <cuda_bf16.h>

#include "core/context.h"
#include "ops/cuda/kda_chunk_args.cuh"

namespace mt::ops::cuda::kda_detail {

// For bf16 tensors on the tensor-core path (ops/kda_prep_path.h: chunk 64, head_k and head_v 64
// or 128, the switch on); the prepared blocks 16-byte aligned. q, k, v and g may be unaligned
// (narrower loads then). With a.ready (the overlapped forward, kda_state_tc.h) a persistent grid
// of `blocks` that flags each (chunk, head) done and lets the state pass launched after it start
// at once (a programmatic dependent launch).
void prep_tc(Context& ctx, const Args& a, const __nv_bfloat16* q, const __nv_bfloat16* k,
             const __nv_bfloat16* v, int blocks = 0);

}  // namespace mt::ops::cuda::kda_detail
