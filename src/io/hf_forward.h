// The conformance computation behind `moetrain forward`: token ids [B, T] -> logits [B, T, V],
// mean next-token cross-entropy, and optionally every parameter's gradient under its HF name,
// with transformers' conventions (labels = input_ids shifted inside each row; the
// pad_token_id embedding row gets no gradient, as nn.Embedding's padding_idx).
#pragma once

#include "core/context.h"
#include "io/hf_names.h"

namespace mt {

struct HfForwardResult {
  Tensor logits;  // f32 [B, T, V]
  double loss = 0;
  TensorMap grads;  // HF name -> f32 gradient (empty unless requested)
};

struct ImageBatch;

// input_ids: i32 or i64 [B, T] with every id in [0, vocab). A model with a vision tower
// (kimi_k25) takes `images` for its placeholder tokens, which are never targets (labels -100
// there, as for transformers' text-only loss).
HfForwardResult hf_forward(Context& ctx, LoadedModel& lm, const Tensor& input_ids, bool grads,
                           const ImageBatch* images = nullptr);

// The images of a conformance input file: pixel_values [patches, 3 * patch^2] (or
// [patches, 3, patch, patch]) and image_grid_thw [images, 3] (int); an empty batch when the
// file has neither.
ImageBatch read_image_inputs(const TensorMap& inputs);

}  // namespace mt
