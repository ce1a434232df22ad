// Token embedding lookup.
#pragma once

#include "core/context.h"
#include "core/tensor.h"

namespace mt::ops {

struct EmbeddingParams {
  int64_t tokens = 0, vocab = 0, dim = 0;
};

// y[t] = table[ids[t]]; ids i32 [tokens], table [vocab, dim], y [tokens, dim].
// An id outside [0, vocab) is a ValueError naming the position and the id.
void embedding_forward(Context& ctx, const EmbeddingParams& p, const Tensor& ids,
                       const Tensor& table, Tensor& y);
// dtable[ids[t]] += dy[t] (parameter gradient: accumulates).
void embedding_backward(Context& ctx, const EmbeddingParams& p, const Tensor& ids, const Tensor& dy,
                        Tensor& dtable);

}  // namespace mt::ops
