#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>

#include "harness/op_check.h"
#include "harness/prefilled_grads.h"
#include "harness/seed.h"
#include "model/moe_layer.h"
#include "ref/moe_ref.h"

namespace mt::test {
namespace {

struct MoeSetup {
  MoeConfig cfg;
  std::vector<int64_t> docs;
  bool freeze_base = false;     // only Lora-role tensors train (as Model with freeze_base)
  bool starve_experts = false;  // bias experts e % 3 == 1 out of every selection
};

// Inputs: x, then every parameter of the layer in param_specs() order. Outputs: y, the expert ids
// and aux = seq_aux_coeff * seq_aux + z_coeff * z. The layer applies the aux gradients with its
// fixed coefficients while the harness weighs each output by a random upstream gradient, so the
// reference divides aux by that upstream value once backward has seen it: the finite-difference
// loss then holds aux with weight one, as the layer's does.
class MoeLayerCase : public OpCase {
 public:
  explicit MoeLayerCase(MoeSetup s)
      : s_(std::move(s)), seq_(SeqInfo::from_lengths(s_.docs)), layer_(s_.cfg) {
    specs_ = layer_.param_specs();
  }
  std::string name() const override {
    const MoeConfig& c = s_.cfg;
    return cat("moe d", c.hidden, " l", c.latent, " E", c.num_experts, " k", c.top_k, " F",
               c.expert_ffn, " shared", c.num_shared, " T", seq_.tokens,
               c.score == RouterScore::Sigmoid ? " sigmoid" : " softmax", " groups", c.n_group, "/",
               c.topk_group, " lora", c.lora.rank, "/", c.expert_lora.rank,
               s_.freeze_base ? " frozen" : "");
  }
  bool trains(const ParamSpec& p) const {
    if (p.role == ParamRole::Buffer) return false;
    return !s_.freeze_base || p.role == ParamRole::Lora;
  }
  std::vector<InputSpec> inputs() const override {
    std::vector<InputSpec> in{{.name = "x", .shape = {seq_.tokens, s_.cfg.hidden}}};
    const bool starve = s_.starve_experts;
    for (const ParamSpec& p : specs_) {
      InputSpec is{.name = p.name,
                   .shape = p.shape,
                   .differentiable = trains(p),
                   .accumulate = true,
                   .scale = 1.0 / std::sqrt(static_cast<double>(p.shape[-1]))};
      if (p.name == "gate.weight") is.scale *= 1.5;
      if (p.name == "gate.e_score_correction_bias")
        is.init = [starve](Rng& rng, Tensor& t) {
          for (int64_t e = 0; e < t.numel(); ++e)
            t.f32()[e] = static_cast<float>(starve && e % 3 == 1 ? -5.0 : 0.1 * rng.normal());
        };
      in.push_back(is);
    }
    return in;
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}, {"ids", false}, {"aux"}}; }

  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    layer_.bind(
        grads_.bind(specs_, in, 1, prefill_seed_, [&](const ParamSpec& p) { return trains(p); }));
    ArenaPlan plan;
    layer_.plan_activations(seq_, plan);
    acts_ = Arena(plan.bytes(), Device::CPU, "moe acts");
    Tensor y = alloc({seq_.tokens, s_.cfg.hidden});
    state_ = layer_.make_state();
    layer_.forward(ctx, seq_, in[0], y, acts_, *state_);
    EXPECT_EQ(acts_.used(), plan.bytes()) << "plan_activations differs from what forward took";
    Tensor ids = alloc({seq_.tokens, s_.cfg.top_k}, DType::I32);
    ids.copy_from(layer_.last_expert_ids());
    Tensor aux = alloc({1});
    double total = 0;
    for (const AuxLoss& a : layer_.aux_losses()) total += a.weight * a.value;
    aux.f32()[0] = static_cast<float>(total);
    return {y, ids, aux};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>&,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    aux_dout_ = dout[2].f32()[0];
    layer_.backward(ctx, seq_, dout[0], grads[0], *state_);
    grads_.add_increments(grads, 1);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    std::map<std::string, DVec> params;
    for (size_t i = 0; i < specs_.size(); ++i) params[specs_[i].name] = in[i + 1];
    ref::MoeRefOut o = ref::moe_layer(s_.cfg, params, in[0], seq_.offsets);
    const double aux = s_.cfg.seq_aux_coeff * o.seq_aux + s_.cfg.z_loss_coeff * o.z;
    return {o.y, DVec(o.ids.begin(), o.ids.end()), {aux / aux_dout_}};
  }

  MoeLayer& layer() { return layer_; }

 private:
  MoeSetup s_;
  SeqInfo seq_;
  MoeLayer layer_;
  std::vector<ParamSpec> specs_;
  PrefilledGrads grads_;
  Arena acts_;
  std::unique_ptr<LayerState> state_;
  // Drawn once per case: the device pass pre-fills the gradients as the CPU pass did.
  uint64_t prefill_seed_ = test_seed();
  double aux_dout_ = 1.0;
};

MoeConfig base_cfg() {
  return {.hidden = 37,
          .latent = 19,
          .num_experts = 8,
          .top_k = 2,
          .expert_ffn = 23,
          .num_shared = 0,
          .shared_ffn = 0};
}

TEST(MoeLayer, ZeroTokenExpertsSigmoid) {
  MoeConfig c = base_cfg();
  c.selection_bias = true;
  MoeLayerCase op({.cfg = c, .docs = {5}, .starve_experts = true});
  check_op(op);
}

TEST(MoeLayer, SoftmaxScoringSharedExpert) {
  MoeConfig c = base_cfg();
  c.score = RouterScore::Softmax;
  c.norm_topk_prob = false;
  c.num_shared = 1;
  c.shared_ffn = 13;
  MoeLayerCase op({.cfg = c, .docs = {11, 6}});
  check_op(op);
}

TEST(MoeLayer, GroupLimitedRoutingWithBias) {
  MoeConfig c = base_cfg();
  c.num_experts = 16;
  c.top_k = 3;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scaling = 2.5f;
  c.selection_bias = true;
  c.num_shared = 2;
  c.shared_ffn = 7;
  MoeLayerCase op({.cfg = c, .docs = {9, 14}});
  check_op(op);
}

TEST(MoeLayer, LatentEqualsHiddenNoShared) {
  MoeConfig c = base_cfg();
  c.latent = c.hidden;
  MoeLayerCase op({.cfg = c, .docs = {13}});
  check_op(op);
}

TEST(MoeLayer, LatentEqualsHiddenWithShared) {
  MoeConfig c = base_cfg();
  c.latent = c.hidden;
  c.num_shared = 1;
  c.shared_ffn = 11;
  c.score = RouterScore::Softmax;
  MoeLayerCase op({.cfg = c, .docs = {4, 8}});
  check_op(op);
}

TEST(MoeLayer, AuxAndZLossGradients) {
  MoeConfig c = base_cfg();
  c.seq_aux_coeff = 0.8f;
  c.z_loss_coeff = 0.2f;
  c.n_group = 4;
  c.topk_group = 2;
  c.num_shared = 1;
  c.shared_ffn = 9;
  MoeLayerCase op({.cfg = c, .docs = {7, 1, 12}});
  check_op(op);
}

TEST(MoeLayer, ExpertAndDenseLora) {
  MoeConfig c = base_cfg();
  c.lora = {.rank = 3, .alpha = 6.f};
  c.expert_lora = {.rank = 2, .alpha = 5.f};
  c.num_shared = 1;
  c.shared_ffn = 13;
  c.seq_aux_coeff = 0.3f;
  MoeLayerCase op({.cfg = c, .docs = {10, 7}});
  check_op(op);
}

TEST(MoeLayer, ExpertLoraFrozenBase) {
  MoeConfig c = base_cfg();
  c.lora = {.rank = 2, .alpha = 4.f};
  c.expert_lora = {.rank = 3, .alpha = 8.f};
  c.num_shared = 1;
  c.shared_ffn = 13;
  c.selection_bias = true;
  MoeLayerCase op({.cfg = c, .docs = {15}, .freeze_base = true});
  check_op(op);
}

TEST(MoeLayer, ParamNamesAndRoles) {
  MoeConfig c = base_cfg();
  c.selection_bias = true;
  c.num_shared = 2;
  c.shared_ffn = 5;
  c.expert_lora = {.rank = 4, .alpha = 8.f};
  MoeLayer layer(c);
  std::map<std::string, ParamSpec> by;
  for (const ParamSpec& p : layer.param_specs()) by[p.name] = p;
  EXPECT_EQ(by.at("gate.weight").shape, Shape({8, 37}));
  EXPECT_EQ(by.at("gate.e_score_correction_bias").role, ParamRole::Buffer);
  EXPECT_EQ(by.at("latent_down_proj.weight").shape, Shape({19, 37}));
  EXPECT_EQ(by.at("latent_up_proj.weight").shape, Shape({37, 19}));
  EXPECT_EQ(by.at("experts.gate_up_proj").shape, Shape({8, 46, 19}));
  EXPECT_EQ(by.at("experts.gate_up_proj").role, ParamRole::Expert);
  EXPECT_EQ(by.at("experts.down_proj").shape, Shape({8, 19, 23}));
  EXPECT_EQ(by.at("experts.down_proj").role, ParamRole::Expert);
  EXPECT_EQ(by.at("experts.gate_up_lora_A").shape, Shape({8, 4, 19}));
  EXPECT_EQ(by.at("experts.gate_up_lora_B").shape, Shape({8, 46, 4}));
  EXPECT_EQ(by.at("experts.down_lora_A").shape, Shape({8, 4, 23}));
  EXPECT_EQ(by.at("experts.down_lora_B").shape, Shape({8, 19, 4}));
  EXPECT_EQ(by.at("experts.down_lora_B").init, ParamInit::Zeros);
  EXPECT_EQ(by.at("shared_experts.gate_proj.weight").shape, Shape({10, 37}));
  EXPECT_EQ(by.at("shared_experts.down_proj.weight").shape, Shape({37, 10}));
  EXPECT_EQ(by.size(), 13u);
  // Expert parallelism splits exactly the [E, ...] tensors (the distributed step reads this flag,
  // not the names).
  for (const auto& [name, spec] : by)
    EXPECT_EQ(spec.per_expert, name.compare(0, 8, "experts.") == 0) << name;

  c.latent = c.hidden;
  c.num_shared = 0;
  c.selection_bias = false;
  c.expert_lora.rank = 0;
  MoeLayer plain(c);
  std::vector<std::string> names;
  for (const ParamSpec& p : plain.param_specs()) names.push_back(p.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"gate.weight", "experts.gate_up_proj", "experts.down_proj"}));
}

TEST(MoeLayer, ExpertLoadAndBiasUpdate) {
  MoeConfig c = base_cfg();
  c.selection_bias = true;
  c.bias_update_rate = 0.01f;
  MoeLayer layer(c);
  Rng rng(test_seed());
  std::map<std::string, Tensor> store;
  ParamTable table;
  for (const ParamSpec& p : layer.param_specs()) {
    Tensor t = Tensor::empty(p.shape);
    init_param(p, rng, t);
    if (p.name == "gate.weight") fill_normal(rng, t, 0.3);
    store[p.name] = t;
    table[p.name] = {.value = t};
  }
  layer.bind(table);
  Context ctx;
  SeqInfo seq = SeqInfo::from_lengths({6, 5});
  ArenaPlan plan;
  layer.plan_activations(seq, plan);
  Arena acts(plan.bytes(), Device::CPU, "acts");
  Tensor x = Tensor::empty({11, 37}), y = Tensor::empty({11, 37});
  fill_normal(rng, x);
  for (int step = 0; step < 2; ++step) {
    acts.reset();
    MoeLayer::Saved st;
    layer.forward(ctx, seq, x, y, acts, st);
  }
  std::vector<int64_t> load = layer.expert_load();
  int64_t total = 0;
  for (int64_t v : load) total += v;
  EXPECT_EQ(total, 2 * 11 * 2);  // two forwards of T*k slots
  layer.update_selection_bias(ctx);
  const float* b = store.at("gate.e_score_correction_bias").f32();
  const double mean = static_cast<double>(total) / 8.0;
  for (int e = 0; e < 8; ++e) {
    const double want = load[e] < mean ? 0.01 : load[e] > mean ? -0.01 : 0.0;
    EXPECT_NEAR(b[e], want, 1e-7) << e;
  }
  for (int64_t v : layer.expert_load()) EXPECT_EQ(v, 0);
}

TEST(MoeLayer, InvalidConfigIsAnError) {
  MoeConfig c = base_cfg();
  c.latent = 40;
  EXPECT_THROW(MoeLayer{c}, ConfigError);
  c = base_cfg();
  c.top_k = 9;
  EXPECT_THROW(MoeLayer{c}, ConfigError);
}

}  // namespace
}  // namespace mt::test
