// The CPU path of ops/kda_gate.h: fp32 loops. Called by the entries after they validated, so it
// does not re-check.
#pragma once

#include "ops/kda_gate.h"

namespace mt::ops::cpu {

void kda_gate_forward(Context& ctx, const KdaGateParams& p, const Tensor& raw, const Tensor& a_log,
                      const Tensor& dt_bias, Tensor& g);
void kda_gate_backward(Context& ctx, const KdaGateParams& p, const Tensor& raw, const Tensor& a_log,
                       const Tensor& dt_bias, const Tensor& dg, Tensor& draw, Tensor& da_log,
                       Tensor& ddt_bias);

}  // namespace mt::ops::cpu
