#include <gtest/gtest.h>

#include "harness/op_check.h"
#include "ops/norm.h"
#include "ref/norm_ref.h"

namespace mt::test {
namespace {

// x is given as `shape` (e.g. [T, H, K] for a per-head norm) and normalised as [rows, dim] with
// dim = the last dimension and one weight shared by all rows.
ops::NormParams norm_params(const Shape& shape, float eps) {
  const int64_t dim = shape[-1];
  return {.rows = shape.numel() / dim, .dim = dim, .eps = eps};
}

class RmsNormCase : public OpCase {
 public:
  RmsNormCase(Shape shape, float eps, bool frozen)
      : shape_(std::move(shape)), p_(norm_params(shape_, eps)), frozen_(frozen) {}
  std::string name() const override { return cat("rmsnorm", shape_, frozen_ ? " frozen" : ""); }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "x", .shape = shape_, .scale = 2.0},
            {.name = "w", .shape = {p_.dim}, .differentiable = !frozen_, .accumulate = true}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}, {"rstd", false}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc(shape_);
    rstd_ = alloc({p_.rows});
    Tensor y2 = y.view({p_.rows, p_.dim});
    ops::rmsnorm_forward(ctx, p_, in[0].view({p_.rows, p_.dim}), in[1], y2, rstd_);
    return {y, rstd_};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    Tensor dx = grads[0].view({p_.rows, p_.dim});
    ops::rmsnorm_backward(ctx, p_, in[0].view({p_.rows, p_.dim}), in[1], rstd_,
                          dout[0].view({p_.rows, p_.dim}), dx, grads[1]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    ref::NormOut o = ref::rmsnorm(in[0], in[1], p_.rows, p_.dim, p_.eps);
    return {o.y, o.rstd};
  }

 private:
  Shape shape_;
  ops::NormParams p_;
  bool frozen_;
  Tensor rstd_;
};

class LayerNormCase : public OpCase {
 public:
  LayerNormCase(Shape shape, float eps) : shape_(std::move(shape)), p_(norm_params(shape_, eps)) {}
  std::string name() const override { return cat("layernorm", shape_); }
  std::vector<InputSpec> inputs() const override {
    // An offset in x checks that the mean is removed before the variance is taken.
    return {{.name = "x",
             .shape = shape_,
             .init =
                 [](Rng& rng, Tensor& t) {
                   for (int64_t i = 0; i < t.numel(); ++i)
                     t.f32()[i] = static_cast<float>(3.0 + 2.0 * rng.normal());
                 }},
            {.name = "w", .shape = {p_.dim}, .accumulate = true},
            {.name = "b", .shape = {p_.dim}, .accumulate = true}};
  }
  std::vector<OutputSpec> outputs() const override {
    return {{"y"}, {"mean", false}, {"rstd", false}};
  }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc(shape_);
    mean_ = alloc({p_.rows});
    rstd_ = alloc({p_.rows});
    Tensor y2 = y.view({p_.rows, p_.dim});
    ops::layernorm_forward(ctx, p_, in[0].view({p_.rows, p_.dim}), in[1], in[2], y2, mean_, rstd_);
    return {y, mean_, rstd_};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    Tensor dx = grads[0].view({p_.rows, p_.dim});
    ops::layernorm_backward(ctx, p_, in[0].view({p_.rows, p_.dim}), in[1], mean_, rstd_,
                            dout[0].view({p_.rows, p_.dim}), dx, grads[1], grads[2]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    ref::NormOut o = ref::layernorm(in[0], in[1], in[2], p_.rows, p_.dim, p_.eps);
    return {o.y, o.mean, o.rstd};
  }

 private:
  Shape shape_;
  ops::NormParams p_;
  Tensor mean_, rstd_;
};

class L2NormCase : public OpCase {
 public:
  L2NormCase(Shape shape, float eps) : shape_(std::move(shape)), p_(norm_params(shape_, eps)) {}
  std::string name() const override { return cat("l2norm", shape_); }
  std::vector<InputSpec> inputs() const override { return {{.name = "x", .shape = shape_}}; }
  std::vector<OutputSpec> outputs() const override { return {{"y"}, {"rstd", false}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc(shape_);
    rstd_ = alloc({p_.rows});
    Tensor y2 = y.view({p_.rows, p_.dim});
    ops::l2norm_forward(ctx, p_, in[0].view({p_.rows, p_.dim}), y2, rstd_);
    return {y, rstd_};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    Tensor dx = grads[0].view({p_.rows, p_.dim});
    ops::l2norm_backward(ctx, p_, in[0].view({p_.rows, p_.dim}), rstd_,
                         dout[0].view({p_.rows, p_.dim}), dx);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    ref::NormOut o = ref::l2norm(in[0], p_.rows, p_.dim, p_.eps);
    return {o.y, o.rstd};
  }

 private:
  Shape shape_;
  ops::NormParams p_;
  Tensor rstd_;
};

TEST(Norm, RmsNorm) {
  RmsNormCase c({67, 37}, 1e-6f, false);
  check_op(c);
}

TEST(Norm, RmsNormPerHead) {
  RmsNormCase c({13, 5, 24}, 1e-5f, false);
  check_op(c);
}

TEST(Norm, RmsNormFrozenWeight) {
  RmsNormCase c({11, 29}, 1e-6f, true);
  check_op(c);
}

// A large eps relative to mean(x^2) makes eps visible in the output.
TEST(Norm, RmsNormLargeEps) {
  RmsNormCase c({9, 17}, 0.5f, false);
  check_op(c);
}

TEST(Norm, LayerNorm) {
  LayerNormCase c({67, 37}, 1e-5f);
  check_op(c);
}

TEST(Norm, LayerNormPerHead) {
  LayerNormCase c({7, 3, 33}, 1e-6f);
  check_op(c);
}

TEST(Norm, L2Norm) {
  L2NormCase c({67, 37}, 1e-6f);
  check_op(c);
}

TEST(Norm, L2NormPerHead) {
  L2NormCase c({13, 5, 24}, 1e-6f);
  check_op(c);
}

// eps sits inside the root: with x = 0 the output is 0 and rstd = 1/sqrt(eps).
TEST(Norm, L2NormEpsInsideRoot) {
  Context ctx;
  ops::NormParams p{.rows = 1, .dim = 4, .eps = 0.25f};
  Tensor x = Tensor::zeros({1, 4}), y = Tensor::empty({1, 4}), rstd = Tensor::empty({1});
  x.f32()[0] = 1.f;
  ops::l2norm_forward(ctx, p, x, y, rstd);
  EXPECT_NEAR(rstd.f32()[0], 1.0 / std::sqrt(1.25), 1e-6);
  EXPECT_NEAR(y.f32()[0], 1.0 / std::sqrt(1.25), 1e-6);
}

TEST(Norm, ShapeMismatchIsAnError) {
  Context ctx;
  ops::NormParams p{.rows = 4, .dim = 3};
  Tensor x = Tensor::zeros({4, 3}), w = Tensor::zeros({4}), y = Tensor::zeros({4, 3}),
         r = Tensor::zeros({4});
  EXPECT_THROW(ops::rmsnorm_forward(ctx, p, x, w, y, r), ShapeError);
}

}  // namespace
}  // namespace mt::test
