// The kimi_k25 vision tower + projector (src/model/vision/vision_tower.h) end to end against the
// double reference (tests/ref/vision_block_ref.h) and finite differences: patch embedding,
// resampled position table, two encoder layers, final norm, 2x2 merge, projector, over images
// of several sizes packed together (one smaller than the position table, one larger).
#include <gtest/gtest.h>

#include <cmath>

#include "harness/model_configs.h"
#include "harness/op_check.h"
#include "model/vision/vision_tower.h"
#include "ref/vision_block_ref.h"

namespace mt::test {
namespace {

VisionConfig tiny(int64_t projector_lora) {
  VisionConfig c = tiny_vision(5);
  c.projector_lora = {.rank = projector_lora, .alpha = 2.f};
  return c;
}

// Inputs: pixels (data, no gradient), the tower's parameters ("tower."), the projector's
// ("proj."). Output: the projected image tokens.
class VisionTowerCase : public OpCase {
 public:
  VisionTowerCase(VisionConfig cfg, std::vector<ops::ImageGrid> grids, bool frozen_tower)
      : cfg_(cfg),
        grids_(std::move(grids)),
        in_(VisionInputs::make(cfg_, grids_)),
        tower_(cfg_),
        proj_(cfg_),
        frozen_(frozen_tower) {
    for (ParamSpec s : tower_.param_specs()) {
      s.name = "tower." + s.name;
      specs_.push_back(s);
    }
    n_tower_ = specs_.size();
    for (ParamSpec s : proj_.param_specs()) {
      s.name = "proj." + s.name;
      specs_.push_back(s);
    }
  }
  std::string name() const override {
    std::string n = cat("vision_tower layers", cfg_.layers, frozen_ ? " frozen" : "");
    for (const ops::ImageGrid& g : grids_) n += cat(" ", g.rows, "x", g.cols);
    return n;
  }
  std::vector<InputSpec> inputs() const override {
    std::vector<InputSpec> in{{.name = "pixels",
                               .shape = {in_.batch.tokens(), cfg_.patch_dim()},
                               .differentiable = false}};
    for (size_t i = 0; i < specs_.size(); ++i) {
      const ParamSpec& p = specs_[i];
      const bool vec = p.shape.ndim() == 1;
      const double fan = p.shape.ndim() == 4 ? static_cast<double>(cfg_.patch_dim())
                                             : static_cast<double>(p.shape[-1]);
      in.push_back({.name = p.name,
                    .shape = p.shape,
                    .differentiable = !(frozen_ && i < n_tower_),
                    .accumulate = true,
                    .scale = vec ? 0.3 : 1.0 / std::sqrt(fan)});
    }
    return in;
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    bind(in, {});
    ArenaPlan plan;
    tower_.plan_activations(in_, plan);
    proj_.plan_activations(in_.merged_tokens(), plan);
    plan.add({in_.batch.tokens(), cfg_.hidden});  // the tower's output
    acts_ = Arena(plan.bytes(), Device::CPU, "vision tower acts");
    merged_ = acts_.alloc({in_.batch.tokens(), cfg_.hidden});
    Tensor y = alloc({in_.merged_tokens(), cfg_.text_hidden});
    tower_.forward(ctx, in_, in[0], merged_, acts_, tower_saved_);
    proj_.forward(ctx, merged_, y, acts_, proj_saved_);
    EXPECT_EQ(acts_.used(), plan.bytes()) << "plan_activations differs from what forward took";
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    bind(in, grads);
    ArenaScope scope(ctx.workspace());
    Tensor dmerged = ctx.workspace().alloc(merged_.shape());
    proj_.backward(ctx, dout[0], dmerged, proj_saved_);
    tower_.backward(ctx, in_, dmerged, tower_saved_);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    ref::Params params;
    for (size_t i = 0; i < specs_.size(); ++i) params[specs_[i].name] = in[i + 1];
    ref::Grids g;
    for (const ops::ImageGrid& x : grids_) g.push_back({x.rows, x.cols});
    return {ref::vision_tower(cfg_, params, in[0], g)};
  }

 private:
  void bind(const std::vector<Tensor>& in, const std::vector<Tensor>& grads) {
    ParamTable t, p;
    for (size_t i = 0; i < specs_.size(); ++i) {
      const bool tower = i < n_tower_;
      const std::string local = specs_[i].name.substr(tower ? 6 : 5);
      const Tensor g = grads.empty() ? Tensor() : grads[i + 1];
      (tower ? t : p)[local] = {.value = in[i + 1], .grad = g};
    }
    tower_.bind(t);
    proj_.bind(p);
  }
  VisionConfig cfg_;
  std::vector<ops::ImageGrid> grids_;
  VisionInputs in_;
  VisionTower tower_;
  VisionProjector proj_;
  bool frozen_;
  std::vector<ParamSpec> specs_;
  size_t n_tower_ = 0;
  Arena acts_;
  Tensor merged_;
  VisionTower::Saved tower_saved_;
  VisionProjector::Saved proj_saved_;
};

TEST(VisionTower, PackedImagesTrainEverything) {
  VisionTowerCase c(tiny(0), {{2, 4}, {4, 6}, {2, 2}}, false);
  check_op(c);
}

TEST(VisionTower, FrozenTowerProjectorLora) {
  VisionTowerCase c(tiny(2), {{4, 2}, {6, 4}}, true);
  check_op(c);
}

TEST(VisionTower, OddGridIsRefusedNamingTheImage) {
  try {
    VisionInputs::make(tiny(0), {{2, 2}, {3, 2}});
    ADD_FAILURE() << "odd grid accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(e.message().find("image 1"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace mt::test
