#pragma once

#include "ops/expert_load.h"

namespace mt::ops::cuda {

// CUDA path of ops/expert_load.h; declarations only.
void expert_load_count(Context& ctx, const Tensor& offsets, const Tensor& slot_expert,
                       Tensor& load);
void map_ids(Context& ctx, Tensor& ids, const Tensor& table);

}  // namespace mt::ops::cuda
