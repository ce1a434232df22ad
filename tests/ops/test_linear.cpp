#include <gtest/gtest.h>

#include "harness/op_check.h"
#include "harness/seed.h"
#include "ops/linear.h"
#include "ref/linear_ref.h"

namespace mt::test {
namespace {

// Inputs: x, w, and (with LoRA) a, b. A frozen base has w non-differentiable, so its gradient
// tensor stays undefined and the op must skip it.
class LinearCase : public OpCase {
 public:
  LinearCase(ops::LinearParams p, bool frozen_base) : p_(p), frozen_(frozen_base) {}
  std::string name() const override {
    return cat("linear T=", p_.tokens, " in=", p_.in, " out=", p_.out, " r=", p_.lora_rank,
               frozen_ ? " frozen" : "");
  }
  std::vector<InputSpec> inputs() const override {
    std::vector<InputSpec> v = {{.name = "x", .shape = {p_.tokens, p_.in}},
                                {.name = "w",
                                 .shape = {p_.out, p_.in},
                                 .differentiable = !frozen_,
                                 .accumulate = true,
                                 .scale = 0.3}};
    if (p_.lora_rank) {
      v.push_back(
          {.name = "lora_A", .shape = {p_.lora_rank, p_.in}, .accumulate = true, .scale = 0.3});
      v.push_back(
          {.name = "lora_B", .shape = {p_.out, p_.lora_rank}, .accumulate = true, .scale = 0.3});
    }
    return v;
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc({p_.tokens, p_.out});
    if (p_.lora_rank) xa_ = alloc({p_.tokens, p_.lora_rank});
    ops::linear_forward(ctx, p_, in[0], in[1], lora(in, 2), lora(in, 3), y, xa_);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    Tensor da = lora(grads, 2), db = lora(grads, 3);
    ops::linear_backward(ctx, p_, in[0], in[1], lora(in, 2), lora(in, 3), xa_, dout[0], grads[0],
                         grads[1], da, db);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    const DVec none;
    return {ref::linear(in[0], in[1], p_.lora_rank ? in[2] : none, p_.lora_rank ? in[3] : none,
                        p_.tokens, p_.in, p_.out, p_.lora_rank, p_.lora_alpha)};
  }

 private:
  Tensor lora(const std::vector<Tensor>& v, size_t i) const {
    return p_.lora_rank ? v[i] : Tensor();
  }
  ops::LinearParams p_;
  bool frozen_;
  Tensor xa_;
};

TEST(Linear, Plain) {
  LinearCase c({.tokens = 67, .in = 37, .out = 29}, false);
  check_op(c);
}

TEST(Linear, Lora) {
  LinearCase c({.tokens = 67, .in = 37, .out = 29, .lora_rank = 3, .lora_alpha = 5.f}, false);
  check_op(c);
}

TEST(Linear, LoraFrozenBase) {
  LinearCase c({.tokens = 67, .in = 37, .out = 29, .lora_rank = 3, .lora_alpha = 5.f}, true);
  check_op(c);
}

TEST(Linear, SingleToken) {
  LinearCase c({.tokens = 1, .in = 5, .out = 3, .lora_rank = 1, .lora_alpha = 2.f}, false);
  check_op(c);
}

// accumulate_dx adds onto what dx holds (an input feeding several projections).
TEST(Linear, AccumulateDx) {
  Context ctx;
  Rng rng(test_seed());
  ops::LinearParams p{.tokens = 13, .in = 11, .out = 9, .lora_rank = 2, .lora_alpha = 4.f};
  Tensor x = Tensor::empty({13, 11}), w = Tensor::empty({9, 11}), a = Tensor::empty({2, 11}),
         b = Tensor::empty({9, 2}), dy = Tensor::empty({13, 9});
  for (Tensor* t : {&x, &w, &a, &b, &dy}) fill_normal(rng, *t);
  Tensor y = Tensor::empty({13, 9}), xa = Tensor::empty({13, 2});
  ops::linear_forward(ctx, p, x, w, a, b, y, xa);
  Tensor written = Tensor::empty({13, 11}), added = Tensor::empty({13, 11});
  fill_normal(rng, added);
  Tensor prior = added.clone();
  Tensor none;
  ops::linear_backward(ctx, p, x, w, a, b, xa, dy, written, none, none, none);
  ops::linear_backward(ctx, p, x, w, a, b, xa, dy, added, none, none, none, true);
  DVec want = to_dvec(written), pr = to_dvec(prior);
  for (size_t i = 0; i < want.size(); ++i) want[i] += pr[i];
  EXPECT_LE(rel_err(to_dvec(added), want), 1e-6);
}

TEST(Linear, ShapeMismatchIsAnError) {
  Context ctx;
  ops::LinearParams p{.tokens = 4, .in = 3, .out = 2};
  Tensor x = Tensor::zeros({4, 3}), w = Tensor::zeros({3, 2}), y = Tensor::zeros({4, 2}), none;
  EXPECT_THROW(ops::linear_forward(ctx, p, x, w, none, none, y, none), ShapeError);
}

}  // namespace
}  // namespace mt::test
