#include "model/vision/vision_tower.h"

#include <utility>

#include "ops/gelu.h"
#include "ops/norm.h"
#include "ops/patch_embed.h"
#include "ops/patch_merge.h"

namespace mt {

namespace {

std::string layer_prefix(size_t i) {
  return cat("layers.", i, ".");
}

ops::PosEmbedParams pos_params(const VisionConfig& c, int64_t patches) {
  return {.patches = patches,
          .table_rows = c.pos_rows,
          .table_cols = c.pos_cols,
          .dim = c.hidden,
          .mode = c.pos_interp};
}

ops::PatchEmbedParams embed_params(const VisionConfig& c, int64_t patches) {
  return {.patches = patches, .channels = c.channels, .patch = c.patch_size, .hidden = c.hidden};
}

}  // namespace

VisionInputs VisionInputs::make(const VisionConfig& cfg, const std::vector<ops::ImageGrid>& grids,
                                Device device) {
  VisionInputs in;
  in.batch = VisionBatch::from_grids(grids);
  const ops::PosEmbedParams pp = pos_params(cfg, in.batch.tokens());
  in.pos_idx = Tensor::empty({pp.patches, pp.taps()}, DType::I32);
  in.pos_wts = Tensor::empty({pp.patches, pp.taps()});
  ops::pos_embed_taps(pp, grids, in.pos_idx, in.pos_wts);
  in.order = ops::merge_order(grids, cfg.merge_rows, cfg.merge_cols);
  in.merge = cfg.merge_rows * cfg.merge_cols;
  if (device != Device::CPU) {
    for (Tensor* t : {&in.pos_idx, &in.pos_wts, &in.order, &in.batch.positions, &in.batch.indices,
                      &in.batch.seq.cu_seqlens, &in.batch.seq.positions})
      *t = t->to(device);
  }
  return in;
}

VisionTower::VisionTower(const VisionConfig& cfg) : cfg_(cfg) {
  MT_CHECK(cfg.layers >= 0 && cfg.channels > 0 && cfg.patch_size > 0, ConfigError,
           "vision tower: bad layers ", cfg.layers, " channels ", cfg.channels, " patch_size ",
           cfg.patch_size);
  for (int64_t i = 0; i < cfg.layers; ++i)
    blocks_.push_back(std::make_unique<VisionBlock>(cfg.block()));
}

std::vector<ParamSpec> VisionTower::param_specs() const {
  const int64_t D = cfg_.hidden, C = cfg_.channels, P = cfg_.patch_size;
  std::vector<ParamSpec> specs{
      {.name = "patch_embed.proj.weight", .shape = {D, C, P, P}},
      {.name = "patch_embed.proj.bias", .shape = {D}, .init = ParamInit::Zeros},
      {.name = "patch_embed.pos_emb.position_embeddings",
       .shape = {cfg_.pos_rows, cfg_.pos_cols, D}}};
  for (size_t i = 0; i < blocks_.size(); ++i)
    for (ParamSpec s : blocks_[i]->param_specs()) {
      s.name = layer_prefix(i) + s.name;
      specs.push_back(std::move(s));
    }
  specs.push_back({.name = "final_layernorm.weight", .shape = {D}, .init = ParamInit::Ones});
  specs.push_back({.name = "final_layernorm.bias", .shape = {D}, .init = ParamInit::Zeros});
  return specs;
}

void VisionTower::bind(const ParamTable& params) {
  const int64_t D = cfg_.hidden, C = cfg_.channels, P = cfg_.patch_size;
  pw_ = need_param(params, "patch_embed.proj.weight", {D, C, P, P});
  pb_ = need_param(params, "patch_embed.proj.bias", {D});
  table_ = need_param(params, "patch_embed.pos_emb.position_embeddings",
                      {cfg_.pos_rows, cfg_.pos_cols, D});
  fw_ = need_param(params, "final_layernorm.weight", {D});
  fb_ = need_param(params, "final_layernorm.bias", {D});
  for (size_t i = 0; i < blocks_.size(); ++i) {
    ParamTable sub;
    for (const ParamSpec& s : blocks_[i]->param_specs()) {
      const std::string full = layer_prefix(i) + s.name;
      auto it = params.find(full);
      MT_CHECK(it != params.end(), ConfigError, "missing parameter '", full, "'");
      sub[s.name] = it->second;
    }
    blocks_[i]->bind(sub);
  }
}

void VisionTower::plan_activations(const VisionInputs& in, ArenaPlan& plan) const {
  const int64_t T = in.batch.tokens(), D = cfg_.hidden;
  plan.add({T, D});  // embeddings
  for (const auto& b : blocks_) {
    plan.add({T, D});
    b->plan_activations(in.batch, plan);
  }
  plan.add({T, D});  // final norm
  plan.add_fp32({T});
  plan.add_fp32({T});
}

void VisionTower::forward(Context& ctx, const VisionInputs& in, const Tensor& pixels,
                          Tensor& merged, Arena& acts, Saved& s) const {
  const int64_t T = in.batch.tokens(), D = cfg_.hidden;
  expect_shape(pixels, {T, cfg_.patch_dim()}, "vision tower pixels");
  expect_shape(merged, {T, D}, "vision tower merged output");
  const DType at = merged.dtype();  // the policy's activations (statistics stay fp32)
  s.pixels = pixels;
  s.hs.clear();
  s.blocks.resize(blocks_.size());
  Tensor e = acts.alloc({T, D}, at);
  ops::patch_embed_forward(ctx, embed_params(cfg_, T), pixels, pw_.value, pb_.value, e);
  ops::pos_embed_forward(ctx, pos_params(cfg_, T), in.pos_idx, in.pos_wts, table_.value, e, e);
  s.hs.push_back(e);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Tensor h = acts.alloc({T, D}, at);
    blocks_[i]->forward(ctx, in.batch, s.hs.back(), h, acts, s.blocks[i]);
    s.hs.push_back(h);
  }
  s.fn = acts.alloc({T, D}, at);
  s.fmean = acts.alloc({T}, DType::F32);
  s.frstd = acts.alloc({T}, DType::F32);
  ops::layernorm_forward(ctx, {.rows = T, .dim = D, .eps = cfg_.norm_eps}, s.hs.back(), fw_.value,
                         fb_.value, s.fn, s.fmean, s.frstd);
  ops::patch_merge_forward(ctx, {.patches = T, .dim = D}, in.order, s.fn, merged);
}

void VisionTower::backward(Context& ctx, const VisionInputs& in, const Tensor& dmerged,
                           const Saved& s) {
  const int64_t T = in.batch.tokens(), D = cfg_.hidden;
  MT_CHECK(s.fn.defined() && s.fn.dim(0) == T && s.blocks.size() == blocks_.size(), InternalError,
           "vision tower backward without a matching forward");
  expect_shape(dmerged, {T, D}, "vision tower dmerged");
  ArenaScope scope(ctx.workspace());
  Arena& ws = ctx.workspace();
  const DType at = dmerged.dtype();
  Tensor dfn = ws.alloc({T, D}, at), dh = ws.alloc({T, D}, at), dnext = ws.alloc({T, D}, at);
  ops::patch_merge_backward(ctx, {.patches = T, .dim = D}, in.order, dmerged, dfn);
  ops::layernorm_backward(ctx, {.rows = T, .dim = D, .eps = cfg_.norm_eps}, s.hs.back(), fw_.value,
                          s.fmean, s.frstd, dfn, dh, fw_.grad, fb_.grad);
  for (size_t i = blocks_.size(); i-- > 0;) {
    blocks_[i]->backward(ctx, in.batch, dh, dnext, s.blocks[i]);
    std::swap(dh, dnext);
  }
  if (table_.trainable())
    ops::pos_embed_backward(ctx, pos_params(cfg_, T), in.pos_idx, in.pos_wts, dh, table_.grad);
  Tensor no_pixel_grad;
  ops::patch_embed_backward(ctx, embed_params(cfg_, T), s.pixels, pw_.value, dh, no_pixel_grad,
                            pw_.grad, pb_.grad);
}

VisionProjector::VisionProjector(const VisionConfig& cfg)
    : cfg_(cfg),
      in_("in_proj", cfg.merged_dim(), cfg.merged_dim(), cfg.projector_lora),
      out_("out_proj", cfg.merged_dim(), cfg.text_hidden, cfg.projector_lora) {
  MT_CHECK(cfg.text_hidden > 0, ConfigError, "vision projector needs text_hidden > 0, got ",
           cfg.text_hidden);
}

std::vector<ParamSpec> VisionProjector::param_specs() const {
  std::vector<ParamSpec> specs{
      {.name = "pre_norm.weight", .shape = {cfg_.hidden}, .init = ParamInit::Ones},
      {.name = "pre_norm.bias", .shape = {cfg_.hidden}, .init = ParamInit::Zeros}};
  in_.add_specs(specs);
  out_.add_specs(specs);
  return specs;
}

void VisionProjector::bind(const ParamTable& params) {
  nw_ = need_param(params, "pre_norm.weight", {cfg_.hidden});
  nb_ = need_param(params, "pre_norm.bias", {cfg_.hidden});
  in_.bind(params);
  out_.bind(params);
}

void VisionProjector::plan_activations(int64_t merged_tokens, ArenaPlan& plan) const {
  const int64_t M = merged_tokens, K = cfg_.merged_dim(), T = M * (K / cfg_.hidden);
  plan.add({T, cfg_.hidden});
  plan.add_fp32({T});
  plan.add_fp32({T});
  in_.plan(M, plan);
  plan.add({M, K});
  plan.add({M, K});
  out_.plan(M, plan);
}

void VisionProjector::forward(Context& ctx, const Tensor& merged, Tensor& y, Arena& acts,
                              Saved& s) const {
  const int64_t D = cfg_.hidden, K = cfg_.merged_dim();
  MT_CHECK(merged.ndim() == 2 && merged.dim(1) == D && merged.dim(0) % (K / D) == 0, ShapeError,
           "vision projector input ", merged.shape(), ", expected [merged_tokens * ", K / D, ", ",
           D, "]");
  const int64_t T = merged.dim(0), M = T / (K / D);
  expect_shape(y, {M, cfg_.text_hidden}, "vision projector output");
  const DType at = merged.dtype();  // the policy's activations (statistics stay fp32)
  s.x = merged;
  s.n = acts.alloc({T, D}, at);
  s.mean = acts.alloc({T}, DType::F32);
  s.rstd = acts.alloc({T}, DType::F32);
  ops::layernorm_forward(ctx, {.rows = T, .dim = D, .eps = cfg_.projector_eps}, merged, nw_.value,
                         nb_.value, s.n, s.mean, s.rstd);
  s.a = acts.alloc({M, K}, at);
  s.g = acts.alloc({M, K}, at);
  in_.forward(ctx, s.n.view({M, K}), s.a, acts, s.in);
  ops::gelu_forward(ctx, ops::GeluKind::Erf, s.a, s.g);
  out_.forward(ctx, s.g, y, acts, s.out);
}

void VisionProjector::backward(Context& ctx, const Tensor& dy, Tensor& dmerged, const Saved& s) {
  MT_CHECK(s.g.defined(), InternalError, "vision projector backward without forward");
  const int64_t D = cfg_.hidden, K = cfg_.merged_dim(), M = s.g.dim(0), T = s.x.dim(0);
  expect_shape(dy, {M, cfg_.text_hidden}, "vision projector dy");
  expect_shape(dmerged, {T, D}, "vision projector dmerged");
  ArenaScope scope(ctx.workspace());
  const DType at = dy.dtype();
  Tensor dg = ctx.workspace().alloc({M, K}, at), dn = ctx.workspace().alloc({M, K}, at);
  out_.backward(ctx, s.out, dy, dg);
  ops::gelu_backward(ctx, ops::GeluKind::Erf, s.a, dg, dg);
  in_.backward(ctx, s.in, dg, dn);
  ops::layernorm_backward(ctx, {.rows = T, .dim = D, .eps = cfg_.projector_eps}, s.x, nw_.value,
                          s.mean, s.rstd, dn.view({T, D}), dmerged, nw_.grad, nb_.grad);
}

}  // namespace mt
