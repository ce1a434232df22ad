#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>

#include "harness/op_check.h"
#include "model/dense_ffn.h"
#include "ref/dense_ffn_ref.h"

namespace mt::test {
namespace {

struct DenseFfnSetup {
  DenseFfnConfig cfg;
  std::vector<int64_t> docs;
  bool freeze_base = false;  // only Lora-role tensors train
};

// Inputs: x, then every parameter in param_specs() order (accumulating gradients). Forward binds
// the layer to the harness's parameter tensors; backward re-binds it with the harness's gradient
// buffers, so the layer adds straight into them.
class DenseFfnCase : public OpCase {
 public:
  explicit DenseFfnCase(DenseFfnSetup s)
      : s_(std::move(s)), seq_(SeqInfo::from_lengths(s_.docs)), layer_(s_.cfg) {
    specs_ = layer_.param_specs();
  }
  std::string name() const override {
    return cat("dense_ffn d", s_.cfg.hidden, " ffn", s_.cfg.ffn, " T", seq_.tokens, " lora",
               s_.cfg.lora.rank, s_.freeze_base ? " frozen" : "");
  }
  bool trains(const ParamSpec& p) const { return !s_.freeze_base || p.role == ParamRole::Lora; }
  std::vector<InputSpec> inputs() const override {
    std::vector<InputSpec> in{{.name = "x", .shape = {seq_.tokens, s_.cfg.hidden}}};
    // Fan-in scaled weights keep each branch O(1), so every gradient is visible (lora_B included:
    // it starts at zero in training, but a zero B would hide lora_A's gradient here).
    for (const ParamSpec& p : specs_)
      in.push_back({.name = p.name,
                    .shape = p.shape,
                    .differentiable = trains(p),
                    .accumulate = true,
                    .scale = 1.0 / std::sqrt(static_cast<double>(p.shape[-1]))});
    return in;
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }

  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    layer_.bind(table(in, {}));
    ArenaPlan plan;
    layer_.plan_activations(seq_, plan);
    acts_ = Arena(plan.bytes(), Device::CPU, "dense_ffn acts");
    Tensor y = alloc({seq_.tokens, s_.cfg.hidden});
    state_ = layer_.make_state();
    layer_.forward(ctx, seq_, in[0], y, acts_, *state_);
    EXPECT_EQ(acts_.used(), plan.bytes()) << "plan_activations differs from what forward took";
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    layer_.bind(table(in, grads));
    layer_.backward(ctx, seq_, dout[0], grads[0], *state_);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    std::map<std::string, DVec> params;
    for (size_t i = 0; i < specs_.size(); ++i) params[specs_[i].name] = in[i + 1];
    return {ref::dense_ffn(s_.cfg, params, in[0], seq_)};
  }

 private:
  // Parameter i is input i + 1; frozen ones (and all of them before backward) have no gradient.
  ParamTable table(const std::vector<Tensor>& in, const std::vector<Tensor>& grads) const {
    ParamTable t;
    for (size_t i = 0; i < specs_.size(); ++i)
      t[specs_[i].name] = {.value = in[i + 1], .grad = grads.empty() ? Tensor() : grads[i + 1]};
    return t;
  }
  DenseFfnSetup s_;
  SeqInfo seq_;
  DenseFfn layer_;
  std::vector<ParamSpec> specs_;
  Arena acts_;
  std::unique_ptr<LayerState> state_;
};

TEST(DenseFfn, Plain) {
  DenseFfnCase c({.cfg = {.hidden = 24, .ffn = 37}, .docs = {29, 13}});
  check_op(c);
}

TEST(DenseFfn, Lora) {
  DenseFfnCase c(
      {.cfg = {.hidden = 24, .ffn = 37, .lora = {.rank = 3, .alpha = 6.f}}, .docs = {29, 13}});
  check_op(c);
}

TEST(DenseFfn, LoraFrozenBase) {
  DenseFfnCase c({.cfg = {.hidden = 19, .ffn = 41, .lora = {.rank = 2, .alpha = 16.f}},
                  .docs = {1, 30},
                  .freeze_base = true});
  check_op(c);
}

TEST(DenseFfn, ParamSpecsFollowHfAndPeft) {
  DenseFfn layer({.hidden = 8, .ffn = 20, .lora = {.rank = 4, .alpha = 8.f}});
  std::map<std::string, ParamSpec> by_name;
  for (const ParamSpec& p : layer.param_specs()) by_name[p.name] = p;
  ASSERT_EQ(by_name.size(), 9u);
  EXPECT_EQ(by_name.at("gate_proj.weight").shape, Shape({20, 8}));
  EXPECT_EQ(by_name.at("up_proj.weight").shape, Shape({20, 8}));
  EXPECT_EQ(by_name.at("down_proj.weight").shape, Shape({8, 20}));
  EXPECT_EQ(by_name.at("gate_proj.lora_A.weight").shape, Shape({4, 8}));
  EXPECT_EQ(by_name.at("gate_proj.lora_B.weight").shape, Shape({20, 4}));
  EXPECT_EQ(by_name.at("down_proj.lora_A.weight").shape, Shape({4, 20}));
  EXPECT_EQ(by_name.at("down_proj.lora_B.weight").shape, Shape({8, 4}));
  EXPECT_EQ(by_name.at("up_proj.weight").role, ParamRole::Dense);
  EXPECT_EQ(by_name.at("up_proj.lora_A.weight").role, ParamRole::Lora);
  EXPECT_EQ(by_name.at("up_proj.lora_A.weight").init, ParamInit::Normal);
  // PEFT starts B at zero so a fresh adapter leaves the base model's output unchanged.
  EXPECT_EQ(by_name.at("up_proj.lora_B.weight").init, ParamInit::Zeros);
}

TEST(DenseFfn, MissingParameterIsAConfigError) {
  DenseFfn layer({.hidden = 8, .ffn = 20});
  ParamTable t;
  t["gate_proj.weight"] = {.value = Tensor::zeros({20, 8})};
  EXPECT_THROW(layer.bind(t), ConfigError);
}

}  // namespace
}  // namespace mt::test
