#include <gtest/gtest.h>

#include <fstream>

#include "model/model_config.h"

namespace mt {
namespace {

using nlohmann::json;

json tiny_json() {
  return ModelConfig::load("tiny").to_json();
}

TEST(ModelConfig, PresetsLoad) {
  for (const std::string& name : preset_names()) {
    ModelConfig c = ModelConfig::load(name);
    EXPECT_GT(c.layers.size(), 0u) << name;
  }
  ModelConfig seed = ModelConfig::load("seed-2.8t");
  int kda = 0, dsa = 0;
  for (const LayerIR& l : seed.layers) (l.mixer == MixerKind::Kda ? kda : dsa)++;
  EXPECT_EQ(kda, 69);
  EXPECT_EQ(dsa, 24);
  EXPECT_EQ(seed.moe.num_experts, 896);
  EXPECT_EQ(seed.layers[0].ffn, FfnKind::Dense);
  EXPECT_EQ(seed.layers[1].ffn, FfnKind::Moe);
}

TEST(ModelConfig, RoundTripsThroughJson) {
  ModelConfig a = ModelConfig::load("small");
  ModelConfig b = ModelConfig::from_json(a.to_json(), "roundtrip");
  EXPECT_EQ(a.to_json(), b.to_json());
}

TEST(ModelConfig, UnknownKeyIsNamed) {
  json j = tiny_json();
  j["rope_sclaing"] = 2;
  try {
    ModelConfig::from_json(j, "cfg.json");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("rope_sclaing"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, WrongTypeIsNamed) {
  json j = tiny_json();
  j["hidden_size"] = "wide";
  try {
    ModelConfig::from_json(j, "cfg.json");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("hidden_size"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, InconsistentValuesAreErrors) {
  json j = tiny_json();
  j["num_experts_per_tok"] = 99;
  EXPECT_THROW(ModelConfig::from_json(j, "x"), ConfigError);
  j = tiny_json();
  j["layer_types"] = json::array({"kda", "gqa", "kda", "dsa"});
  EXPECT_THROW(ModelConfig::from_json(j, "x"), ConfigError);
  j = tiny_json();
  j["n_group"] = 4;  // does not divide 6 experts
  EXPECT_THROW(ModelConfig::from_json(j, "x"), ConfigError);
  j = tiny_json();
  j["model_type"] = "llama";
  EXPECT_THROW(ModelConfig::from_json(j, "x"), ConfigError);
}

TEST(ModelConfig, MissingFileAndBadJson) {
  EXPECT_THROW(ModelConfig::load("/nonexistent/config.json"), IoError);
  std::string path = ::testing::TempDir() + "/bad_config.json";
  std::ofstream(path) << "{ \"model_type\": ";
  EXPECT_THROW(ModelConfig::load(path), ConfigError);
}

}  // namespace
}  // namespace mt
