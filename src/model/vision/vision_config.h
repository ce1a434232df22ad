// The vision tower + projector of a kimi_k25 model as the engine runs it (the IR), and the
// parser of transformers' kimi_k25 config.json into it. Images only: the tower's time axis
// (video clips, the temporal position table) has no engine path yet.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "model/linear_module.h"
#include "model/vision/vision_block.h"
#include "ops/gelu.h"
#include "ops/pos_embed.h"

namespace mt {

struct VisionConfig {
  // Tower (Kimi_K25VisionConfig).
  int64_t channels = 3, patch_size = 14;
  int64_t hidden = 1152, heads = 16, layers = 27, intermediate = 4304;
  int64_t pos_rows = 64, pos_cols = 64;  // learned position table, resampled per image
  ops::PosInterp pos_interp = ops::PosInterp::Bicubic;
  int64_t merge_rows = 2, merge_cols = 2;  // merge_kernel_size
  float rope_theta = 10000.f;
  float norm_eps = 1e-5f;  // the tower's LayerNorms (fixed in transformers)
  ops::GeluKind act = ops::GeluKind::Tanh;
  LoraSpec lora{};  // on the tower's projections; rank 0 = none
  // Projector (Kimi_K25MultimodalProjection): LayerNorm(hidden) on each patch, then
  // in_proj (merged -> merged), GELU (erf), out_proj (merged -> text_hidden).
  int64_t text_hidden = 0;
  float projector_eps = 1e-5f;
  LoraSpec projector_lora{};

  int64_t merged_dim() const { return hidden * merge_rows * merge_cols; }
  int64_t patch_dim() const { return channels * patch_size * patch_size; }
  VisionBlockConfig block() const {
    return {.hidden = hidden,
            .heads = heads,
            .intermediate = intermediate,
            .norm_eps = norm_eps,
            .rope_theta = rope_theta,
            .act = act,
            .lora = lora};
  }
};

// From a kimi_k25 config.json (the whole object: vision_config, projection_* and
// text_config.hidden_size). Strict: an unknown key, a wrong type or an unsupported value is a
// ConfigError naming it; video / time-axis keys are refused by name.
VisionConfig vision_config_from_kimi_k25(const nlohmann::json& config, const std::string& source);

}  // namespace mt
