// The CPU path of ops/embedding.h: fp32 loops. Called by the entries after they validated, so it
// does not re-check.
#pragma once

#include "ops/embedding.h"

namespace mt::ops::cpu {

void embedding_forward(Context& ctx, const EmbeddingParams& p, const Tensor& ids,
                       const Tensor& table, Tensor& y);
void embedding_backward(Context& ctx, const EmbeddingParams& p, const Tensor& ids, const Tensor& dy,
                        Tensor& dtable);

}  // namespace mt::ops::cpu
