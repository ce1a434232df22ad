// The CPU path of ops/moe_dispatch.h: fp32 loops. Called by the entries after they validated, so it
// does not re-check.
#pragma once

#include "ops/moe_dispatch.h"

namespace mt::ops::cpu {

void moe_dispatch_plan(Context& ctx, const Tensor& ids, int64_t experts, Tensor& perm, Tensor& inv,
                       Tensor& offsets);
void moe_gather(Context& ctx, const Tensor& x, const Tensor& perm, int64_t top_k, Tensor& rows);
void moe_gather_backward(Context& ctx, const Tensor& drows, const Tensor& inv, int64_t top_k,
                         Tensor& dx, bool accumulate = false);
void moe_combine(Context& ctx, const Tensor& rows, const Tensor& weights, const Tensor& inv,
                 Tensor& y);
void moe_combine_backward(Context& ctx, const Tensor& rows, const Tensor& weights,
                          const Tensor& inv, const Tensor& dy, Tensor& drows, Tensor& dweights);

}  // namespace mt::ops::cpu
