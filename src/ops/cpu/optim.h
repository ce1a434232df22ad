// The CPU path of ops/optim.h: fp32 loops. Called by the entries after they validated, so it does
// not re-check.
#pragma once

#include "ops/optim.h"

namespace mt::ops::cpu {

void adamw_step(Context& ctx, const AdamWParams& p, Tensor& param, const Tensor& grad, Tensor& m,
                Tensor& v);
void grad_norm_sq(Context& ctx, const std::vector<Tensor>& grads, Tensor& out);
void clip_grad_norm(Context& ctx, const std::vector<Tensor>& grads, double max_norm, Tensor& norm);

}  // namespace mt::ops::cpu
