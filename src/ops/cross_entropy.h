// LM head fused with softmax cross-entropy, computed in chunks of tokens so that the full
// [tokens, vocab] fp32 logits never exist at once (at most [chunk_tokens, vocab] in workspace).
#pragma once

#include "core/context.h"
#include "core/device.h"
#include "core/tensor.h"

namespace mt::ops {

// Tokens per chunk the model uses on `device`. Every chunk reads the whole [vocab, hidden] head:
// on the GPU 128-token chunks made an 8K-token step read it 64 times per pass (755 MB each time
// at Kimi's 163,840 x 2,304), so the GPU takes 1,024 (its chunk buffers: fp32 logits plus their
// gradient in the activation dtype, 1 GB at that vocab); the CPU keeps 128 (its workspace is not
// planned per job).
int64_t ce_chunk_tokens(Device device);

struct CrossEntropyParams {
  int64_t tokens = 0, hidden = 0, vocab = 0;
  int64_t chunk_tokens = 128;
  int32_t ignore_index = -100;  // targets equal to this contribute no loss and no gradient
};

// h [tokens, hidden], w [vocab, hidden], targets i32 [tokens]. Writes lse [tokens] (saved for
// backward; 0 for ignored tokens) and loss f64 [1]: the mean loss over non-ignored tokens (0 if
// none), written on the tensors' device (never returned: no host synchronisation in the op).
// A target outside [0, vocab) that is not ignore_index is a ValueError.
using LmHeadCrossEntropyForward = void(Context& ctx, const CrossEntropyParams& p, const Tensor& h,
                                       const Tensor& w, const Tensor& targets, Tensor& lse,
                                       Tensor& loss);
LmHeadCrossEntropyForward lm_head_cross_entropy_forward;
// Gradient of dloss * mean loss: dh written, dw accumulates (skipped when undefined).
using LmHeadCrossEntropyBackward = void(Context& ctx, const CrossEntropyParams& p, const Tensor& h,
                                        const Tensor& w, const Tensor& targets, const Tensor& lse,
                                        float dloss, Tensor& dh, Tensor& dw);
LmHeadCrossEntropyBackward lm_head_cross_entropy_backward;

// Forward and backward in one pass over the vocabulary, for a frozen head (no dw): what forward
// writes, and dh as backward would write it for this dloss. A training step needs the logits
// twice otherwise (backward recomputes them: on the GPU one of the head's three GEMMs per chunk).
using LmHeadCrossEntropyForwardBackward = void(Context& ctx, const CrossEntropyParams& p,
                                               const Tensor& h, const Tensor& w,
                                               const Tensor& targets, float dloss, Tensor& lse,
                                               Tensor& loss, Tensor& dh);
LmHeadCrossEntropyForwardBackward lm_head_cross_entropy_forward_backward;

// Logits of selected rows only (generation / golden checks): logits [rows, vocab] = h w^T.
using LmHeadLogits = void(Context& ctx, const Tensor& h, const Tensor& w, Tensor& logits);
LmHeadLogits lm_head_logits;

// The backends' bodies, called by the entries above once they validated: ops/cpu/cross_entropy.cpp,
// and ops/cuda/cross_entropy.cu in CUDA builds.
namespace cpu {
LmHeadCrossEntropyForward lm_head_cross_entropy_forward;
LmHeadCrossEntropyBackward lm_head_cross_entropy_backward;
LmHeadLogits lm_head_logits;
}  // namespace cpu
namespace cuda {
LmHeadCrossEntropyForward lm_head_cross_entropy_forward;
LmHeadCrossEntropyBackward lm_head_cross_entropy_backward;
LmHeadCrossEntropyForwardBackward lm_head_cross_entropy_forward_backward;
LmHeadLogits lm_head_logits;
}  // namespace cuda

}  // namespace mt::ops
