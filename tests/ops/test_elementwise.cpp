#include <gtest/gtest.h>

#include "harness/op_check.h"
#include "harness/seed.h"
#include "ops/elementwise.h"
#include "ops/expert_load.h"
#include "ops/norm.h"
#include "ref/elementwise_ref.h"

namespace mt::test {
namespace {

// acc + x through add_into; the gradient reaches both operands unchanged.
class AddCase : public OpCase {
 public:
  std::string name() const override { return "add_into"; }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "x", .shape = {13, 7}}, {.name = "acc", .shape = {13, 7}}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc({13, 7});
    ops::copy(ctx, in[1], y);
    ops::add_into(ctx, in[0], y);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>&,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::copy(ctx, dout[0], grads[0]);
    ops::copy(ctx, dout[0], grads[1]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::add(in[1], in[0])};
  }
};

class ScaleCase : public OpCase {
 public:
  std::string name() const override { return "scale"; }
  std::vector<InputSpec> inputs() const override { return {{.name = "x", .shape = {9, 5, 3}}}; }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc({9, 5, 3});
    ops::scale(ctx, in[0], kS, y);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>&,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::scale(ctx, dout[0], kS, grads[0]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::scale(in[0], kS)};
  }

 private:
  static constexpr float kS = -0.37f;
};

class SigmoidCase : public OpCase {
 public:
  std::string name() const override { return "sigmoid"; }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "x", .shape = {17, 6}, .scale = 3.0}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    y_ = alloc({17, 6});
    ops::sigmoid_forward(ctx, in[0], y_);
    return {y_};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>&,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::sigmoid_backward(ctx, y_, dout[0], grads[0]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::sigmoid_vec(in[0])};
  }

 private:
  Tensor y_;
};

// Split of a fused [T, a + b] buffer into its two column parts; backward concatenates the parts'
// gradients into column views of the fused gradient.
class SplitCase : public OpCase {
 public:
  std::string name() const override { return "copy split/concat"; }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "fused", .shape = {kT, kA + kB}}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"first"}, {"second"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor a = alloc({kT, kA}), b = alloc({kT, kB});
    ops::copy(ctx, in[0].cols(0, kA), a);
    ops::copy(ctx, in[0].cols(kA, kA + kB), b);
    return {a, b};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>&,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    Tensor ga = grads[0].cols(0, kA), gb = grads[0].cols(kA, kA + kB);
    ops::copy(ctx, dout[0], ga);
    ops::copy(ctx, dout[1], gb);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::col_slice(in[0], kT, kA + kB, 0, kA),
            ref::col_slice(in[0], kT, kA + kB, kA, kA + kB)};
  }

 private:
  static constexpr int64_t kT = 11, kA = 7, kB = 4;
};

// One vector per token onto every head of a column view of [T, H, 3 + D] (MLA's rotary key).
class ExpandHeadsCase : public OpCase {
 public:
  std::string name() const override { return "expand_heads"; }
  std::vector<InputSpec> inputs() const override { return {{.name = "x", .shape = {kT, kD}}}; }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor wide = alloc({kT, kH, 3 + kD});
    Tensor view = wide.cols(3, 3 + kD);
    ops::expand_heads_forward(ctx, in[0], view);
    Tensor y = alloc({kT, kH, kD});
    ops::copy(ctx, view, y);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc& alloc, const std::vector<Tensor>&,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    Tensor wide = alloc({kT, kH, kD + 2});
    Tensor view = wide.cols(0, kD);
    ops::copy(ctx, dout[0], view);
    ops::expand_heads_backward(ctx, view, grads[0]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::expand_heads(in[0], kT, kH, kD)};
  }

 private:
  static constexpr int64_t kT = 9, kH = 5, kD = 6;
};

TEST(Elementwise, AddInto) {
  AddCase c;
  check_op(c);
}

TEST(Elementwise, Scale) {
  ScaleCase c;
  check_op(c);
}

TEST(Elementwise, Sigmoid) {
  SigmoidCase c;
  check_op(c);
}

TEST(Elementwise, SplitAndConcatThroughColumnViews) {
  SplitCase c;
  check_op(c);
}

TEST(Elementwise, ExpandHeads) {
  ExpandHeadsCase c;
  check_op(c);
}

TEST(Elementwise, StridedViewsReachingDenseOpsAreErrors) {
  Context ctx;
  Tensor fused = Tensor::zeros({4, 6});
  Tensor left = fused.cols(0, 3), y = Tensor::zeros({4, 3});
  try {
    ops::sigmoid_forward(ctx, left, y);
    FAIL() << "a strided view reached sigmoid";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("sigmoid x is a strided view"), std::string::npos)
        << e.what();
  }
  Tensor rstd = Tensor::zeros({4}), w = Tensor::zeros({3});
  EXPECT_THROW(ops::rmsnorm_forward(ctx, {.rows = 4, .dim = 3, .eps = 1e-6f}, left, w, y, rstd),
               ShapeError);
  EXPECT_THROW(ops::add_into(ctx, Tensor::zeros({4, 2}), y), ShapeError);
}

TEST(ExpertLoad, CountsRowsPerExpertThroughSlots) {
  Context ctx;
  Rng rng(test_seed());
  const int64_t E = 7;
  for (bool slots : {false, true}) {
    std::vector<int32_t> off{0}, at;
    for (int64_t s = 0; s < E; ++s)
      off.push_back(off.back() + (s % 3 == 1 ? 0 : static_cast<int32_t>(rng.below(9))));
    if (slots) {
      for (int64_t s = 0; s < E; ++s) at.push_back(static_cast<int32_t>((s * 3 + 2) % E));
    }
    std::vector<int64_t> load0;
    for (int64_t e = 0; e < E; ++e) load0.push_back(rng.below(100));
    std::vector<int64_t> load = load0;
    Tensor toff(off.data(), {E + 1}, DType::I32), tat(at.data(), {E}, DType::I32);
    Tensor tload(load.data(), {E}, DType::I64);
    ops::expert_load_count(ctx, toff, slots ? tat : Tensor(), tload);
    EXPECT_EQ(load, ref::expert_load(load0, off, at)) << (slots ? "slots" : "identity");
  }
}

TEST(ExpertLoad, MapIdsRelabelsAndRejectsOutOfRange) {
  Context ctx;
  std::vector<int32_t> ids{3, 0, 2, 2, 1, 3}, table{2, 3, 1, 0};
  Tensor t(ids.data(), {3, 2}, DType::I32), tab(table.data(), {4}, DType::I32);
  ops::map_ids(ctx, t, tab);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 2, 1, 1, 3, 0}));
  ids[4] = 4;
  EXPECT_THROW(ops::map_ids(ctx, t, tab), ValueError);
}

}  // namespace
}  // namespace mt::test
