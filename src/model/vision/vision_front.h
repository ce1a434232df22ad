// The image half of a kimi_k25 model as the language model sees it: the tower and projector
// turn a batch of images into one text-width row per merged patch, and those rows replace the
// embeddings of the placeholder tokens (image_token_id), in order, as transformers'
// masked_scatter does. Backward takes the placeholders' rows of the embedding gradient (the
// embedding table gets nothing from them) and runs the projector and, unless frozen, the tower.
#pragma once

#include <memory>
#include <vector>

#include "core/arena.h"
#include "core/context.h"
#include "model/param_store.h"
#include "model/vision/vision_tower.h"

namespace mt {

// The images of one step, packed in placeholder order: pixels [patches, channels * patch^2].
struct ImageBatch {
  Tensor pixels;
  std::vector<ops::ImageGrid> grids;
};

class VisionFrontEnd {
 public:
  VisionFrontEnd(const VisionConfig& cfg, int64_t image_token_id);

  static constexpr const char* kTowerPrefix = "model.vision_tower.";
  static constexpr const char* kProjectorPrefix = "model.mm_projector.";
  std::vector<ParamSpec> tower_specs() const { return tower_.param_specs(); }
  std::vector<ParamSpec> projector_specs() const { return projector_.param_specs(); }
  // Binds both parts from the store (full names under the two prefixes).
  void bind(const ParamStore& params);

  // What a forward with images keeps for its backward, the caller's (one per micro-batch in
  // flight, as a layer's state): its activation arena (sized by the first forward that needs
  // more, reused after), the images' inputs, the placeholder rows and the parts' saved tensors.
  struct Saved : LayerState {
    Arena acts;
    VisionInputs in;
    Tensor rows;  // i32 [merged tokens]: placeholder positions, in order, on the step's device
    VisionTower::Saved tower;
    VisionProjector::Saved projector;
    bool active = false;  // a forward with images awaits its backward
  };
  std::unique_ptr<LayerState> make_state() const { return std::make_unique<Saved>(); }

  // Placeholder count of `ids` (i32 [T]) must equal the images' merged tokens (a one-line
  // ShapeError otherwise); `embeds` [T, text_hidden]: the placeholders' rows are replaced.
  // No images and no placeholders: nothing to do. On a GPU the ids come to the host (4 T bytes,
  // to find the placeholders) and the pixels go to the device; everything else stays there.
  // The pixels are kept as a view (the caller keeps them alive until backward).
  void forward(Context& ctx, const Tensor& ids, const ImageBatch* images, Tensor& embeds,
               LayerState& st) const;
  // dembeds [T, text_hidden]: the placeholders' rows are read, then zeroed (the embedding
  // lookup there was replaced, so the table gets no gradient from them).
  void backward(Context& ctx, Tensor& dembeds, LayerState& st);

 private:
  VisionConfig cfg_;
  int64_t image_token_id_;
  VisionTower tower_;
  VisionProjector projector_;
  bool tower_trains_ = false, projector_trains_ = false;
};

}  // namespace mt
