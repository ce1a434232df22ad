// Expert bookkeeping of the MoE layer as ops, so that the counts stay on the device that routes:
// the per-expert row count that aux-loss-free balancing reads, and the relabelling of expert ids
// into placement slots (and back) around the dispatch plan.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

// load[slot_expert[s]] += offsets[s+1] - offsets[s] for every dispatch slot s. offsets: i32
// [S+1] (the dispatch plan's group offsets); slot_expert: i32 [S], or undefined for the identity;
// load: i64 [E], accumulated (it sums the forwards of a whole step).
using ExpertLoadCount = void(Context& ctx, const Tensor& offsets, const Tensor& slot_expert,
                             Tensor& load);
ExpertLoadCount expert_load_count;

// ids[i] = table[ids[i]], in place: i32 ids of any shape, table i32 [n]; an id outside [0, n) is
// a ValueError naming its position.
using MapIds = void(Context& ctx, Tensor& ids, const Tensor& table);
MapIds map_ids;

// The backends' bodies, called by the entries above once they validated: ops/cpu/expert_load.cpp,
// and ops/cuda/expert_load.cu in CUDA builds.
MT_OP_BACKENDS(ExpertLoadCount expert_load_count; MapIds map_ids;)

}  // namespace mt::ops
