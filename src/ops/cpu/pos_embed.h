// The CPU path of ops/pos_embed.h. Called by the entries after they validated, so it does not
// re-check.
#pragma once

#include "ops/pos_embed.h"

namespace mt::ops::cpu {

void pos_embed_forward(Context& ctx, const PosEmbedParams& p, const Tensor& idx, const Tensor& wts,
                       const Tensor& table, const Tensor& x, Tensor& y);
void pos_embed_backward(Context& ctx, const PosEmbedParams& p, const Tensor& idx, const Tensor& wts,
                        const Tensor& dy, Tensor& dtable);

}  // namespace mt::ops::cpu
