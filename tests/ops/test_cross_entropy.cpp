#include <gtest/gtest.h>

#include <cmath>

#include "harness/op_check.h"
#include "harness/seed.h"
#include "ops/cross_entropy.h"
#include "ref/cross_entropy_ref.h"
#include "ref/linear_ref.h"

namespace mt::test {
namespace {

// The op writes its loss into an f64 tensor (no host read inside the op); the tests read it.
double ce_forward(Context& ctx, const ops::CrossEntropyParams& p, const Tensor& h, const Tensor& w,
                  const Tensor& tg, Tensor& lse) {
  Tensor loss = Tensor::empty({1}, DType::F64, h.device());
  ops::lm_head_cross_entropy_forward(ctx, p, h, w, tg, lse, loss);
  return read_scalar(loss);
}

// Random targets, each ignored with probability `ignore_prob`.
std::function<void(Rng&, Tensor&)> draw_targets(int64_t vocab, double ignore_prob,
                                                int32_t ignore_index) {
  return [=](Rng& rng, Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i)
      t.i32()[i] =
          rng.uniform() < ignore_prob ? ignore_index : static_cast<int32_t>(rng.below(vocab));
  };
}

// Outputs: the mean loss as a [1] tensor (its upstream gradient is dloss) and lse. The loss is
// reported times a constant (on both sides): its upstream gradient is one N(0, 1) draw, and
// without the factor the weight gradient of a mean over many tokens can sit near the fp32
// rounding of the harness's N(0, 1)-prefilled accumulate buffer.
class CrossEntropyCase : public OpCase {
 public:
  CrossEntropyCase(ops::CrossEntropyParams p, double ignore_prob) : p_(p), ignore_(ignore_prob) {}
  std::string name() const override {
    return cat("lm_head_cross_entropy T=", p_.tokens, " hidden=", p_.hidden, " vocab=", p_.vocab,
               " chunk=", p_.chunk_tokens);
  }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "h", .shape = {p_.tokens, p_.hidden}},
            {.name = "w", .shape = {p_.vocab, p_.hidden}, .accumulate = true, .scale = 0.5},
            {.name = "targets",
             .shape = {p_.tokens},
             .dtype = DType::I32,
             .differentiable = false,
             .init = draw_targets(p_.vocab, ignore_, p_.ignore_index)}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"loss"}, {"lse", false}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor loss = alloc({1});
    lse_ = alloc({p_.tokens});
    Tensor host = Tensor::empty({1});
    host.f32()[0] = static_cast<float>(scale() * ce_forward(ctx, p_, in[0], in[1], in[2], lse_));
    loss.copy_from(host);
    return {loss, lse_};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::lm_head_cross_entropy_backward(ctx, p_, in[0], in[1], in[2], lse_,
                                        static_cast<float>(scale() * to_dvec(dout[0])[0]), grads[0],
                                        grads[1]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    ref::CrossEntropyOut o =
        ref::lm_head_cross_entropy(in[0], in[1], in[2], p_.hidden, p_.vocab, p_.ignore_index);
    return {{scale() * o.loss}, o.lse};
  }

 private:
  double scale() const { return 1000.0; }
  ops::CrossEntropyParams p_;
  double ignore_;
  Tensor lse_;
};

// T is not a multiple of the chunk; a quarter of the targets are ignored.
TEST(CrossEntropy, ChunkedWithIgnored) {
  CrossEntropyCase c({.tokens = 67, .hidden = 19, .vocab = 97, .chunk_tokens = 16}, 0.25);
  check_op(c);
}

TEST(CrossEntropy, OneChunk) {
  CrossEntropyCase c({.tokens = 13, .hidden = 8, .vocab = 41, .chunk_tokens = 128}, 0.1);
  check_op(c);
}

TEST(CrossEntropy, OtherIgnoreIndex) {
  CrossEntropyCase c({.tokens = 21, .hidden = 7, .vocab = 33, .chunk_tokens = 5, .ignore_index = 0},
                     0.3);
  check_op(c);
}

// Large logits (scale ~ 60) must not overflow: the log-sum-exp is taken relative to the row max.
TEST(CrossEntropy, LargeLogitsAreStable) {
  Context ctx;
  Rng rng(test_seed());
  ops::CrossEntropyParams p{.tokens = 9, .hidden = 4, .vocab = 17, .chunk_tokens = 4};
  Tensor h = Tensor::empty({9, 4}), w = Tensor::empty({17, 4}), tg = Tensor::empty({9}, DType::I32);
  fill_normal(rng, h, 30.0);
  fill_normal(rng, w, 1.0);
  for (int64_t i = 0; i < 9; ++i) tg.i32()[i] = static_cast<int32_t>(rng.below(17));
  Tensor lse = Tensor::empty({9});
  double loss = ce_forward(ctx, p, h, w, tg, lse);
  ref::CrossEntropyOut want =
      ref::lm_head_cross_entropy(to_dvec(h), to_dvec(w), to_dvec(tg), 4, 17, p.ignore_index);
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, want.loss, 1e-4 * std::abs(want.loss) + 1e-4);
  Tensor dh = Tensor::empty({9, 4}), dw = Tensor::zeros({17, 4});
  ops::lm_head_cross_entropy_backward(ctx, p, h, w, tg, lse, 1.f, dh, dw);
  for (double g : to_dvec(dh)) EXPECT_TRUE(std::isfinite(g));
}

TEST(CrossEntropy, AllIgnored) {
  Context ctx;
  ops::CrossEntropyParams p{.tokens = 3, .hidden = 2, .vocab = 5, .chunk_tokens = 2};
  Tensor h = Tensor::empty({3, 2}), w = Tensor::empty({5, 2}), tg = Tensor::empty({3}, DType::I32);
  Rng rng(test_seed());
  fill_normal(rng, h);
  fill_normal(rng, w);
  for (int i = 0; i < 3; ++i) tg.i32()[i] = -100;
  Tensor lse = Tensor::empty({3}), dh = Tensor::empty({3, 2}), dw = Tensor::zeros({5, 2});
  EXPECT_EQ(ce_forward(ctx, p, h, w, tg, lse), 0.0);
  ops::lm_head_cross_entropy_backward(ctx, p, h, w, tg, lse, 1.f, dh, dw);
  for (double g : to_dvec(dh)) EXPECT_EQ(g, 0.0);
  for (double g : to_dvec(dw)) EXPECT_EQ(g, 0.0);
}

// The scratch is one chunk of logits, not the whole [tokens, vocab].
TEST(CrossEntropy, WorkspaceStaysAtOneChunk) {
  Context ctx;
  Rng rng(test_seed());
  ops::CrossEntropyParams p{.tokens = 2000, .hidden = 16, .vocab = 257, .chunk_tokens = 64};
  Tensor h = Tensor::empty({p.tokens, p.hidden}), w = Tensor::empty({p.vocab, p.hidden});
  Tensor tg = Tensor::empty({p.tokens}, DType::I32);
  fill_normal(rng, h);
  fill_normal(rng, w, 0.3);
  draw_targets(p.vocab, 0.1, p.ignore_index)(rng, tg);
  Tensor lse = Tensor::empty({p.tokens}), dh = Tensor::empty(h.shape()),
         dw = Tensor::zeros(w.shape());
  double loss = ce_forward(ctx, p, h, w, tg, lse);
  ops::lm_head_cross_entropy_backward(ctx, p, h, w, tg, lse, 1.f, dh, dw);
  const size_t full = static_cast<size_t>(p.tokens * p.vocab) * 4;
  const size_t chunk = static_cast<size_t>(p.chunk_tokens * p.vocab) * 4;
  EXPECT_LT(ctx.workspace().peak(), full);
  EXPECT_LE(ctx.workspace().peak(), chunk + 4096);
  ref::CrossEntropyOut want = ref::lm_head_cross_entropy(to_dvec(h), to_dvec(w), to_dvec(tg),
                                                         p.hidden, p.vocab, p.ignore_index);
  EXPECT_NEAR(loss, want.loss, 1e-5 * want.loss);
  EXPECT_LE(rel_err(to_dvec(lse), want.lse), 1e-5);
}

TEST(CrossEntropy, OutOfRangeTargetIsAValueError) {
  Context ctx;
  ops::CrossEntropyParams p{.tokens = 4, .hidden = 2, .vocab = 5};
  Tensor h = Tensor::zeros({4, 2}), w = Tensor::zeros({5, 2}), tg = Tensor::zeros({4}, DType::I32);
  Tensor lse = Tensor::empty({4}), dh = Tensor::empty({4, 2}), dw;
  for (int32_t bad : {5, -1, -99}) {
    tg.i32()[2] = bad;
    EXPECT_THROW(ce_forward(ctx, p, h, w, tg, lse), ValueError) << bad;
    EXPECT_THROW(ops::lm_head_cross_entropy_backward(ctx, p, h, w, tg, lse, 1.f, dh, dw),
                 ValueError);
  }
}

class LogitsCase : public OpCase {
 public:
  std::string name() const override { return "lm_head_logits"; }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "h", .shape = {5, 19}, .differentiable = false},
            {.name = "w", .shape = {97, 19}, .differentiable = false}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"logits", false}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor logits = alloc({5, 97});
    ops::lm_head_logits(ctx, in[0], in[1], logits);
    return {logits};
  }
  void backward(Context&, GuardedAlloc&, const std::vector<Tensor>&, const std::vector<Tensor>&,
                std::vector<Tensor>&) override {}
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::matmul_nt(in[0], in[1], 5, 19, 97)};
  }
};

TEST(CrossEntropy, LmHeadLogits) {
  LogitsCase c;
  check_op(c);
}

}  // namespace
}  // namespace mt::test
