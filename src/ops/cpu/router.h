// The CPU path of ops/router.h: fp32 loops. Called by the entries after they validated, so it does
// not re-check.
#pragma once

#include "ops/router.h"

namespace mt::ops::cpu {

void router_forward(Context& ctx, const RouterParams& p, const Tensor& logits, const Tensor& bias,
                    Tensor& scores, Tensor& ids, Tensor& weights);
void router_backward(Context& ctx, const RouterParams& p, const Tensor& scores, const Tensor& ids,
                     const Tensor& dweights, Tensor& dlogits);
void router_seq_aux_loss(Context& ctx, const RouterParams& p, const SeqInfo& seq,
                         const Tensor& scores, const Tensor& ids, Tensor& loss);
void router_seq_aux_backward(Context& ctx, const RouterParams& p, const SeqInfo& seq,
                             const Tensor& scores, const Tensor& ids, float grad, Tensor& dlogits);
void router_z_loss(Context& ctx, const RouterParams& p, const Tensor& logits, Tensor& loss);
void router_z_loss_backward(Context& ctx, const RouterParams& p, const Tensor& logits, float grad,
                            Tensor& dlogits);
void expert_load_counts(Context& ctx, const Tensor& ids, int64_t experts, Tensor& counts);
void router_bias_update(const Tensor& load, float rate, Tensor& bias);

}  // namespace mt::ops::cpu
