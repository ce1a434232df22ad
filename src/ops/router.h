// MoE router: scores, group-limited top-k selection, gate weights, load-balancing losses.
//
// logits [T, E] (the caller computes x W_r^T) -> scores s = softmax(logits) or sigmoid(logits).
// Selection runs on s + bias (the aux-loss-free correction bias, [E], may be undefined); the gate
// weights use the unbiased s of the chosen experts:
//   w_j = routed_scaling * s_{e_j} / (sum_i s_{e_i} + 1e-20)   (norm_topk_prob)
//   w_j = routed_scaling * s_{e_j}                               (otherwise)
// Group-limited routing (n_group > 1): the E experts form n_group contiguous groups; each group is
// scored from its selection scores, the best topk_group groups are kept and top-k runs among their
// experts. Group score: the sum of the two largest selection scores for sigmoid scoring
// (DeepSeek-V3: a group is worth keeping when it holds more than one good expert, which a max would
// not see), the largest one for softmax scoring (DeepSeek-V2). Groups of one expert use that
// expert. Ties (experts or groups) go to the lower index. Experts of a token are ordered by
// descending selection score.
//
// Gradient contract: router_backward writes dlogits; the aux/z-loss backwards add into it.
#pragma once

#include <cstdint>

#include "core/context.h"
#include "core/seq_info.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

enum class ScoreFunc { Softmax, Sigmoid };

struct RouterParams {
  int64_t tokens = 0, experts = 0, top_k = 0;
  ScoreFunc score = ScoreFunc::Sigmoid;
  int64_t n_group = 1, topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling = 1.0f;
};

// logits [T,E], bias [E] or undefined -> scores [T,E] (keep for backward), ids i32 [T,k],
// weights [T,k]; all written.
using RouterForward = void(Context& ctx, const RouterParams& p, const Tensor& logits,
                           const Tensor& bias, Tensor& scores, Tensor& ids, Tensor& weights);
RouterForward router_forward;

// dweights [T,k] -> dlogits [T,E] (written). The selection itself is piecewise constant.
using RouterBackward = void(Context& ctx, const RouterParams& p, const Tensor& scores,
                            const Tensor& ids, const Tensor& dweights, Tensor& dlogits);
RouterBackward router_backward;

// Sequence-level balance loss (DeepSeek-V3), unweighted: for each document d of T_d tokens,
//   f_i = E / (k T_d) * #{tokens of d that chose i},  P_i = mean_{t in d} s_{t,i} / sum_j s_{t,j},
//   L_d = sum_i f_i P_i;  loss f64 [1] = mean_d L_d (written). f is a count and carries no
// gradient. Documents come from seq's host offsets.
using RouterSeqAuxLoss = void(Context& ctx, const RouterParams& p, const SeqInfo& seq,
                              const Tensor& scores, const Tensor& ids, Tensor& loss);
RouterSeqAuxLoss router_seq_aux_loss;
// dlogits += grad * d(seq aux loss)/dlogits (grad: the coefficient times the upstream gradient).
using RouterSeqAuxBackward = void(Context& ctx, const RouterParams& p, const SeqInfo& seq,
                                  const Tensor& scores, const Tensor& ids, float grad,
                                  Tensor& dlogits);
RouterSeqAuxBackward router_seq_aux_backward;

// Router z-loss, unweighted: loss f64 [1] = mean_t logsumexp(logits_t)^2 (written).
using RouterZLoss = void(Context& ctx, const RouterParams& p, const Tensor& logits, Tensor& loss);
RouterZLoss router_z_loss;
// dlogits += grad * d(z-loss)/dlogits.
using RouterZLossBackward = void(Context& ctx, const RouterParams& p, const Tensor& logits,
                                 float grad, Tensor& dlogits);
RouterZLossBackward router_z_loss_backward;

// counts i64 [E] (written): how many (token, slot) pairs chose each expert.
using ExpertLoadCounts = void(Context& ctx, const Tensor& ids, int64_t experts, Tensor& counts);
ExpertLoadCounts expert_load_counts;

// Aux-loss-free balancing step: bias_i += rate * sign(mean(load) - load_i). load i64 [E]. On a
// GPU, queued on ctx's stream after whatever wrote the load: no wait.
using RouterBiasUpdate = void(Context& ctx, const Tensor& load, float rate, Tensor& bias);
RouterBiasUpdate router_bias_update;

// The backends' bodies, called by the entries above once they validated: ops/cpu/router.cpp, and
// ops/cuda/router.cu in CUDA builds.
MT_OP_BACKENDS(RouterForward router_forward; RouterBackward router_backward;
               RouterSeqAuxLoss router_seq_aux_loss; RouterSeqAuxBackward router_seq_aux_backward;
               RouterZLoss router_z_loss; RouterZLossBackward router_z_loss_backward;
               ExpertLoadCounts expert_load_counts; RouterBiasUpdate router_bias_update;)

}  // namespace mt::ops
