#include "io/hf_config.h"

#include <gtest/gtest.h>

#include <cmath>

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

// DeepSeek-V3.2-Exp's published config.json, key for key, with the dimensions shrunk (the
// fp8 quantization_config is left out here and tested separately below).
json v32_exp_shrunk_json() {
  return json::parse(R"({
    "architectures": ["DeepseekV32ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 64,
    "index_head_dim": 32, "index_n_heads": 8, "index_topk": 16, "initializer_range": 0.02,
    "intermediate_size": 96, "kv_lora_rank": 16, "max_position_embeddings": 163840,
    "model_type": "deepseek_v32", "moe_intermediate_size": 16, "moe_layer_freq": 1,
    "n_group": 8, "n_routed_experts": 32, "n_shared_experts": 1, "norm_topk_prob": true,
    "num_attention_heads": 4, "num_experts_per_tok": 8, "num_hidden_layers": 5,
    "num_key_value_heads": 4, "num_nextn_predict_layers": 1, "q_lora_rank": 24,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "transformers_version": "4.44.2", "use_cache": true,
    "v_head_dim": 16, "vocab_size": 300
  })");
}

// Kimi-Linear-48B-A3B-Instruct's config.json (research notes kda.md section 5), shrunk: 27 layers
// keep the published 1-based layer lists.
json kimi_48b_shrunk_json() {
  return json::parse(R"({
    "architectures": ["KimiLinearForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_kimi.KimiLinearConfig",
                 "AutoModel": "modeling_kimi.KimiLinearModel",
                 "AutoModelForCausalLM": "modeling_kimi.KimiLinearForCausalLM"},
    "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 32,
    "initializer_range": 0.02, "intermediate_size": 72, "kv_lora_rank": 16,
    "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 8,
                           "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19,
                                          21, 22, 23, 25, 26],
                           "num_heads": 4, "short_conv_kernel_size": 4},
    "mla_use_nope": true, "model_max_length": 1048576, "model_type": "kimi_linear",
    "moe_intermediate_size": 8, "moe_layer_freq": 1, "moe_renormalize": true,
    "moe_router_activation_func": "sigmoid", "num_attention_heads": 4, "num_expert_group": 1,
    "num_experts": 16, "num_experts_per_token": 8, "num_hidden_layers": 27,
    "num_key_value_heads": 4, "num_nextn_predict_layers": 0, "num_shared_experts": 1,
    "q_lora_rank": null, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "rms_norm_eps": 1e-05,
    "rope_scaling": null, "rope_theta": 10000.0, "routed_scaling_factor": 2.446,
    "tie_word_embeddings": false, "topk_group": 1, "torch_dtype": "bfloat16",
    "transformers_version": "4.56.0", "use_cache": true, "use_grouped_topk": true,
    "v_head_dim": 8, "vocab_size": 163840
  })");
}

TEST(HfConfig, DeepseekV32ExpStyleConfigParsesWithYarn) {
  HfConfig h = hf_config_from_json(v32_exp_shrunk_json(), "v32exp");
  const ModelConfig& c = h.model;
  ASSERT_EQ(c.layers.size(), 5u);
  EXPECT_EQ(c.layers[2].ffn, FfnKind::Dense);
  EXPECT_EQ(c.layers[3].ffn, FfnKind::Moe);
  EXPECT_EQ(c.moe.n_group, 8);
  EXPECT_EQ(c.moe.topk_group, 4);
  const ops::RopeScaling& y = c.mla.rope_scaling;
  EXPECT_FLOAT_EQ(y.factor, 40.f);
  EXPECT_FLOAT_EQ(y.beta_fast, 32.f);
  EXPECT_FLOAT_EQ(y.beta_slow, 1.f);
  EXPECT_EQ(y.original_max_positions, 4096);
  EXPECT_TRUE(y.truncate);
  EXPECT_FLOAT_EQ(y.magnitude, 1.f);  // mscale == mscale_all_dim: the ratio is 1
  const double m = 0.1 * std::log(40.0) + 1;
  EXPECT_NEAR(c.mla.softmax_scale, m * m / std::sqrt(24.0), 1e-6);
  // The indexer rotates with the same cos/sin (and keeps its own head_dim^-0.5 scale).
  EXPECT_FLOAT_EQ(c.dsa.mla.rope_scaling.factor, 40.f);
  EXPECT_FLOAT_EQ(c.dsa.mla.softmax_scale, c.mla.softmax_scale);

  json j = v32_exp_shrunk_json();
  j["quantization_config"] = json::parse(
      R"({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
          "scale_fmt": "ue8m0", "weight_block_size": [128, 128]})");
  // Block-scaled FP8 is dequantised on load: the published quantization_config parses.
  HfConfig q = hf_config_from_json(j, "v32exp");
  EXPECT_EQ(q.fp8_block_rows, 128);
  EXPECT_EQ(q.fp8_block_cols, 128);
  j["quantization_config"]["weight_block_size"] = {64, 32};
  q = hf_config_from_json(j, "v32exp");
  EXPECT_EQ(q.fp8_block_rows, 64);
  EXPECT_EQ(q.fp8_block_cols, 32);
  // Anything else is refused by name.
  j["quantization_config"]["fmt"] = "e5m2";
  expect_config_error(j, "'fmt'");
  j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  expect_config_error(j, "quantization_config");
  expect_config_error(j, "gptq");
  j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128}}};
  expect_config_error(j, "weight_block_size");
}

TEST(HfConfig, YarnVariants) {
  json j = v32_json();
  // rope_parameters (v5 spelling), mscale only: magnitude 0.1 ln(s) + 1, softmax scale unchanged.
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 5000.0},
                          {"factor", 4.0},       {"original_max_position_embeddings", 64},
                          {"beta_fast", 16},     {"truncate", false}};
  ModelConfig c = hf_config_from_json(j, "v32").model;
  EXPECT_FLOAT_EQ(c.mla.rope_theta, 5000.f);
  EXPECT_NEAR(c.mla.rope_scaling.magnitude, 0.1 * std::log(4.0) + 1, 1e-6);
  EXPECT_FLOAT_EQ(c.mla.rope_scaling.beta_fast, 16.f);
  EXPECT_FLOAT_EQ(c.mla.rope_scaling.beta_slow, 1.f);
  EXPECT_FALSE(c.mla.rope_scaling.truncate);
  EXPECT_EQ(c.mla.softmax_scale, 0.f);
  // mscale != mscale_all_dim: magnitude is their ratio; factor derived from the context lengths.
  j["rope_parameters"] = {{"rope_type", "yarn"},
                          {"original_max_position_embeddings", 100},
                          {"mscale", 0.707},
                          {"mscale_all_dim", 1.0}};
  j["max_position_embeddings"] = 800;
  c = hf_config_from_json(j, "v32").model;
  EXPECT_FLOAT_EQ(c.mla.rope_scaling.factor, 8.f);
  const double a = 0.1 * 0.707 * std::log(8.0) + 1, b = 0.1 * std::log(8.0) + 1;
  EXPECT_NEAR(c.mla.rope_scaling.magnitude, a / b, 1e-6);
  EXPECT_NEAR(c.mla.softmax_scale, b * b / std::sqrt(12.0), 1e-6);
  // An explicit attention_factor wins.
  j["rope_parameters"]["attention_factor"] = 0.5;
  EXPECT_FLOAT_EQ(hf_config_from_json(j, "v32").model.mla.rope_scaling.magnitude, 0.5f);
  // rope_scaling wins over rope_parameters, as transformers' conversion does.
  j["rope_scaling"] = {{"type", "default"}};
  EXPECT_FLOAT_EQ(hf_config_from_json(j, "v32").model.mla.rope_scaling.factor, 1.f);
  j.erase("rope_scaling");
  j["rope_parameters"]["factor"] = 0.5;
  expect_config_error(j, "factor");
  j["rope_parameters"]["factor"] = 2.0;
  j["rope_parameters"]["rope_type"] = "longrope";
  expect_config_error(j, "longrope");
  j["rope_parameters"]["rope_type"] = "yarn";
  j["rope_parameters"]["low_freq_factor"] = 1;
  expect_config_error(j, "low_freq_factor");
}

TEST(HfConfig, KimiLinear48bStyleConfigParses) {
  HfConfig h = hf_config_from_json(kimi_48b_shrunk_json(), "kimi48b");
  const ModelConfig& c = h.model;
  ASSERT_EQ(c.layers.size(), 27u);
  int mla = 0;
  for (const LayerIR& l : c.layers) mla += l.mixer == MixerKind::Mla;
  EXPECT_EQ(mla, 7);
  EXPECT_EQ(c.layers[3].mixer, MixerKind::Mla);   // 1-based 4
  EXPECT_EQ(c.layers[26].mixer, MixerKind::Mla);  // 1-based 27: the last layer
  EXPECT_EQ(c.layers[0].ffn, FfnKind::Dense);
  EXPECT_EQ(c.layers[1].ffn, FfnKind::Moe);
  EXPECT_EQ(c.moe.num_experts, 16);
  EXPECT_EQ(c.moe.top_k, 8);
  EXPECT_FLOAT_EQ(c.moe.routed_scaling, 2.446f);
  EXPECT_EQ(h.pad_token_id, 163839);
  EXPECT_FALSE(c.mla.use_rope);
  json j = kimi_48b_shrunk_json();
  j["quantization_config"] = {{"quant_method", "compressed-tensors"}};
  expect_config_error(j, "quantization_config");
}

TEST(HfConfig, UnsupportedFieldsAreNamed) {
  json j = v32_json();
  j["rope_parameters"]["rope_type"] = "dynamic";
  expect_config_error(j, "dynamic");
  j = v32_json();
  // Block-scaled fp8 is dequantised on load (DeepseekV32ExpStyleConfigParsesWithYarn); other
  // methods are refused by name.
  j["quantization_config"] = {{"quant_method", "bitsandbytes"}};
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

// Numbers for integer keys must be integers in range: a float beyond int64 was undefined
// behaviour in the JSON library's cast (libFuzzer, fuzz/crashes/hf_config), a fraction or an
// integer beyond the key's type was truncated or wrapped silently. An integral float still reads.
TEST(HfConfig, IntegerKeysRejectFractionsAndOutOfRangeNumbers) {
  for (const json& bad : {json(5e69), json(2.5), json(9223372036854775808.0), json(-1e300),
                          json(18446744073709551615ull), json(std::nan(""))}) {
    json j = v32_json();
    j["n_group"] = bad;
    SCOPED_TRACE(bad.dump());
    expect_config_error(j, "'n_group' = ");
  }
  json j = v32_json();
  j["n_group"] = 4.0;
  EXPECT_EQ(hf_config_from_json(j, "cfg.json").model.moe.n_group, 4);
  // moetrain's own config.json (ModelConfig::from_json, the presets' reader) likewise.
  json own = ModelConfig::load("tiny").to_json();
  own["hidden_size"] = 4.4e36;
  expect_config_error(own, "'hidden_size' = ");
  own["hidden_size"] = 24.5;
  expect_config_error(own, "'hidden_size' = ");
  own["hidden_size"] = 24.0;
  EXPECT_EQ(hf_config_from_json(own, "cfg.json").model.hidden, 24);
}

}  // namespace
}  // namespace mt
