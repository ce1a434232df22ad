#include "model/vision/vision_front.h"

#include <algorithm>

#include "ops/elementwise.h"
#include "ops/row_scatter.h"

namespace mt {

namespace {

ParamTable table_of(const ParamStore& store, const std::string& prefix, bool& trains) {
  ParamTable t;
  trains = false;
  for (const auto& p : store.all())
    if (p->name.compare(0, prefix.size(), prefix) == 0) {
      t[p->name.substr(prefix.size())] = p->ref();
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
                             Tensor& embeds, LayerState& st) const {
  Saved& s = state_as<Saved>(st, "vision front end");
  const int64_t T = ids.numel(), H = cfg_.text_hidden;
  expect_shape(embeds, {T, H}, "embeddings before the image rows");
  const Tensor host_ids = ids.device() == Device::CPU ? ids : ids.to(Device::CPU);
  std::vector<int32_t> rows;
  for (int64_t t = 0; t < T; ++t)
    if (host_ids.i32()[t] == image_token_id_) rows.push_back(static_cast<int32_t>(t));
  s.active = images && !images->grids.empty();
  if (!s.active) {
    MT_CHECK(rows.empty(), ShapeError, rows.size(), " image placeholder tokens (id ",
             image_token_id_, ") but no images in the batch");
    return;
  }
  s.in = VisionInputs::make(cfg_, images->grids, ctx.device());
  const int64_t P = s.in.batch.tokens(), M = s.in.merged_tokens();
  MT_CHECK(static_cast<int64_t>(rows.size()) == M, ShapeError, rows.size(),
           " image placeholder tokens (id ", image_token_id_, ") for ", images->grids.size(),
           " image(s) of ", M, " merged patches");
  expect_shape(images->pixels, {P, cfg_.patch_dim()}, "image pixels");
  s.rows = Tensor::empty({M}, DType::I32);
  std::copy(rows.begin(), rows.end(), s.rows.i32());
  s.rows = s.rows.to(ctx.device());
  // The tower runs in the text stream's activation dtype (the precision policy's): pixels arrive
  // fp32 from the image processor and are converted once into the arena.
  const DType at = embeds.dtype();
  ArenaPlan plan(at, ctx.device());
  plan.add({P, cfg_.hidden});
  tower_.plan_activations(s.in, plan);
  projector_.plan_activations(M, plan);
  plan.add({M, H});
  const bool copy_pixels = images->pixels.device() != ctx.device() || images->pixels.dtype() != at;
  if (copy_pixels) plan.add({P, cfg_.patch_dim()});
  // A model moved to another device drops its micro-batches' states, so the arena is always on
  // the step's device.
  if (s.acts.capacity() < plan.bytes()) s.acts = Arena(plan.bytes(), ctx.device(), "vision");
  s.acts.reset();
  Tensor pixels = images->pixels;
  if (copy_pixels) {
    pixels = s.acts.alloc({P, cfg_.patch_dim()}, at);
    if (images->pixels.device() == ctx.device())
      ops::copy(ctx, images->pixels, pixels);
    else
      pixels.copy_from(images->pixels);  // through the host where it converts
  }
  Tensor merged = s.acts.alloc({P, cfg_.hidden}, at);
  tower_.forward(ctx, s.in, pixels, merged, s.acts, s.tower);
  Tensor y = s.acts.alloc({M, H}, at);
  projector_.forward(ctx, merged, y, s.acts, s.projector);
  ops::row_scatter_forward(ctx, {.rows = M, .dst_rows = T, .dim = H}, s.rows, y, embeds);
}

void VisionFrontEnd::backward(Context& ctx, Tensor& dembeds, LayerState& st) {
  Saved& s = state_as<Saved>(st, "vision front end");
  if (!s.active) return;
  const int64_t H = cfg_.text_hidden, M = s.rows.numel();
  ArenaScope scope(ctx.workspace());
  const DType at = dembeds.dtype();
  Tensor dy = ctx.workspace().alloc({M, H}, at);
  ops::row_scatter_backward(ctx, {.rows = M, .dst_rows = dembeds.dim(0), .dim = H}, s.rows, dembeds,
                            dy);
  s.active = false;
  if (!tower_trains_ && !projector_trains_) return;
  Tensor dmerged = ctx.workspace().alloc({s.in.batch.tokens(), cfg_.hidden}, at);
  projector_.backward(ctx, dy, dmerged, s.projector);
  if (tower_trains_) tower_.backward(ctx, s.in, dmerged, s.tower);
}

}  // namespace mt
