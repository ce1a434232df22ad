#include "ops/overflow_route.h"

#include "ops/dispatch.h"

namespace mt::ops {

void overflow_route_backward(Context& ctx, const RouterParams& rp, const Tensor& scores,
                             const Tensor& ids, const Tensor& dweights, Tensor& dlogits) {
  // The weights are the router's function of the scores at the final ids, so its backward holds
  // (and router_backward dispatches).
  router_backward(ctx, rp, scores, ids, dweights, dlogits);
}

OverflowStats overflow_route_forward(Context& ctx, const OverflowParams& p, const RouterParams& rp,
                                     const std::vector<int32_t>& expert_rank, const Tensor& scores,
                                     const Tensor& bias, const Tensor& cand, Tensor& ids,
                                     Tensor& weights) {
  const int64_t T = p.tokens, E = p.experts, K = p.top_k, W = p.top_k + p.extra;
  MT_CHECK(rp.tokens == T && rp.experts == E && rp.top_k == K, ValueError,
           "overflow routing: router params (", rp.tokens, ", ", rp.experts, ", ", rp.top_k,
           ") differ from (", T, ", ", E, ", ", K, ")");
  expect_shape(scores, {T, E}, "overflow scores");
  expect_shape(cand, {T, W}, "overflow candidates");
  expect_shape(ids, {T, K}, "overflow ids");
  expect_shape(weights, {T, K}, "overflow weights");
  if (bias.defined()) expect_shape(bias, {E}, "overflow bias");
  if (auto* cuda =
          cuda_body(MT_OP_BODIES(overflow_route_forward), {&scores, &bias, &cand, &ids, &weights}))
    return cuda(ctx, p, rp, expert_rank, scores, bias, cand, ids, weights);
  // Reads the candidates, so only on the host path (overflow_assign checks the rest).
  const int32_t* c = cand.i32();
  for (int64_t i = 0; i < T * W; ++i)
    MT_CHECK(c[i] >= 0 && c[i] < E, ValueError, "candidate expert ", c[i], " of token ", i / W,
             " outside [0, ", E, ")");
  return cpu::overflow_route_forward(ctx, p, rp, expert_rank, scores, bias, cand, ids, weights);
}

}  // namespace mt::ops
