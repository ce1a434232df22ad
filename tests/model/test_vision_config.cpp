// transformers' kimi_k25 config.json -> the vision IR (src/model/vision/vision_config.h): every
// field the tower and projector read, defaults as transformers 5.24 has them, and one-line
// ConfigErrors naming the key for what the engine cannot run (video / time-axis keys included).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/vision/vision_config.h"

namespace mt::test {
namespace {

using nlohmann::json;

json kimi_k25() {
  return json::parse(R"({
    "model_type": "kimi_k25",
    "architectures": ["Kimi_K25ForConditionalGeneration"],
    "image_token_id": 163605, "video_token_id": 163840,
    "vision_start_token_id": 163602, "vision_end_token_id": 163604,
    "projection_hidden_size": 64, "projection_layer_norm_eps": 1e-6,
    "tie_word_embeddings": false,
    "text_config": {"model_type": "deepseek_v3", "hidden_size": 96, "num_hidden_layers": 2},
    "vision_config": {
      "model_type": "kimi_k25_vision", "patch_size": 14, "pos_emb_height": 16,
      "pos_emb_width": 16, "pos_emb_time": 4, "num_attention_heads": 4,
      "num_hidden_layers": 3, "hidden_size": 64, "intermediate_size": 120,
      "hidden_act": "gelu_pytorch_tanh", "merge_kernel_size": [2, 2],
      "rope_parameters": {"rope_type": "axial", "rope_theta": 5000.0}
    }
  })");
}

std::string config_error(const json& j) {
  try {
    vision_config_from_kimi_k25(j, "config.json");
  } catch (const ConfigError& e) {
    return e.message();
  }
  return "";
}

TEST(VisionConfig, ReadsEveryTowerAndProjectorField) {
  const VisionConfig c = vision_config_from_kimi_k25(kimi_k25(), "config.json");
  EXPECT_EQ(c.patch_size, 14);
  EXPECT_EQ(c.pos_rows, 16);
  EXPECT_EQ(c.pos_cols, 16);
  EXPECT_EQ(c.heads, 4);
  EXPECT_EQ(c.layers, 3);
  EXPECT_EQ(c.hidden, 64);
  EXPECT_EQ(c.intermediate, 120);
  EXPECT_EQ(c.merge_rows, 2);
  EXPECT_EQ(c.merge_cols, 2);
  EXPECT_FLOAT_EQ(c.rope_theta, 5000.f);
  EXPECT_EQ(c.act, ops::GeluKind::Tanh);
  EXPECT_EQ(c.pos_interp, ops::PosInterp::Bicubic);
  EXPECT_EQ(c.text_hidden, 96);
  EXPECT_FLOAT_EQ(c.projector_eps, 1e-6f);
  EXPECT_EQ(c.merged_dim(), 256);
  EXPECT_EQ(c.patch_dim(), 3 * 14 * 14);
}

TEST(VisionConfig, DefaultsAreTransformers) {
  json j = kimi_k25();
  j["vision_config"] = {{"model_type", "kimi_k25_vision"}};
  j.erase("projection_hidden_size");
  j.erase("projection_layer_norm_eps");
  const VisionConfig c = vision_config_from_kimi_k25(j, "config.json");
  EXPECT_EQ(c.patch_size, 14);
  EXPECT_EQ(c.pos_rows, 64);
  EXPECT_EQ(c.heads, 16);
  EXPECT_EQ(c.layers, 27);
  EXPECT_EQ(c.hidden, 1152);
  EXPECT_EQ(c.intermediate, 4304);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.f);
  EXPECT_FLOAT_EQ(c.projector_eps, 1e-5f);
}

TEST(VisionConfig, VideoKeysAreRefusedByName) {
  for (const char* key : {"video_attn_type", "temporal_merge_kernel_size", "init_pos_emb_time"}) {
    json j = kimi_k25();
    j["vision_config"][key] = 2;
    const std::string msg = config_error(j);
    EXPECT_NE(msg.find(key), std::string::npos) << key << ": " << msg;
    EXPECT_NE(msg.find("video"), std::string::npos) << key << ": " << msg;
  }
}

TEST(VisionConfig, UnsupportedValuesNameTheKey) {
  auto with = [](const char* key, json v) {
    json j = kimi_k25();
    j["vision_config"][key] = std::move(v);
    return config_error(j);
  };
  EXPECT_NE(with("hidden_act", "gelu").find("hidden_act"), std::string::npos);
  EXPECT_NE(with("pos_emb_width", 8).find("pos_emb_width"), std::string::npos);
  EXPECT_NE(with("num_attention_heads", 5).find("num_attention_heads"), std::string::npos);
  EXPECT_NE(with("merge_kernel_size", json::array({2})).find("merge_kernel_size"),
            std::string::npos);
  EXPECT_NE(with("patch_size", "14").find("patch_size"), std::string::npos);
  EXPECT_NE(with("some_new_field", 1).find("some_new_field"), std::string::npos);
  json r = kimi_k25();
  r["vision_config"]["rope_parameters"]["rope_type"] = "default";
  EXPECT_NE(config_error(r).find("rope_type"), std::string::npos);
  json p = kimi_k25();
  p["projection_hidden_size"] = 32;
  EXPECT_NE(config_error(p).find("projection_hidden_size"), std::string::npos);
  json t = kimi_k25();
  t["model_type"] = "qwen2_vl";
  EXPECT_NE(config_error(t).find("model_type"), std::string::npos);
  json h = kimi_k25();
  h["text_config"].erase("hidden_size");
  EXPECT_NE(config_error(h).find("hidden_size"), std::string::npos);
}

}  // namespace
}  // namespace mt::test
