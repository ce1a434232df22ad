// The CUDA path of ops/expert_load.h (src/ops/cuda/expert_load.cu). A plain C++ header: the entries
// include it in every build and call it only in a MOETRAIN_WITH_CUDA one.
#pragma once

#include "ops/expert_load.h"

namespace mt::ops::cuda {

void expert_load_count(Context& ctx, const Tensor& offsets, const Tensor& slot_expert,
                       Tensor& load);
void map_ids(Context& ctx, Tensor& ids, const Tensor& table);

}  // namespace mt::ops::cuda
