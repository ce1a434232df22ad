// The CPU path of ops/expert_load.h: host loops over the dispatch offsets. Called by the entries
// after they validated, so it does not re-check.
#pragma once

#include "ops/expert_load.h"

namespace mt::ops::cpu {

void expert_load_count(Context& ctx, const Tensor& offsets, const Tensor& slot_expert,
                       Tensor& load);
void map_ids(Context& ctx, Tensor& ids, const Tensor& table);

}  // namespace mt::ops::cpu
