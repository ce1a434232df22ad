// The chunked KDA's intra-chunk pass (prep) on bf16 tensor cores (kda_fwd_tc.cu): the prepared
// block of ops/kda_chunk_layout.h, as kda_chunk.cu's CUDA-core prep writes it, so that the state
// passes, the output and the backward read it unchanged.
#pragma once

#include <cuda_bf16.h>

#include "core/context.h"
#include "ops/cuda/kda_chunk_args.cuh"

namespace mt::ops::cuda::kda_detail {

// Chunk 64, head_k and head_v 64 or 128, q, k, v, g and the prepared blocks 16-byte aligned
// (the kernel's vector loads and stores), and the tensor-core prep not switched off
// (ops/kda_prep_path.h).
bool prep_tc_fits(const Args& a, const void* q, const void* k, const void* v);

void prep_tc(Context& ctx, const Args& a, const __nv_bfloat16* q, const __nv_bfloat16* k,
             const __nv_bfloat16* v);

}  // namespace mt::ops::cuda::kda_detail
