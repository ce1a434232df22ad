// The CPU path of ops/cross_entropy.h: fp32 loops. Called by the entries after they validated, so
// it does not re-check.
#pragma once

#include "ops/cross_entropy.h"

namespace mt::ops::cpu {

void lm_head_cross_entropy_forward(Context& ctx, const CrossEntropyParams& p, const Tensor& h,
                                   const Tensor& w, const Tensor& targets, Tensor& lse,
                                   Tensor& loss);
void lm_head_cross_entropy_backward(Context& ctx, const CrossEntropyParams& p, const Tensor& h,
                                    const Tensor& w, const Tensor& targets, const Tensor& lse,
                                    float dloss, Tensor& dh, Tensor& dw);
void lm_head_logits(Context& ctx, const Tensor& h, const Tensor& w, Tensor& logits);

}  // namespace mt::ops::cpu
