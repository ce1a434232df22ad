// The KDA delta rule token by token from a carried state (ops/kda.h has the math): the kernel of
// decoding, where one or a few tokens continue a document and the chunked form's per-chunk
// products would cost more than the recurrence they replace.
//
// For each head, with state S [K, V] (rows are key channels), token by token:
//   S <- diag(exp(g_t)) S;  S <- S + beta_t k_t (v_t - S^T k_t)^T;  o_t = S^T (scale q_t).
// The tokens belong to one document. q, k, g [n, H, K]; v, o [n, H, V]; beta [n, H]. q, k, v, o
// are f32 or bf16 (one type); g, beta and the state stay fp32 (the precision policy), arithmetic
// is fp32.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

struct KdaStepParams {
  int64_t tokens = 0, heads = 0, head_k = 0, head_v = 0;
  float scale = 0.f;       // 0: head_k^-0.5
  float qk_scale() const;  // KdaParams::qk_scale's rule
};

// Whether the CUDA body takes head_k: it keeps the state's [head_k, 32] tile and three head_k
// vectors in fp32 shared memory (35 KiB at 256, within the 48 KiB a block gets without opting
// in). Read by the CUDA body, the op table and the Decoder.
bool kda_step_fits(int64_t head_k);

// state f32 [H, K, V] (any leading 1s allowed: [1, H, K, V]) is updated in place to the state
// after the last token; o written.
using KdaRecurrentStep = void(Context& ctx, const KdaStepParams& p, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                              Tensor& state, Tensor& o);
KdaRecurrentStep kda_recurrent_step;

// The backends' bodies, called by the entry above once it validated: ops/cpu/kda_step.cpp, and
// ops/cuda/kda_step.cu in CUDA builds.
MT_OP_BACKENDS(KdaRecurrentStep kda_recurrent_step;)

}  // namespace mt::ops
