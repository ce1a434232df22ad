#include "io/hf_adapter.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "harness/train_files.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A tiny kimi_linear with one KDA and one MLA layer, a dense then a MoE FFN.
ModelConfig kimi_with(const LoraTargets& t) {
  json j = json::parse(R"({
    "model_type": "kimi_linear", "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24,
    "moe_intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
    "kv_lora_rank": 8, "q_lora_rank": null, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2,
    "v_head_dim": 4, "num_experts": 4, "num_experts_per_token": 2, "num_shared_experts": 1,
    "layer_types": ["linear_attention", "full_attention"], "mlp_layer_types": ["dense", "sparse"],
    "linear_num_heads": 2, "linear_head_dim": 4, "linear_conv_kernel_dim": 3
  })");
  ModelConfig c = hf_config_from_json(j, "kimi").model;
  const LoraSpec s{.rank = t.rank, .alpha = t.alpha};
  if (t.attention) c.mla.lora = c.dsa.mla.lora = s;
  if (t.kda) c.kda.lora = s;
  if (t.shared_experts) c.moe.lora = s;
  if (t.routed_experts) c.moe.expert_lora = s;
  return c;
}

TEST(HfAdapter, PeftLayoutUsesTransformersModuleNames) {
  const LoraTargets t = parse_lora_targets("kda,attention,shared_experts", 3, 6.f);
  Model m(kimi_with(t), 1);
  randomize_lora(m, 5);
  const fs::path dir = test::temp_dir("adapter");
  const size_t n = write_peft_adapter(m, "kimi_linear", {.r = 3, .alpha = 6.f}, dir.string());
  SafetensorsData a = read_safetensors((dir / "adapter_model.safetensors").string());
  EXPECT_EQ(a.tensors.size(), n);
  // The forget-gate projections live under forget_gate in transformers' kimi_linear.
  const std::string fa = "base_model.model.model.layers.0.self_attn.forget_gate.f_a_proj";
  ASSERT_TRUE(a.tensors.count(fa + ".lora_A.weight"));
  EXPECT_EQ(a.tensors.at(fa + ".lora_A.weight").shape(), (Shape{3, 16}));
  EXPECT_EQ(a.tensors.at(fa + ".lora_B.weight").shape(), (Shape{4, 3}));
  EXPECT_FALSE(a.tensors.count("base_model.model.model.layers.0.self_attn.f_a_proj.lora_A.weight"));
  EXPECT_TRUE(a.tensors.count(
      "base_model.model.model.layers.1.mlp.shared_experts.gate_proj.lora_B.weight"));
  EXPECT_TRUE(a.tensors.count("base_model.model.model.layers.1.self_attn.kv_b_proj.lora_A.weight"));
  for (const auto& [name, tns] : a.tensors) {
    EXPECT_EQ(name.rfind("base_model.model.", 0), 0u) << name;
    EXPECT_EQ(name.find(".mlp.experts."), std::string::npos) << name;
  }
  std::ifstream f(dir / "adapter_config.json");
  const json c = json::parse(f);
  EXPECT_EQ(c.at("r"), 3);
  EXPECT_EQ(c.at("lora_alpha"), 6.0);
  // Full paths: the dense MLP of layer 0 shares leaf names with the shared experts.
  const auto targets = c.at("target_modules").get<std::vector<std::string>>();
  EXPECT_EQ(targets.size() * 2, n);
  for (const std::string& tm : targets) EXPECT_EQ(tm.rfind("model.layers.", 0), 0u) << tm;
  EXPECT_TRUE(c.at("rank_pattern").empty());
  fs::remove_all(dir);
}

// Routed experts go to PEFT's target_parameters in its ParamWrapper layout: lora_A [E*r, in],
// lora_B [out, r*E] with expert e's column k at k*E + e; gate_up_proj's wrapper sits inside
// down_proj's (".base_layer."). The delta PEFT rebuilds from the file must be the engine's
// B[e] A[e] for every expert.
TEST(HfAdapter, RoutedExpertsAsPeftTargetParameters) {
  const LoraTargets t = parse_lora_targets("routed_experts", 3, 6.f);
  Model m(kimi_with(t), 1);
  randomize_lora(m, 5);
  const fs::path dir = test::temp_dir("adapter_experts");
  write_peft_adapter(m, "kimi_linear", {.r = 3, .alpha = 6.f}, dir.string());
  SafetensorsData a = read_safetensors((dir / "adapter_model.safetensors").string());
  const std::string pre = "base_model.model.model.layers.1.mlp.experts.";
  for (const auto& [engine, peft] :
       {std::pair<std::string, std::string>{"gate_up", "base_layer."}, {"down", ""}}) {
    const Tensor& A = m.params().at("model.layers.1.mlp.experts." + engine + "_lora_A").value;
    const Tensor& B = m.params().at("model.layers.1.mlp.experts." + engine + "_lora_B").value;
    const int64_t E = A.dim(0), r = A.dim(1), in = A.dim(2), out = B.dim(1);
    ASSERT_TRUE(a.tensors.count(pre + peft + "lora_A.weight")) << engine;
    const Tensor& pa = a.tensors.at(pre + peft + "lora_A.weight");
    const Tensor& pb = a.tensors.at(pre + peft + "lora_B.weight");
    ASSERT_EQ(pa.shape(), (Shape{E * r, in}));
    ASSERT_EQ(pb.shape(), (Shape{out, r * E}));
    double worst = 0;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
          double want = 0, got = 0;
          for (int64_t k = 0; k < r; ++k) {
            want +=
                static_cast<double>(B.f32()[(e * out + o) * r + k]) * A.f32()[(e * r + k) * in + i];
            got += static_cast<double>(pb.f32()[o * r * E + k * E + e]) *
                   pa.f32()[(e * r + k) * in + i];
          }
          worst = std::max(worst, std::abs(want - got));
        }
    EXPECT_EQ(worst, 0.0) << engine;
  }
  std::ifstream f(dir / "adapter_config.json");
  const json c = json::parse(f);
  EXPECT_TRUE(c.at("target_modules").empty());
  EXPECT_EQ(c.at("target_parameters").get<std::vector<std::string>>(),
            (std::vector<std::string>{"model.layers.1.mlp.experts.down_proj",
                                      "model.layers.1.mlp.experts.gate_up_proj"}));
  fs::remove_all(dir);
}

TEST(HfAdapter, TargetsAreChecked) {
  EXPECT_TRUE(parse_lora_targets("routed_experts", 4, 8.f).routed_experts);
  EXPECT_THROW(parse_lora_targets("attention,mlp", 4, 8.f), ValueError);
  EXPECT_THROW(parse_lora_targets("attention", 0, 8.f), ValueError);
  const LoraTargets t = parse_lora_targets("attention,dense_ffn", 2, 4.f);
  EXPECT_TRUE(t.attention && t.dense_ffn && !t.kda && !t.shared_experts);
}

}  // namespace
}  // namespace mt
