#include "ops/router.h"

#include "ops/dispatch.h"
#include "ops/moe_rules.h"

namespace mt::ops {

namespace {

void check_params(const RouterParams& p) {
  const std::string routing = routing_error(p.experts, p.top_k, p.n_group, p.topk_group);
  MT_CHECK(routing.empty(), ValueError, "router: ", routing);
}

// What the forward writes and every later router op reads: scores [T, E], ids [T, K].
void check_choice(const RouterParams& p, const Tensor& scores, const Tensor& ids) {
  expect_shape(scores, {p.tokens, p.experts}, "router scores");
  expect_shape(ids, {p.tokens, p.top_k}, "router ids");
}

void check_aux(const RouterParams& p, const SeqInfo& seq, const Tensor& scores, const Tensor& ids) {
  check_choice(p, scores, ids);
  const int64_t T = p.tokens;
  MT_CHECK(seq.tokens == T && seq.num_seqs > 0, ShapeError, "router aux: SeqInfo has ", seq.tokens,
           " tokens, router ", T);
}

}  // namespace

void router_forward(Context& ctx, const RouterParams& p, const Tensor& logits, const Tensor& bias,
                    Tensor& scores, Tensor& ids, Tensor& weights) {
  check_params(p);
  expect_shape(logits, {p.tokens, p.experts}, "router logits");
  check_choice(p, scores, ids);
  expect_shape(weights, {p.tokens, p.top_k}, "router weights");
  if (bias.defined() && bias.numel() > 0) expect_shape(bias, {p.experts}, "router selection bias");
  dispatch(MT_OP_BODIES(router_forward), {&logits, &bias, &scores, &ids, &weights}, ctx, p, logits,
           bias, scores, ids, weights);
}

void router_backward(Context& ctx, const RouterParams& p, const Tensor& scores, const Tensor& ids,
                     const Tensor& dweights, Tensor& dlogits) {
  check_params(p);
  check_choice(p, scores, ids);
  expect_shape(dweights, {p.tokens, p.top_k}, "router dweights");
  expect_shape(dlogits, {p.tokens, p.experts}, "router dlogits");
  dispatch(MT_OP_BODIES(router_backward), {&scores, &ids, &dweights, &dlogits}, ctx, p, scores, ids,
           dweights, dlogits);
}

void router_seq_aux_loss(Context& ctx, const RouterParams& p, const SeqInfo& seq,
                         const Tensor& scores, const Tensor& ids, Tensor& loss) {
  check_aux(p, seq, scores, ids);
  expect_f64_scalar(loss, "router seq aux loss");
  dispatch(MT_OP_BODIES(router_seq_aux_loss), {&scores, &ids, &loss}, ctx, p, seq, scores, ids,
           loss);
}

void router_seq_aux_backward(Context& ctx, const RouterParams& p, const SeqInfo& seq,
                             const Tensor& scores, const Tensor& ids, float grad, Tensor& dlogits) {
  check_aux(p, seq, scores, ids);
  expect_shape(dlogits, {p.tokens, p.experts}, "router dlogits");
  dispatch(MT_OP_BODIES(router_seq_aux_backward), {&scores, &ids, &dlogits}, ctx, p, seq, scores,
           ids, grad, dlogits);
}

void router_z_loss(Context& ctx, const RouterParams& p, const Tensor& logits, Tensor& loss) {
  expect_shape(logits, {p.tokens, p.experts}, "router logits");
  expect_f64_scalar(loss, "router z loss");
  dispatch(MT_OP_BODIES(router_z_loss), {&logits, &loss}, ctx, p, logits, loss);
}

void router_z_loss_backward(Context& ctx, const RouterParams& p, const Tensor& logits, float grad,
                            Tensor& dlogits) {
  expect_shape(logits, {p.tokens, p.experts}, "router logits");
  expect_shape(dlogits, {p.tokens, p.experts}, "router dlogits");
  dispatch(MT_OP_BODIES(router_z_loss_backward), {&logits, &dlogits}, ctx, p, logits, grad,
           dlogits);
}

void expert_load_counts(Context& ctx, const Tensor& ids, int64_t experts, Tensor& counts) {
  MT_CHECK(ids.ndim() == 2, ShapeError, "expert ids must be [T,k], got ", ids.shape());
  expect_shape(counts, {experts}, "expert load counts");
  if (auto* cuda = cuda_body(MT_OP_BODIES(expert_load_counts), {&ids, &counts}))
    return cuda(ctx, ids, experts, counts);
  // Reads the ids, so only on the host path.
  const int32_t* pid = ids.i32();
  for (int64_t i = 0; i < ids.numel(); ++i)
    MT_CHECK(pid[i] >= 0 && pid[i] < experts, ValueError, "expert id ", pid[i], " out of [0, ",
             experts, ")");
  cpu::expert_load_counts(ctx, ids, experts, counts);
}

void router_bias_update(Context& ctx, const Tensor& load, float rate, Tensor& bias) {
  MT_CHECK(load.ndim() == 1, ShapeError, "expert load must be [E], got ", load.shape());
  expect_shape(bias, {load.dim(0)}, "router selection bias");
  dispatch(MT_OP_BODIES(router_bias_update), {&load, &bias}, ctx, load, rate, bias);
}

}  // namespace mt::ops
