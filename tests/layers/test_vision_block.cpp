// The vision tower's encoder layer (src/model/vision/vision_block.h) against its double
// reference (tests/ref/vision_block_ref.h) and finite differences, over several images of
// different sizes packed together.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "harness/op_check.h"
#include "model/vision/vision_block.h"
#include "ref/vision_block_ref.h"

namespace mt::test {
namespace {

struct BlockSetup {
  VisionBlockConfig cfg;
  std::vector<ops::ImageGrid> grids;
  bool freeze_base = false;
};

// Inputs: x, then every parameter in param_specs() order (accumulating gradients).
class VisionBlockCase : public OpCase {
 public:
  explicit VisionBlockCase(BlockSetup s)
      : s_(std::move(s)), batch_(VisionBatch::from_grids(s_.grids)), layer_(s_.cfg) {
    specs_ = layer_.param_specs();
  }
  std::string name() const override {
    std::string n =
        cat("vision_block D", s_.cfg.hidden, " H", s_.cfg.heads, " I", s_.cfg.intermediate, " lora",
            s_.cfg.lora.rank, s_.freeze_base ? " frozen" : "");
    for (const ops::ImageGrid& g : s_.grids) n += cat(" ", g.rows, "x", g.cols);
    return n;
  }
  bool trains(const ParamSpec& p) const { return !s_.freeze_base || p.role == ParamRole::Lora; }
  std::vector<InputSpec> inputs() const override {
    std::vector<InputSpec> in{{.name = "x", .shape = {batch_.tokens(), s_.cfg.hidden}}};
    for (const ParamSpec& p : specs_) {
      // Fan-in scaled weights keep each branch O(1); norm weights near 1 as trained ones are.
      const bool vec = p.shape.ndim() == 1;
      in.push_back({.name = p.name,
                    .shape = p.shape,
                    .differentiable = trains(p),
                    .accumulate = true,
                    .scale = vec ? 0.3 : 1.0 / std::sqrt(static_cast<double>(p.shape[-1]))});
    }
    return in;
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    layer_.bind(table(in, {}));
    ArenaPlan plan;
    layer_.plan_activations(batch_, plan);
    acts_ = Arena(plan.bytes(), Device::CPU, "vision block acts");
    Tensor y = alloc({batch_.tokens(), s_.cfg.hidden});
    layer_.forward(ctx, batch_, in[0], y, acts_, saved_);
    EXPECT_EQ(acts_.used(), plan.bytes()) << "plan_activations differs from what forward took";
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    layer_.bind(table(in, grads));
    layer_.backward(ctx, batch_, dout[0], grads[0], saved_);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    ref::Params params;
    for (size_t i = 0; i < specs_.size(); ++i) params[specs_[i].name] = in[i + 1];
    ref::Grids g;
    for (const ops::ImageGrid& x : s_.grids) g.push_back({x.rows, x.cols});
    return {ref::vision_block(s_.cfg, params, "", in[0], g)};
  }

 private:
  ParamTable table(const std::vector<Tensor>& in, const std::vector<Tensor>& grads) const {
    ParamTable t;
    for (size_t i = 0; i < specs_.size(); ++i)
      t[specs_[i].name] = {.value = in[i + 1], .grad = grads.empty() ? Tensor() : grads[i + 1]};
    return t;
  }
  BlockSetup s_;
  VisionBatch batch_;
  VisionBlock layer_;
  std::vector<ParamSpec> specs_;
  Arena acts_;
  VisionBlock::Saved saved_;
};

TEST(VisionBlock, PackedImagesOfSeveralSizes) {
  VisionBlockCase c(
      {.cfg = {.hidden = 16, .heads = 2, .intermediate = 23}, .grids = {{3, 5}, {1, 2}, {4, 4}}});
  check_op(c);
}

TEST(VisionBlock, LoraFrozenBaseOtherTheta) {
  VisionBlockCase c({.cfg = {.hidden = 24,
                             .heads = 3,
                             .intermediate = 17,
                             .rope_theta = 500.f,
                             .lora = {.rank = 2, .alpha = 4.f}},
                     .grids = {{2, 6}, {5, 3}},
                     .freeze_base = true});
  check_op(c);
}

TEST(VisionBlock, ParamNamesFollowTransformers) {
  VisionBlock layer({.hidden = 8, .heads = 2, .intermediate = 12});
  std::map<std::string, Shape> by_name;
  for (const ParamSpec& p : layer.param_specs()) by_name[p.name] = p.shape;
  ASSERT_EQ(by_name.size(), 16u);
  EXPECT_EQ(by_name.at("attn.q_proj.weight"), Shape({8, 8}));
  EXPECT_EQ(by_name.at("attn.proj.bias"), Shape({8}));
  EXPECT_EQ(by_name.at("mlp.fc1.weight"), Shape({12, 8}));
  EXPECT_EQ(by_name.at("mlp.fc2.bias"), Shape({8}));
  EXPECT_EQ(by_name.at("norm2.weight"), Shape({8}));
}

TEST(VisionBlock, HeadDimNotDivisibleByFourIsAConfigError) {
  EXPECT_THROW(VisionBlock({.hidden = 12, .heads = 2, .intermediate = 8}), ConfigError);
}

}  // namespace
}  // namespace mt::test
