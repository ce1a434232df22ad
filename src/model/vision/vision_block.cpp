#include "model/vision/vision_block.h"

#include <cmath>

#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/norm.h"
#include "ops/rope2d.h"

namespace mt {

VisionBlock::VisionBlock(const VisionBlockConfig& cfg)
    : cfg_(cfg),
      q_("attn.q_proj", cfg.hidden, cfg.hidden, cfg.lora),
      k_("attn.k_proj", cfg.hidden, cfg.hidden, cfg.lora),
      v_("attn.v_proj", cfg.hidden, cfg.hidden, cfg.lora),
      proj_("attn.proj", cfg.hidden, cfg.hidden, cfg.lora),
      fc1_("mlp.fc1", cfg.hidden, cfg.intermediate, cfg.lora),
      fc2_("mlp.fc2", cfg.intermediate, cfg.hidden, cfg.lora) {
  MT_CHECK(cfg.hidden > 0 && cfg.heads > 0 && cfg.intermediate > 0, ConfigError,
           "vision block needs hidden, heads and intermediate > 0, got ", cfg.hidden, ", ",
           cfg.heads, ", ", cfg.intermediate);
  MT_CHECK(cfg.hidden % cfg.heads == 0 && cfg.head_dim() % 4 == 0, ConfigError,
           "vision block: hidden ", cfg.hidden, " / heads ", cfg.heads,
           " must be a whole head dimension divisible by 4 (axial 2-D RoPE)");
}

std::vector<ParamSpec> VisionBlock::param_specs() const {
  std::vector<ParamSpec> specs;
  const int64_t D = cfg_.hidden;
  specs.push_back({.name = "norm1.weight", .shape = {D}, .init = ParamInit::Ones});
  specs.push_back({.name = "norm1.bias", .shape = {D}, .init = ParamInit::Zeros});
  q_.add_specs(specs);
  k_.add_specs(specs);
  v_.add_specs(specs);
  proj_.add_specs(specs);
  specs.push_back({.name = "norm2.weight", .shape = {D}, .init = ParamInit::Ones});
  specs.push_back({.name = "norm2.bias", .shape = {D}, .init = ParamInit::Zeros});
  fc1_.add_specs(specs);
  fc2_.add_specs(specs);
  return specs;
}

void VisionBlock::bind(const ParamTable& params) {
  const int64_t D = cfg_.hidden;
  n1w_ = need_param(params, "norm1.weight", {D});
  n1b_ = need_param(params, "norm1.bias", {D});
  n2w_ = need_param(params, "norm2.weight", {D});
  n2b_ = need_param(params, "norm2.bias", {D});
  q_.bind(params);
  k_.bind(params);
  v_.bind(params);
  proj_.bind(params);
  fc1_.bind(params);
  fc2_.bind(params);
}

void VisionBlock::plan_activations(const VisionBatch& batch, ArenaPlan& plan) const {
  const int64_t T = batch.tokens(), D = cfg_.hidden, I = cfg_.intermediate;
  plan.add({T, D});  // h1
  plan.add_fp32({T});
  plan.add_fp32({T});
  q_.plan(T, plan);
  k_.plan(T, plan);
  v_.plan(T, plan);
  for (int i = 0; i < 4; ++i) plan.add({T, D});  // q, k (rotated in place), v, o
  plan.add_fp32({T, cfg_.heads});                // lse
  proj_.plan(T, plan);
  plan.add({T, D});  // x1
  plan.add({T, D});  // h2
  plan.add_fp32({T});
  plan.add_fp32({T});
  fc1_.plan(T, plan);
  plan.add({T, I});  // fc1 output
  plan.add({T, I});  // gelu output
  fc2_.plan(T, plan);
}

void VisionBlock::forward(Context& ctx, const VisionBatch& batch, const Tensor& x, Tensor& y,
                          Arena& acts) {
  const int64_t T = batch.tokens(), D = cfg_.hidden, I = cfg_.intermediate, H = cfg_.heads,
                Dh = cfg_.head_dim();
  expect_shape(x, {T, D}, "vision block input");
  expect_shape(y, {T, D}, "vision block output");
  const ops::NormParams np{.rows = T, .dim = D, .eps = cfg_.norm_eps};
  x_ = x;
  h1_ = acts.alloc({T, D});
  mean1_ = acts.alloc({T});
  rstd1_ = acts.alloc({T});
  ops::layernorm_forward(ctx, np, x, n1w_.value, n1b_.value, h1_, mean1_, rstd1_);

  qr_ = acts.alloc({T, D});
  kr_ = acts.alloc({T, D});
  v_out_ = acts.alloc({T, D});
  q_.forward(ctx, h1_, qr_, acts);
  k_.forward(ctx, h1_, kr_, acts);
  v_.forward(ctx, h1_, v_out_, acts);
  const ops::Rope2dParams rp{.tokens = T, .heads = H, .head_dim = Dh, .theta = cfg_.rope_theta};
  Tensor q3 = qr_.view({T, H, Dh}), k3 = kr_.view({T, H, Dh});
  ops::rope2d_forward(ctx, rp, batch.positions, q3, q3);
  ops::rope2d_forward(ctx, rp, batch.positions, k3, k3);

  o_ = acts.alloc({T, D});
  lse_ = acts.alloc({T, H});
  Tensor o3 = o_.view({T, H, Dh});
  ops::attention_forward(ctx, attn_params(batch), q3, k3, v_out_.view({T, H, Dh}), batch.indices,
                         o3, lse_);

  x1_ = acts.alloc({T, D});
  proj_.forward(ctx, o_, x1_, acts);
  ops::add_into(ctx, x, x1_);

  h2_ = acts.alloc({T, D});
  mean2_ = acts.alloc({T});
  rstd2_ = acts.alloc({T});
  ops::layernorm_forward(ctx, np, x1_, n2w_.value, n2b_.value, h2_, mean2_, rstd2_);
  f_ = acts.alloc({T, I});
  g_ = acts.alloc({T, I});
  fc1_.forward(ctx, h2_, f_, acts);
  ops::gelu_forward(ctx, cfg_.act, f_, g_);
  fc2_.forward(ctx, g_, y, acts);
  ops::add_into(ctx, x1_, y);
}

void VisionBlock::backward(Context& ctx, const VisionBatch& batch, const Tensor& dy, Tensor& dx) {
  const int64_t T = batch.tokens(), D = cfg_.hidden, I = cfg_.intermediate, H = cfg_.heads,
                Dh = cfg_.head_dim();
  MT_CHECK(g_.defined() && g_.dim(0) == T, InternalError,
           "vision block backward without a matching forward");
  expect_shape(dy, {T, D}, "vision block dy");
  expect_shape(dx, {T, D}, "vision block dx");
  const ops::NormParams np{.rows = T, .dim = D, .eps = cfg_.norm_eps};
  ArenaScope scope(ctx.workspace());
  Arena& ws = ctx.workspace();

  // MLP branch: dx1 = dy + ln2'(fc1'(gelu'(fc2'(dy)))).
  Tensor dg = ws.alloc({T, I});
  fc2_.backward(ctx, dy, dg);
  ops::gelu_backward(ctx, cfg_.act, f_, dg, dg);
  Tensor dh2 = ws.alloc({T, D});
  fc1_.backward(ctx, dg, dh2);
  Tensor dx1 = ws.alloc({T, D});
  ops::layernorm_backward(ctx, np, x1_, n2w_.value, mean2_, rstd2_, dh2, dx1, n2w_.grad, n2b_.grad);
  ops::add_into(ctx, dy, dx1);

  // Attention branch: dx = dx1 + ln1'(q'/k'/v'(...)).
  Tensor d_o = ws.alloc({T, D});
  proj_.backward(ctx, dx1, d_o);
  Tensor dq = ws.alloc({T, D}), dk = ws.alloc({T, D}), dv = ws.alloc({T, D});
  Tensor dq3 = dq.view({T, H, Dh}), dk3 = dk.view({T, H, Dh}), dv3 = dv.view({T, H, Dh});
  ops::attention_backward(ctx, attn_params(batch), qr_.view({T, H, Dh}), kr_.view({T, H, Dh}),
                          v_out_.view({T, H, Dh}), batch.indices, o_.view({T, H, Dh}), lse_,
                          d_o.view({T, H, Dh}), dq3, dk3, dv3);
  const ops::Rope2dParams rp{.tokens = T, .heads = H, .head_dim = Dh, .theta = cfg_.rope_theta};
  ops::rope2d_backward(ctx, rp, batch.positions, dq3, dq3);
  ops::rope2d_backward(ctx, rp, batch.positions, dk3, dk3);
  Tensor dh1 = ws.alloc({T, D});
  q_.backward(ctx, dq, dh1);
  k_.backward(ctx, dk, dh1, /*accumulate_dx=*/true);
  v_.backward(ctx, dv, dh1, /*accumulate_dx=*/true);
  ops::layernorm_backward(ctx, np, x_, n1w_.value, mean1_, rstd1_, dh1, dx, n1w_.grad, n1b_.grad);
  ops::add_into(ctx, dx1, dx);
}

ops::AttentionParams VisionBlock::attn_params(const VisionBatch& batch) const {
  const int64_t Dh = cfg_.head_dim();
  return {.tokens = batch.tokens(),
          .heads = cfg_.heads,
          .qk_dim = Dh,
          .v_dim = Dh,
          .kmax = batch.kmax,
          .scale = 1.f / std::sqrt(static_cast<float>(Dh))};
}

}  // namespace mt
