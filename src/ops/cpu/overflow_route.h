// The CPU path of ops/overflow_route.h: fp32 loops. Called by the entries after they validated, so
// it does not re-check.
#pragma once

#include "ops/overflow_route.h"

namespace mt::ops::cpu {

OverflowStats overflow_route_forward(Context& ctx, const OverflowParams& p, const RouterParams& rp,
                                     const std::vector<int32_t>& expert_rank, const Tensor& scores,
                                     const Tensor& bias, const Tensor& cand, Tensor& ids,
                                     Tensor& weights);

}  // namespace mt::ops::cpu
