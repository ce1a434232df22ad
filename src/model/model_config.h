// The model IR: vocabulary, widths and the kind of every layer, resolved from an HF-style
// config.json (model_type "moetrain_hybrid") or a preset. Layer kinds are listed per layer, so
// any pattern loads.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.h"

namespace mt {

struct VisionConfig;

enum class MixerKind { Kda, Dsa, Mla };
enum class FfnKind { Dense, Moe };

const char* mixer_name(MixerKind k);

struct LayerIR {
  MixerKind mixer = MixerKind::Kda;
  FfnKind ffn = FfnKind::Moe;
};

struct ModelConfig {
  std::string model_type = "moetrain_hybrid";
  int64_t vocab = 0;
  int64_t hidden = 0;
  int64_t max_positions = 4096;
  std::vector<LayerIR> layers;
  float norm_eps = 1e-5f;
  bool tie_embeddings = false;
  float init_std = 0.02f;
  KdaConfig kda;
  MlaConfig mla;  // the attention half of DSA layers and the whole of MLA layers
  DsaConfig dsa;  // dsa.mla mirrors `mla` with the output gate
  MoeConfig moe;
  DenseFfnConfig dense;
  // kimi_k25: a vision tower + projector whose outputs replace the embeddings of the
  // image_token_id placeholders (model/vision/vision_front.h). Null: text only.
  std::shared_ptr<const VisionConfig> vision;
  int64_t image_token_id = -1;

  // Parses an HF-style config. Unknown keys, wrong types and inconsistent values are
  // ConfigErrors naming `source` and the key.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source);
  // A preset name ("tiny", "small", "seed-2.8t") or a path to a config.json / model directory.
  static ModelConfig load(const std::string& name_or_path);
  nlohmann::json to_json() const;
};

// Names of the embedded presets (configs/*.json compiled into the binary).
std::vector<std::string> preset_names();

}  // namespace mt
