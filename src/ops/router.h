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
void router_forward(Context& ctx, const RouterParams& p, const Tensor& logits, const Tensor& bias,
                    Tensor& scores, Tensor& ids, Tensor& weights);

// dweights [T,k] -> dlogits [T,E] (written). The selection itself is piecewise constant.
void router_backward(Context& ctx, const RouterParams& p, const Tensor& scores, const Tensor& ids,
                     const Tensor& dweights, Tensor& dlogits);

// Sequence-level balance loss (DeepSeek-V3), unweighted: for each document d of T_d tokens,
//   f_i = E / (k T_d) * #{tokens of d that chose i},  P_i = mean_{t in d} s_{t,i} / sum_j s_{t,j},
//   L_d = sum_i f_i P_i;  loss f64 [1] = mean_d L_d (written). f is a count and carries no
// gradient. Documents come from seq's host offsets.
void router_seq_aux_loss(Context& ctx, const RouterParams& p, const SeqInfo& seq,
                         const Tensor& scores, const Tensor& ids, Tensor& loss);
// dlogits += grad * d(seq aux loss)/dlogits (grad: the coefficient times the upstream gradient).
void router_seq_aux_backward(Context& ctx, const RouterParams& p, const SeqInfo& seq,
                             const Tensor& scores, const Tensor& ids, float grad, Tensor& dlogits);

// Router z-loss, unweighted: loss f64 [1] = mean_t logsumexp(logits_t)^2 (written).
void router_z_loss(Context& ctx, const RouterParams& p, const Tensor& logits, Tensor& loss);
// dlogits += grad * d(z-loss)/dlogits.
void router_z_loss_backward(Context& ctx, const RouterParams& p, const Tensor& logits, float grad,
                            Tensor& dlogits);

// counts i64 [E] (written): how many (token, slot) pairs chose each expert.
void expert_load_counts(Context& ctx, const Tensor& ids, int64_t experts, Tensor& counts);

// Aux-loss-free balancing step: bias_i += rate * sign(mean(load) - load_i). load i64 [E].
void router_bias_update(const Tensor& load, float rate, Tensor& bias);

}  // namespace mt::ops
