// Bounded overflow rerouting (the "adjust" part of load balancing, docs/load-balancing.md).
//
// The router proposes, per token, a candidate list of k + m experts in descending selection score
// (router_forward with top_k = k + m). Normally the first k are used. When an expert would hold
// more than cap_e = ceil(expert_capacity * T k / E) (token, slot) pairs, or the EP rank that owns
// it more than cap_r = ceil(rank_capacity * T k / P), the pairs with the lowest selection score
// on the overloaded expert (then rank) are shed; each shed pair takes the best of the token's
// extra candidates (positions k .. k+m-1) that the token does not already use and whose expert
// and rank are both still below their capacity. A shed pair with no such candidate, or beyond the
// budget floor(max_reroute_share * T k), keeps its expert: no token is ever dropped, so the
// capacity is a promise about receivers, not a hard cut.
//
// Guarantees (tests/ops/test_overflow_route.cpp):
//   - an expert (rank) that receives a rerouted pair ends at or below its capacity, and no expert
//     (rank) ends above max(capacity, its load before rerouting);
//   - every output expert of a token is one of its k + m candidates, and distinct within the token;
//   - rerouted <= budget; `over_capacity` reports the pairs still above capacity.
// Order is deterministic: pairs are shed and then served in ascending (selection score, then
// descending flat slot index), which is a strict total order.
//
// The gate weights of the final experts follow the router's formula on the unbiased scores, so
// the backward is the router's: dweights [T,k] -> dlogits [T,E] (written).
#pragma once

#include <cstdint>
#include <vector>

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"
#include "ops/router.h"

namespace mt::ops {

struct OverflowParams {
  int64_t tokens = 0, experts = 0, top_k = 0;
  int64_t extra = 0;              // m: candidates beyond top_k that may take overflow
  float expert_capacity = 1.25f;  // factor of the mean expert load; <= 0: no expert bound
  float rank_capacity = 0.f;      // factor of the mean rank load; <= 0: no rank bound
  float max_reroute_share = 0.05f;
};

struct OverflowStats {
  int64_t pairs = 0;          // T * k
  int64_t shed = 0;           // pairs above capacity before rerouting
  int64_t rerouted = 0;       // pairs moved to another candidate
  int64_t over_capacity = 0;  // pairs still above capacity afterwards (candidates/budget ran out)
  int64_t expert_cap = 0, rank_cap = 0;
  int64_t max_expert_before = 0, max_expert_after = 0;
  int64_t max_rank_before = 0, max_rank_after = 0;
};

// Tensor-free core, shared with the simulator. cand [T, k+m] (expert ids, distinct per token, in
// descending selection score), prio [T, k+m] (their selection scores), expert_rank [E] (the EP
// rank holding each expert; ranks = 1 + max). Writes out_ids [T, k] and, when non-null,
// out_from [T, k] (the candidate position each slot finally uses).
OverflowStats overflow_assign(const OverflowParams& p, const int32_t* cand, const float* prio,
                              const std::vector<int32_t>& expert_rank, int32_t* out_ids,
                              int32_t* out_from);

// Contiguous EP layout: expert e on rank e / (E / P). P must divide E.
std::vector<int32_t> contiguous_expert_ranks(int64_t experts, int64_t ranks);

// scores [T,E] (router_forward's), bias [E] or undefined (selection priority = score + bias),
// cand i32 [T, k+m] -> ids i32 [T,k], weights [T,k] (router formula on scores), all written.
using OverflowRouteForward = OverflowStats(Context& ctx, const OverflowParams& p,
                                           const RouterParams& rp,
                                           const std::vector<int32_t>& expert_rank,
                                           const Tensor& scores, const Tensor& bias,
                                           const Tensor& cand, Tensor& ids, Tensor& weights);
OverflowRouteForward overflow_route_forward;

// dweights [T,k] -> dlogits [T,E] (written), through the final ids.
void overflow_route_backward(Context& ctx, const RouterParams& rp, const Tensor& scores,
                             const Tensor& ids, const Tensor& dweights, Tensor& dlogits);

// The forward's backend bodies, called by the entry once it validated:
// ops/cpu/overflow_route.cpp, and ops/cuda/overflow_route.cu in CUDA builds.
MT_OP_BACKENDS(OverflowRouteForward overflow_route_forward;)

}  // namespace mt::ops
