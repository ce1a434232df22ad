#include "ops/kda_gate.h"

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

void check_shapes(const KdaGateParams& p, const Tensor& raw, const Tensor& a_log,
                  const Tensor& dt_bias) {
  MT_CHECK(p.tokens >= 0 && p.heads > 0 && p.head_dim > 0, ValueError, "kda_gate: bad dims tokens ",
           p.tokens, " heads ", p.heads, " head_dim ", p.head_dim);
  expect_shape(raw, {p.tokens, p.heads * p.head_dim}, "kda_gate raw");
  expect_shape(a_log, {p.heads}, "kda_gate A_log");
  expect_shape(dt_bias, {p.heads * p.head_dim}, "kda_gate dt_bias");
}

}  // namespace

void kda_gate_forward(Context& ctx, const KdaGateParams& p, const Tensor& raw, const Tensor& a_log,
                      const Tensor& dt_bias, Tensor& g) {
  check_shapes(p, raw, a_log, dt_bias);
  expect_shape(g, raw.shape(), "kda_gate g");
  dispatch(MT_OP_BODIES(kda_gate_forward), {&raw, &a_log, &dt_bias, &g}, ctx, p, raw, a_log,
           dt_bias, g);
}

void kda_gate_backward(Context& ctx, const KdaGateParams& p, const Tensor& raw, const Tensor& a_log,
                       const Tensor& dt_bias, const Tensor& dg, Tensor& draw, Tensor& da_log,
                       Tensor& ddt_bias) {
  check_shapes(p, raw, a_log, dt_bias);
  expect_shape(dg, raw.shape(), "kda_gate dg");
  expect_shape(draw, raw.shape(), "kda_gate draw");
  if (da_log.defined()) expect_shape(da_log, a_log.shape(), "kda_gate dA_log");
  if (ddt_bias.defined()) expect_shape(ddt_bias, dt_bias.shape(), "kda_gate ddt_bias");
  dispatch(MT_OP_BODIES(kda_gate_backward),
           {&raw, &a_log, &dt_bias, &dg, &draw, &da_log, &ddt_bias}, ctx, p, raw, a_log, dt_bias,
           dg, draw, da_log, ddt_bias);
}

}  // namespace mt::ops
