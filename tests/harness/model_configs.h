// Model configurations several tests share.
#pragma once

#include "model/model_config.h"

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

}  // namespace mt::test
