// Token embedding lookup.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

struct EmbeddingParams {
  int64_t tokens = 0, vocab = 0, dim = 0;
};

// y[t] = table[ids[t]]; ids i32 [tokens], table [vocab, dim], y [tokens, dim].
// An id outside [0, vocab) is a ValueError naming the position and the id.
using EmbeddingForward = void(Context& ctx, const EmbeddingParams& p, const Tensor& ids,
                              const Tensor& table, Tensor& y);
EmbeddingForward embedding_forward;
// dtable[ids[t]] += dy[t] (parameter gradient: accumulates).
using EmbeddingBackward = void(Context& ctx, const EmbeddingParams& p, const Tensor& ids,
                               const Tensor& dy, Tensor& dtable);
EmbeddingBackward embedding_backward;

// The backends' bodies, called by the entries above once they validated: ops/cpu/embedding.cpp, and
// ops/cuda/embedding.cu in CUDA builds.
MT_OP_BACKENDS(EmbeddingForward embedding_forward; EmbeddingBackward embedding_backward;)

}  // namespace mt::ops
