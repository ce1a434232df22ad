// The KDA decay gate in log space: g = -exp(A_log[h]) * softplus(raw + dt_bias), softplus with
// beta 1 and threshold 20 (as torch / fla). g <= 0 always, which is what keeps every exponent of
// the KDA core non-positive.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

struct KdaGateParams {
  int64_t tokens = 0, heads = 0, head_dim = 0;
};

// raw, g [tokens, heads * head_dim]; a_log [heads]; dt_bias [heads * head_dim].
using KdaGateForward = void(Context& ctx, const KdaGateParams& p, const Tensor& raw,
                            const Tensor& a_log, const Tensor& dt_bias, Tensor& g);
KdaGateForward kda_gate_forward;

// draw written; da_log and ddt_bias accumulate (+=), each skipped when undefined (frozen).
using KdaGateBackward = void(Context& ctx, const KdaGateParams& p, const Tensor& raw,
                             const Tensor& a_log, const Tensor& dt_bias, const Tensor& dg,
                             Tensor& draw, Tensor& da_log, Tensor& ddt_bias);
KdaGateBackward kda_gate_backward;

// The backends' bodies, called by the entries above once they validated: ops/cpu/kda_gate.cpp, and
// ops/cuda/kda_gate.cu in CUDA builds.
MT_OP_BACKENDS(KdaGateForward kda_gate_forward; KdaGateBackward kda_gate_backward;)

}  // namespace mt::ops
