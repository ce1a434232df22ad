// config.json of HuggingFace model types -> the engine IR. Supported: "kimi_linear" (KDA + NoPE
// MLA + MoE), "deepseek_v3" (MLA + MoE: DeepSeek-V3/R1, Kimi-K2), "deepseek_v32" (MLA + lightning
// indexer/DSA + MoE) and moetrain's own "moetrain_hybrid". A quantization_config is accepted for
// block-scaled FP8 only (dequantised on load). Every key that changes the math is mapped; a key
// that is present but not supported (or a value the engine cannot reproduce) is a ConfigError
// naming it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "model/model_config.h"

namespace mt {

struct HfConfig {
  ModelConfig model;
  std::string model_type;     // as in config.json
  int64_t pad_token_id = -1;  // nn.Embedding padding_idx: that embedding row gets no gradient
  nlohmann::json raw;         // the config.json as read, written back unchanged on save
  // quantization_config of block-scaled FP8 checkpoints (0: not quantized).
  int64_t fp8_block_rows = 0, fp8_block_cols = 0;
};

HfConfig hf_config_from_json(const nlohmann::json& j, const std::string& source);
// `path`: a model directory (reads DIR/config.json) or a config.json file.
HfConfig load_hf_config(const std::string& path);

}  // namespace mt
