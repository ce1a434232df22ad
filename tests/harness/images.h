// Images for the model-level tests of the kimi_k25 front end: the tiny text model with a two-layer
// vision tower, and random pixels with their placeholder tokens written into a batch.
#pragma once

#include <memory>
#include <vector>

#include "core/rng.h"
#include "harness/model_configs.h"
#include "model/model_config.h"
#include "model/vision/vision_front.h"
#include "train/dataset.h"

namespace mt::test {

// `cfg` with a two-layer vision tower (tiny_vision) whose rows replace the placeholders (the last
// token id).
inline ModelConfig with_vision(ModelConfig cfg) {
  cfg.vision = std::make_shared<const VisionConfig>(tiny_vision(cfg.hidden));
  cfg.image_token_id = cfg.vocab - 1;
  return cfg;
}

// Images of the given grids for `batch`: N(0, 1) pixels (fp32, on the host), and one placeholder
// per merged patch from token `first` on (no other token is a placeholder).
inline ImageBatch images_for(Rng& rng, const ModelConfig& cfg, Batch& batch,
                             std::vector<ops::ImageGrid> grids, int64_t first) {
  const VisionConfig& v = *cfg.vision;
  ImageBatch im{.grids = std::move(grids)};
  int64_t patches = 0;
  for (const ops::ImageGrid& g : im.grids) patches += g.rows * g.cols;
  im.pixels = Tensor::empty({patches, v.patch_dim()});
  for (int64_t i = 0; i < im.pixels.numel(); ++i)
    im.pixels.f32()[i] = static_cast<float>(rng.normal());
  const auto id = static_cast<int32_t>(cfg.image_token_id);
  for (int64_t t = 0; t < batch.seq.tokens; ++t)
    if (batch.ids.i32()[t] == id) batch.ids.i32()[t] = 0;
  const int64_t merged = patches / (v.merge_rows * v.merge_cols);
  for (int64_t t = first; t < first + merged; ++t) batch.ids.i32()[t] = id;
  return im;
}

}  // namespace mt::test
