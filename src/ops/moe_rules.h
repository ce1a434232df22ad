// The shape rules of routed experts, each in one place. Every layer that takes these numbers
// (config parsing, the MoE layer, the router op, the mesh, the planner, placement, the trainer)
// calls these and wraps the message in its own error type and context (a config key, an op
// name). Header-only: they are arithmetic on a few integers.
#pragma once

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "core/host_device.h"

namespace mt::ops {

// The score of one group of `n` expert scores in group-limited routing, formed the same way by the
// CPU router and the GPU kernel: the sum of its two best under sigmoid scoring (`top2`), its best
// under softmax (and for a group of one).
MT_HD inline float group_score(const float* v, int64_t n, bool top2) {
  float best = v[0], second = -INFINITY;
  for (int64_t i = 1; i < n; ++i) {
    if (v[i] > best) {
      second = best;
      best = v[i];
    } else if (v[i] > second) {
      second = v[i];
    }
  }
  return (top2 && n >= 2) ? best + second : best;
}

// Group-limited top-k: `top_k` of `experts`, which form `n_group` equal groups of which the best
// `topk_group` are kept. Empty when valid, else what is wrong (in the HF config's key names).
inline std::string routing_error(int64_t experts, int64_t top_k, int64_t n_group = 1,
                                 int64_t topk_group = 1) {
  std::ostringstream s;
  if (experts <= 0 || top_k <= 0 || top_k > experts)
    s << "num_experts_per_tok " << top_k << " must be in [1, n_routed_experts " << experts << "]";
  else if (n_group <= 0 || experts % n_group != 0)
    s << "n_group " << n_group << " must divide n_routed_experts " << experts;
  else if (topk_group <= 0 || topk_group > n_group)
    s << "topk_group " << topk_group << " outside [1, n_group " << n_group << "]";
  else if (top_k > topk_group * (experts / n_group))
    s << "num_experts_per_tok " << top_k << " exceeds the " << topk_group * (experts / n_group)
      << " experts of " << topk_group << " groups";
  return s.str();
}

// Expert parallelism over `ep` ranks: ep divides the routed experts (each rank holds the same
// number) and, when `world` > 0 is given, the world (whole replicas of the EP group). Empty when
// valid, else what is wrong.
inline std::string expert_parallel_error(int64_t ep, int64_t experts, int64_t world = 0) {
  std::ostringstream s;
  if (ep < 1)
    s << "expert-parallel size must be >= 1, got " << ep;
  else if (world > 0 && world % ep != 0)
    s << "expert-parallel size " << ep << " does not divide the world size " << world;
  else if (experts < 0)
    s << "expert count " << experts;
  else if (experts > 0 && experts % ep != 0)
    s << "expert-parallel size " << ep << " does not divide the " << experts << " routed experts";
  else if (experts == 0 && ep > 1)
    s << "expert-parallel size " << ep << " for a model without routed experts";
  return s.str();
}

}  // namespace mt::ops
