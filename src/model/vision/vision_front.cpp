#include "model/vision/vision_front.h"

#include <algorithm>

namespace mt {

namespace {

ParamTable table_of(const ParamStore& store, const std::string& prefix, bool& trains) {
  ParamTable t;
  trains = false;
  for (const auto& p : store.all())
    if (p->name.compare(0, prefix.size(), prefix) == 0) {
      t[p->name.substr(prefix.size())] = ParamRef{p->value, p->grad};
      trains |= p->trainable();
    }
  return t;
}

}  // namespace

VisionFrontEnd::VisionFrontEnd(const VisionConfig& cfg, int64_t image_token_id)
    : cfg_(cfg), image_token_id_(image_token_id), tower_(cfg), projector_(cfg) {}

void VisionFrontEnd::bind(const ParamStore& params) {
  tower_.bind(table_of(params, kTowerPrefix, tower_trains_));
  projector_.bind(table_of(params, kProjectorPrefix, projector_trains_));
}

void VisionFrontEnd::forward(Context& ctx, const Tensor& ids, const ImageBatch* images,
                             Tensor& embeds) {
  const int64_t T = ids.numel(), H = cfg_.text_hidden;
  expect_shape(embeds, {T, H}, "embeddings before the image rows");
  rows_.clear();
  for (int64_t t = 0; t < T; ++t)
    if (ids.i32()[t] == image_token_id_) rows_.push_back(static_cast<int32_t>(t));
  active_ = images && !images->grids.empty();
  if (!active_) {
    MT_CHECK(rows_.empty(), ShapeError, rows_.size(), " image placeholder tokens (id ",
             image_token_id_, ") but no images in the batch");
    return;
  }
  MT_CHECK(ctx.device() == Device::CPU, ConfigError,
           "images: the vision tower runs on the CPU only so far");
  in_ = VisionInputs::make(cfg_, images->grids);
  const int64_t P = in_.batch.tokens(), M = in_.merged_tokens();
  MT_CHECK(static_cast<int64_t>(rows_.size()) == M, ShapeError, rows_.size(),
           " image placeholder tokens (id ", image_token_id_, ") for ", images->grids.size(),
           " image(s) of ", M, " merged patches");
  expect_shape(images->pixels, {P, cfg_.patch_dim()}, "image pixels");
  ArenaPlan plan(DType::F32);
  plan.add({P, cfg_.hidden});
  tower_.plan_activations(in_, plan);
  projector_.plan_activations(M, plan);
  plan.add({M, H});
  if (acts_.capacity() < plan.bytes()) acts_ = Arena(plan.bytes(), ctx.device(), "vision");
  acts_.reset();
  Tensor merged = acts_.alloc({P, cfg_.hidden});
  tower_.forward(ctx, in_, images->pixels, merged, acts_);
  Tensor y = acts_.alloc({M, H});
  projector_.forward(ctx, merged, y, acts_);
  for (int64_t k = 0; k < M; ++k)
    std::copy_n(y.f32() + k * H, H, embeds.f32() + static_cast<int64_t>(rows_[k]) * H);
}

void VisionFrontEnd::backward(Context& ctx, Tensor& dembeds) {
  const int64_t H = cfg_.text_hidden, M = static_cast<int64_t>(rows_.size());
  if (!active_) return;
  ArenaScope scope(ctx.workspace());
  Tensor dy = ctx.workspace().alloc({M, H});
  for (int64_t k = 0; k < M; ++k) {
    float* row = dembeds.f32() + static_cast<int64_t>(rows_[k]) * H;
    std::copy_n(row, H, dy.f32() + k * H);
    std::fill_n(row, H, 0.f);
  }
  active_ = false;
  if (!tower_trains_ && !projector_trains_) return;
  Tensor dmerged = ctx.workspace().alloc({in_.batch.tokens(), cfg_.hidden});
  projector_.backward(ctx, dy, dmerged);
  if (tower_trains_) tower_.backward(ctx, in_, dmerged);
}

}  // namespace mt
