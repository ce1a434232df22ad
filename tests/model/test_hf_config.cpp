#include "model/hf_config.h"

#include <gtest/gtest.h>

namespace mt {
namespace {

using nlohmann::json;

// As transformers 5.x writes a tiny kimi_linear config (attribute_map spellings included).
json kimi_json() {
  return json::parse(R"({
    "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"],
    "vocab_size": 97, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
    "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 2,
    "kv_lora_rank": 12, "q_lora_rank": null, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
    "v_head_dim": 8, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
    "num_experts": 6, "num_experts_per_token": 3, "num_shared_experts": 1,
    "num_expert_group": 2, "topk_group": 1, "moe_renormalize": true,
    "routed_scaling_factor": 2.5, "hidden_act": "silu", "pad_token_id": null,
    "linear_attn_config": {"kda_layers": [1, 2, 4], "full_attn_layers": [3],
                           "head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 3},
    "first_k_dense_replace": 1, "mla_use_nope": true, "use_cache": true
  })");
}

json v32_json() {
  return json::parse(R"({
    "model_type": "deepseek_v32", "vocab_size": 101, "hidden_size": 32,
    "intermediate_size": 40, "moe_intermediate_size": 12, "num_hidden_layers": 3,
    "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 16, "kv_lora_rank": 12,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 4, "topk_group": 2,
    "norm_topk_prob": false, "routed_scaling_factor": 1.5, "first_k_dense_replace": 1,
    "index_n_heads": 2, "index_head_dim": 16, "index_topk": 5, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 5000.0, "rope_type": "default"},
    "num_nextn_predict_layers": 1, "tie_word_embeddings": true
  })");
}

TEST(HfConfig, KimiLinearMapsEveryField) {
  HfConfig h = hf_config_from_json(kimi_json(), "kimi");
  const ModelConfig& c = h.model;
  ASSERT_EQ(c.layers.size(), 4u);
  // 1-based lists: layer 3 (index 2) is full attention.
  EXPECT_EQ(c.layers[0].mixer, MixerKind::Kda);
  EXPECT_EQ(c.layers[1].mixer, MixerKind::Kda);
  EXPECT_EQ(c.layers[2].mixer, MixerKind::Mla);
  EXPECT_EQ(c.layers[3].mixer, MixerKind::Kda);
  EXPECT_EQ(c.layers[0].ffn, FfnKind::Dense);
  EXPECT_EQ(c.layers[1].ffn, FfnKind::Moe);
  EXPECT_EQ(c.kda.heads, 2);
  EXPECT_EQ(c.kda.head_dim, 8);
  EXPECT_EQ(c.kda.conv_kernel, 3);
  EXPECT_FLOAT_EQ(c.kda.norm_eps, 1e-5f);
  EXPECT_FALSE(c.mla.use_rope);
  EXPECT_EQ(c.mla.q_lora_rank, 0);
  EXPECT_EQ(c.moe.num_experts, 6);
  EXPECT_EQ(c.moe.top_k, 3);
  EXPECT_EQ(c.moe.latent, 32);
  EXPECT_EQ(c.moe.num_shared, 1);
  EXPECT_EQ(c.moe.shared_ffn, 16);
  EXPECT_EQ(c.moe.n_group, 2);
  EXPECT_FLOAT_EQ(c.moe.routed_scaling, 2.5f);
  EXPECT_TRUE(c.moe.selection_bias);
  EXPECT_EQ(c.moe.score, RouterScore::Sigmoid);
  EXPECT_EQ(c.moe.seq_aux_coeff, 0.f);
  EXPECT_EQ(h.pad_token_id, -1);
}

TEST(HfConfig, KimiLayerTypesWinOverLists) {
  json j = kimi_json();
  j["layer_types"] = {"full_attention", "linear_attention", "linear_attention", "linear_attention"};
  j["mlp_layer_types"] = {"sparse", "dense", "sparse", "sparse"};
  HfConfig h = hf_config_from_json(j, "kimi");
  EXPECT_EQ(h.model.layers[0].mixer, MixerKind::Mla);
  EXPECT_EQ(h.model.layers[2].mixer, MixerKind::Kda);
  EXPECT_EQ(h.model.layers[0].ffn, FfnKind::Moe);
  EXPECT_EQ(h.model.layers[1].ffn, FfnKind::Dense);
}

TEST(HfConfig, DeepseekV32MapsEveryField) {
  HfConfig h = hf_config_from_json(v32_json(), "v32");
  const ModelConfig& c = h.model;
  ASSERT_EQ(c.layers.size(), 3u);
  for (const LayerIR& l : c.layers) EXPECT_EQ(l.mixer, MixerKind::Dsa);
  EXPECT_EQ(c.layers[0].ffn, FfnKind::Dense);
  EXPECT_EQ(c.layers[2].ffn, FfnKind::Moe);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_FLOAT_EQ(c.mla.rope_theta, 5000.f);
  EXPECT_EQ(c.mla.rope_style, ops::RopeStyle::Interleaved);
  EXPECT_EQ(c.dsa.index_topk, 5);
  EXPECT_EQ(c.dsa.index_rope_dim, 4);
  EXPECT_EQ(c.dsa.indexer_loss_coeff, 0.f);
  EXPECT_FALSE(c.dsa.mla.output_gate);
  EXPECT_FALSE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.moe.n_group, 4);
  EXPECT_EQ(c.moe.topk_group, 2);
}

void expect_config_error(const json& j, const std::string& needle) {
  try {
    hf_config_from_json(j, "cfg.json");
    ADD_FAILURE() << "accepted; wanted an error naming " << needle;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
  }
}

TEST(HfConfig, UnsupportedFieldsAreNamed) {
  json j = v32_json();
  j["rope_parameters"]["rope_type"] = "yarn";
  expect_config_error(j, "yarn");
  j = v32_json();
  j["quantization_config"] = {{"quant_method", "fp8"}};
  expect_config_error(j, "quantization_config");
  j = v32_json();
  j["scoring_func"] = "softmax";
  expect_config_error(j, "scoring_func");
  j = v32_json();
  j["some_new_knob"] = 3;
  expect_config_error(j, "some_new_knob");
  j = v32_json();
  j["attention_bias"] = true;
  expect_config_error(j, "attention_bias");
  j = kimi_json();
  j["mla_use_nope"] = false;
  expect_config_error(j, "mla_use_nope");
  j = kimi_json();
  j["linear_attn_config"]["kda_layers"] = {0, 1, 2};
  expect_config_error(j, "1-based");
  j = kimi_json();
  j["linear_attn_config"]["gate_lower_bound"] = -5;
  expect_config_error(j, "gate_lower_bound");
  j = kimi_json();
  j["num_key_value_heads"] = 1;
  expect_config_error(j, "num_key_value_heads");
  j = kimi_json();
  j["model_type"] = "llama";
  expect_config_error(j, "llama");
  j = kimi_json();
  j["num_experts"] = "six";
  expect_config_error(j, "wrong type");
}

}  // namespace
}  // namespace mt
