#include <gtest/gtest.h>

#include "core/seq_info.h"
#include "harness/op_check.h"
#include "ops/router.h"
#include "ref/router_ref.h"

namespace mt::test {
namespace {

// The ops write their losses into f64 tensors (no host read inside an op); the tests read them.
double seq_aux(Context& ctx, const ops::RouterParams& p, const SeqInfo& seq, const Tensor& scores,
               const Tensor& ids) {
  Tensor loss = Tensor::empty({1}, DType::F64, scores.device());
  ops::router_seq_aux_loss(ctx, p, seq, scores, ids, loss);
  ctx.synchronize();  // a GPU op writes on the context's stream
  return read_scalar(loss);
}
double z_loss(Context& ctx, const ops::RouterParams& p, const Tensor& logits) {
  Tensor loss = Tensor::empty({1}, DType::F64, logits.device());
  ops::router_z_loss(ctx, p, logits, loss);
  ctx.synchronize();
  return read_scalar(loss);
}

struct RouterSetup {
  ops::RouterParams p;
  bool bias = false;
  std::vector<int64_t> docs;  // document lengths, summing to p.tokens
  float aux_coeff = 0.f, z_coeff = 0.f;
  double logit_scale = 1.5;
};

// Outputs: ids, gate weights, coeff * seq aux loss, coeff * z-loss. Backward feeds all three
// differentiable outputs into one dlogits, the way the MoE layer does.
class RouterCase : public OpCase {
 public:
  explicit RouterCase(RouterSetup s) : s_(std::move(s)), seq_(SeqInfo::from_lengths(s_.docs)) {}
  std::string name() const override {
    return cat("router T", s_.p.tokens, " E", s_.p.experts, " k", s_.p.top_k,
               s_.p.score == ops::ScoreFunc::Sigmoid ? " sigmoid" : " softmax", " groups",
               s_.p.n_group, "/", s_.p.topk_group, s_.bias ? " bias" : "");
  }
  std::vector<InputSpec> inputs() const override {
    std::vector<InputSpec> in{
        {.name = "logits", .shape = {s_.p.tokens, s_.p.experts}, .scale = s_.logit_scale}};
    if (s_.bias)
      in.push_back(
          {.name = "bias", .shape = {s_.p.experts}, .differentiable = false, .scale = 0.1});
    return in;
  }
  std::vector<OutputSpec> outputs() const override {
    return {{"ids", false}, {"weights"}, {"seq_aux"}, {"z_loss"}};
  }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    const int64_t T = s_.p.tokens, E = s_.p.experts, K = s_.p.top_k;
    scores_ = alloc({T, E});
    ids_ = alloc({T, K}, DType::I32);
    Tensor w = alloc({T, K}), aux = alloc({1}), z = alloc({1});
    ops::router_forward(ctx, s_.p, in[0], s_.bias ? in[1] : Tensor(), scores_, ids_, w);
    // Written through a host copy, so that the outputs live where the op ran (the device pass).
    Tensor h = Tensor::empty({1});
    h.f32()[0] = static_cast<float>(s_.aux_coeff * seq_aux(ctx, s_.p, seq_, scores_, ids_));
    aux.copy_from(h);
    h.f32()[0] = static_cast<float>(s_.z_coeff * z_loss(ctx, s_.p, in[0]));
    z.copy_from(h);
    return {ids_, w, aux, z};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    const float daux = dout[2].to(Device::CPU).f32()[0], dz = dout[3].to(Device::CPU).f32()[0];
    ops::router_backward(ctx, s_.p, scores_, ids_, dout[1], grads[0]);
    ops::router_seq_aux_backward(ctx, s_.p, seq_, scores_, ids_, s_.aux_coeff * daux, grads[0]);
    ops::router_z_loss_backward(ctx, s_.p, in[0], s_.z_coeff * dz, grads[0]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    ref::RouterRefParams rp{.tokens = s_.p.tokens,
                            .experts = s_.p.experts,
                            .top_k = s_.p.top_k,
                            .sigmoid = s_.p.score == ops::ScoreFunc::Sigmoid,
                            .n_group = s_.p.n_group,
                            .topk_group = s_.p.topk_group,
                            .norm_topk_prob = s_.p.norm_topk_prob,
                            .routed_scaling = s_.p.routed_scaling};
    ref::RouterRefOut o = ref::router(rp, in[0], s_.bias ? in[1] : DVec{});
    DVec ids(o.ids.begin(), o.ids.end());
    return {ids,
            o.weights,
            {s_.aux_coeff * ref::router_seq_aux(rp, o.scores, o.ids, seq_.offsets)},
            {s_.z_coeff * ref::router_z(rp, in[0])}};
  }

 private:
  RouterSetup s_;
  SeqInfo seq_;
  Tensor scores_, ids_;
};

TEST(Router, SigmoidTopK) {
  RouterCase c({.p = {.tokens = 37, .experts = 8, .top_k = 2}, .docs = {37}});
  check_op(c);
}

TEST(Router, SoftmaxTopKUnnormalised) {
  RouterCase c({.p = {.tokens = 29,
                      .experts = 7,
                      .top_k = 3,
                      .score = ops::ScoreFunc::Softmax,
                      .norm_topk_prob = false,
                      .routed_scaling = 1.7f},
                .docs = {29}});
  check_op(c);
}

TEST(Router, SoftmaxNormalisedScaled) {
  RouterCase c({.p = {.tokens = 23,
                      .experts = 9,
                      .top_k = 4,
                      .score = ops::ScoreFunc::Softmax,
                      .routed_scaling = 2.5f},
                .docs = {23}});
  check_op(c);
}

TEST(Router, SigmoidGroupLimitedWithBias) {
  RouterCase c({.p = {.tokens = 41,
                      .experts = 16,
                      .top_k = 3,
                      .n_group = 4,
                      .topk_group = 2,
                      .routed_scaling = 2.5f},
                .bias = true,
                .docs = {41}});
  check_op(c);
}

TEST(Router, SoftmaxGroupLimited) {
  RouterCase c({.p = {.tokens = 33,
                      .experts = 12,
                      .top_k = 2,
                      .score = ops::ScoreFunc::Softmax,
                      .n_group = 4,
                      .topk_group = 2},
                .docs = {33}});
  check_op(c);
}

TEST(Router, TopKFillsKeptGroups) {
  // k equals the number of experts in the kept groups: every kept expert is chosen.
  RouterCase c({.p = {.tokens = 19, .experts = 8, .top_k = 4, .n_group = 4, .topk_group = 2},
                .bias = true,
                .docs = {19}});
  check_op(c);
}

TEST(Router, SeqAuxAndZLossSigmoidSeveralDocs) {
  RouterCase c({.p = {.tokens = 31, .experts = 8, .top_k = 2, .n_group = 4, .topk_group = 2},
                .bias = true,
                .docs = {7, 1, 15, 8},
                .aux_coeff = 0.7f,
                .z_coeff = 0.3f});
  check_op(c);
}

TEST(Router, SeqAuxAndZLossSoftmaxSeveralDocs) {
  RouterCase c({.p = {.tokens = 26, .experts = 6, .top_k = 2, .score = ops::ScoreFunc::Softmax},
                .docs = {13, 5, 8},
                .aux_coeff = 1.3f,
                .z_coeff = 0.05f});
  check_op(c);
}

TEST(Router, TiesGoToLowerIndex) {
  Context ctx;
  ops::RouterParams p{.tokens = 1, .experts = 6, .top_k = 2, .n_group = 3, .topk_group = 1};
  Tensor logits = Tensor::zeros({1, 6});  // every expert and group ties
  Tensor scores = Tensor::empty({1, 6}), ids = Tensor::empty({1, 2}, DType::I32);
  Tensor w = Tensor::empty({1, 2});
  ops::router_forward(ctx, p, logits, Tensor(), scores, ids, w);
  EXPECT_EQ(ids.i32()[0], 0);
  EXPECT_EQ(ids.i32()[1], 1);
  EXPECT_FLOAT_EQ(w.f32()[0], 0.5f);
}

TEST(Router, BiasChangesSelectionNotWeights) {
  Context ctx;
  ops::RouterParams p{.tokens = 1, .experts = 4, .top_k = 1, .norm_topk_prob = false};
  Tensor logits = Tensor::zeros({1, 4});
  logits.f32()[0] = 1.0f;
  Tensor bias = Tensor::zeros({4});
  bias.f32()[3] = 1.0f;
  Tensor scores = Tensor::empty({1, 4}), ids = Tensor::empty({1, 1}, DType::I32);
  Tensor w = Tensor::empty({1, 1});
  ops::router_forward(ctx, p, logits, bias, scores, ids, w);
  EXPECT_EQ(ids.i32()[0], 3);
  EXPECT_FLOAT_EQ(w.f32()[0], 0.5f);  // sigmoid(0): the unbiased score
}

TEST(Router, LoadCountsAndBiasUpdate) {
  Context ctx;
  Tensor ids = Tensor::empty({3, 2}, DType::I32);
  const int32_t v[] = {0, 1, 1, 2, 1, 0};
  for (int i = 0; i < 6; ++i) ids.i32()[i] = v[i];
  Tensor load = Tensor::empty({4}, DType::I64);
  ops::expert_load_counts(ctx, ids, 4, load);
  EXPECT_EQ(load.i64()[0], 2);
  EXPECT_EQ(load.i64()[1], 3);
  EXPECT_EQ(load.i64()[2], 1);
  EXPECT_EQ(load.i64()[3], 0);
  Tensor bias = Tensor::zeros({4});
  bias.f32()[2] = 0.25f;
  ops::router_bias_update(ctx, load, 0.01f, bias);  // mean load 1.5
  EXPECT_FLOAT_EQ(bias.f32()[0], -0.01f);
  EXPECT_FLOAT_EQ(bias.f32()[1], -0.01f);
  EXPECT_FLOAT_EQ(bias.f32()[2], 0.26f);
  EXPECT_FLOAT_EQ(bias.f32()[3], 0.01f);
  Tensor even = Tensor::empty({2}, DType::I64);
  even.i64()[0] = even.i64()[1] = 5;
  Tensor b2 = Tensor::zeros({2});
  ops::router_bias_update(ctx, even, 0.01f, b2);
  EXPECT_EQ(b2.f32()[0], 0.0f);
}

TEST(Router, InvalidConfigIsAnError) {
  Context ctx;
  Tensor logits = Tensor::zeros({2, 6}), scores = Tensor::empty({2, 6});
  Tensor ids = Tensor::empty({2, 3}, DType::I32), w = Tensor::empty({2, 3});
  ops::RouterParams p{.tokens = 2, .experts = 6, .top_k = 3, .n_group = 3, .topk_group = 1};
  EXPECT_THROW(ops::router_forward(ctx, p, logits, Tensor(), scores, ids, w), ValueError);
  p.n_group = 4;
  EXPECT_THROW(ops::router_forward(ctx, p, logits, Tensor(), scores, ids, w), ValueError);
  ops::RouterParams q{.tokens = 2, .experts = 6, .top_k = 2};
  Tensor bad = Tensor::empty({2, 5});
  EXPECT_THROW(ops::router_forward(ctx, q, bad, Tensor(), scores, ids, w), ShapeError);
}

}  // namespace
}  // namespace mt::test
