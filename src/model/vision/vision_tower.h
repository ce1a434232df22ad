// The kimi_k25 vision tower and multimodal projector (transformers' Kimi_K25VisionModel and
// Kimi_K25MultimodalProjection), images only:
//   e  = patch_embed(pixels) + resample(position table, each image's grid)
//   h  = blocks(e)                      VisionBlock x layers, one attention document per image
//   m  = patch_merge(final_layernorm(h))                       [patches / (kh kw), kh kw hidden]
//   out = out_proj(gelu(in_proj(pre_norm(m per patch))))       [patches / (kh kw), text_hidden]
// Local HF names: the tower's under "patch_embed.proj.*", "patch_embed.pos_emb.
// position_embeddings", "layers.N.*", "final_layernorm.*" (model.vision_tower. in a checkpoint);
// the projector's under "pre_norm.*", "in_proj.*", "out_proj.*" (model.mm_projector.).
#pragma once

#include <memory>
#include <vector>

#include "model/vision/vision_block.h"
#include "model/vision/vision_config.h"

namespace mt {

// A VisionBatch plus what the tower's first and last steps read: position taps and merge order.
struct VisionInputs {
  VisionBatch batch;
  Tensor pos_idx, pos_wts;  // ops::pos_embed_taps
  Tensor order;             // ops::merge_order
  int64_t merge = 1;        // patches per merged token (kh kw)
  int64_t merged_tokens() const { return batch.tokens() / merge; }

  // Built on the host, then the tensors the ops read are moved to `device` (one small copy each,
  // once a step; the host keeps the SeqInfo offsets).
  static VisionInputs make(const VisionConfig& cfg, const std::vector<ops::ImageGrid>& grids,
                           Device device = Device::CPU);
};

class VisionTower {
 public:
  explicit VisionTower(const VisionConfig& cfg);

  std::vector<ParamSpec> param_specs() const;
  void bind(const ParamTable& params);
  void plan_activations(const VisionInputs& in, ArenaPlan& plan) const;
  // What forward keeps for backward, the caller's (views of pixels and of acts).
  struct Saved {
    Tensor pixels;
    std::vector<Tensor> hs;  // input of each block, then the last block's output
    std::vector<VisionBlock::Saved> blocks;
    Tensor fn, fmean, frstd;
  };
  // pixels [patches, channels * patch^2] (processor order); merged [patches, hidden], i.e.
  // [merged_tokens, kh kw hidden] row-major: written.
  void forward(Context& ctx, const VisionInputs& in, const Tensor& pixels, Tensor& merged,
               Arena& acts, Saved& s) const;
  // Parameter gradients accumulate; pixels get none (they are data).
  void backward(Context& ctx, const VisionInputs& in, const Tensor& dmerged, const Saved& s);

 private:
  VisionConfig cfg_;
  std::vector<std::unique_ptr<VisionBlock>> blocks_;
  ParamRef pw_, pb_, table_, fw_, fb_;
};

class VisionProjector {
 public:
  explicit VisionProjector(const VisionConfig& cfg);

  std::vector<ParamSpec> param_specs() const;
  void bind(const ParamTable& params);
  void plan_activations(int64_t merged_tokens, ArenaPlan& plan) const;
  // What forward keeps for backward, the caller's (views of merged and of acts).
  struct Saved {
    Tensor x, n, mean, rstd, a, g;
    LinearModule::Saved in, out;
  };
  // merged [merged_tokens * kh kw, hidden] (the tower's output); y [merged_tokens, text_hidden].
  void forward(Context& ctx, const Tensor& merged, Tensor& y, Arena& acts, Saved& s) const;
  // dmerged written; parameter gradients accumulate.
  void backward(Context& ctx, const Tensor& dy, Tensor& dmerged, const Saved& s);

 private:
  VisionConfig cfg_;
  BiasedLinear in_, out_;
  ParamRef nw_, nb_;
};

}  // namespace mt
