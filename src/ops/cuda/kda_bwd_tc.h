// The chunked KDA backward's products (kda_bwd_tc.cu) on tensor cores, for bf16 tensors: the
// same outputs in the same prepared-block slots as kda_chunk_products.cu's products_kernel, so
// that the gradient pass reads them unchanged.
#pragma once

#include <cuda_bf16.h>

#include "core/context.h"
#include "ops/cuda/kda_chunk_args.cuh"

namespace mt::ops::cuda::kda_detail {

// Under the tensor-core prep's condition (ops/kda_prep_path.h: chunk 64, head dims 64 or 128, not
// switched off), with dout, the saved states and the workspace 16-byte aligned (vector loads).
bool products_tc_fits(const Args& a, const void* dout);

void products_tc(Context& ctx, const Args& a, const __nv_bfloat16* dout);

}  // namespace mt::ops::cuda::kda_detail
