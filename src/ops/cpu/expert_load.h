#pragma once

#include "ops/expert_load.h"

namespace mt::ops::cpu {

// The CPU bodies of ops/expert_load.h; shapes already checked.
void expert_load_count(Context& ctx, const Tensor& offsets, const Tensor& slot_expert,
                       Tensor& load);
void map_ids(Context& ctx, Tensor& ids, const Tensor& table);

}  // namespace mt::ops::cpu
