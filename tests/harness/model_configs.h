// Model configurations several tests share.
#pragma once

#include "model/model_config.h"
#include "model/vision/vision_config.h"

namespace mt::test {

// The tiny preset (KDA and DSA mixers, a dense FFN then MoE) plus an MLA layer: every layer
// kind. With lora, a rank-2 adapter on every projection, the experts' included.
inline ModelConfig every_layer_kind(bool lora) {
  ModelConfig cfg = ModelConfig::load("tiny");
  cfg.layers.push_back(cfg.layers.back());
  cfg.layers.back().mixer = MixerKind::Mla;
  if (lora) {
    const LoraSpec l{.rank = 2, .alpha = 4.f};
    cfg.kda.lora = cfg.mla.lora = cfg.dsa.mla.lora = cfg.moe.lora = cfg.dense.lora = l;
    cfg.moe.expert_lora = l;
  }
  return cfg;
}

// A two-layer vision tower small enough for finite differences: 2x2 patches of 3 channels,
// hidden 8 over 2 heads, a 3x3 position table (resampled to every image), projected to
// text_hidden.
inline VisionConfig tiny_vision(int64_t text_hidden) {
  VisionConfig c;
  c.channels = 3;
  c.patch_size = 2;
  c.hidden = 8;
  c.heads = 2;
  c.layers = 2;
  c.intermediate = 12;
  c.pos_rows = c.pos_cols = 3;
  c.text_hidden = text_hidden;
  return c;
}

}  // namespace mt::test
