// Depthwise causal conv1d (the "short conv" of KDA), varlen-aware: a document never sees the
// tokens of the previous one (they read as zeros).
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

struct CausalConvParams {
  int64_t tokens = 0, channels = 0, kernel = 4;
  // KDA's short conv with its SiLU: y = silu(conv(x)), and backward takes dy against that output,
  // forming conv(x) again from x (a few taps a token) rather than reading a saved pre-activation:
  // one pass fewer each way, and no [tokens, channels] tensor kept from forward to backward.
  bool silu = false;
};

// y[t,c] = sum_{j<kernel} w[c,j] * x[t - (kernel-1) + j, c] (HF weight [C,1,K] viewed as [C,K]:
// w[c, kernel-1] multiplies the current token), then silu(y) where p.silu. x, y [tokens,
// channels]; cu_seqlens i32 [N+1].
using CausalConv1dForward = void(Context& ctx, const CausalConvParams& p, const Tensor& cu_seqlens,
                                 const Tensor& x, const Tensor& w, Tensor& y);
CausalConv1dForward causal_conv1d_forward;
// dx written, dw accumulates.
using CausalConv1dBackward = void(Context& ctx, const CausalConvParams& p, const Tensor& cu_seqlens,
                                  const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                                  Tensor& dw);
CausalConv1dBackward causal_conv1d_backward;

// The backends' bodies, called by the entries above once they validated: ops/cpu/conv1d.cpp, and
// ops/cuda/conv1d.cu in CUDA builds.
MT_OP_BACKENDS(CausalConv1dForward causal_conv1d_forward;
               CausalConv1dBackward causal_conv1d_backward;)

}  // namespace mt::ops
